"""Fixtures for the CLI tests: ``invoke`` (batchlu through click's runner) and one shared local cluster."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from batchlu.workflows.cli import cli


def _invoke(*args):
    """Run ``batchlu ARGS`` in-process; an unexpected exception propagates (it would be a traceback)."""
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


@pytest.fixture(scope="session")
def invoke():
    return _invoke


@pytest.fixture(scope="session")
def scheduler_address():
    """One small local cluster shared by the tests that pass ``--scheduler`` (starting one costs seconds)."""
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster:
        yield cluster.scheduler_address
