"""Shared fixtures: one small in-process LocalCluster for the whole session, and input stores."""

from __future__ import annotations

import pytest

from batchlu import pipeline


@pytest.fixture(scope="session")
def client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, protocol="tcp",
                      host="127.0.0.1", dashboard_address="127.0.0.1:0") as cluster, \
            Client(cluster) as c:
        yield c


@pytest.fixture(scope="session")
def stores(tmp_path_factory):
    """Inputs shared by many tests (read only): matrices with singular / non-finite ones mixed in."""
    root = tmp_path_factory.mktemp("inputs")
    return {
        "a": pipeline.generate(root / "a.zarr", count=53, size=6, chunk=10, kind="singular-mix",
                               seed=1),
        "b": pipeline.generate_rhs(root / "b.zarr", count=53, size=6, chunk=7, seed=2),
        "bk": pipeline.generate_rhs(root / "bk.zarr", count=53, size=6, k=3, chunk=9, seed=3),
        "root": root,
    }
