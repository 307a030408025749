"""batchlu.pipeline.tuning, the pipeline's surface for benchmarks: an engine put in place of a
backend's, the I/O pool's size, runs without the input checksums, and the resume checks one by one."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest
import zarr
from _pipeline_helpers import complete_flags

from batchlu import pipeline
from batchlu.pipeline import errors, tuning
from batchlu.pipeline.output import _fingerprint


def test_a_registered_engine_computes_the_run(client, stores, tmp_path):
    class CopyEngine(tuning.HostEngine):
        """inv = the input itself, info 0: the Zarr I/O and the bookkeeping alone."""

        def run(self, op, slot):
            np.copyto(slot.outs["inv"], slot.a)
            slot.outs["info"][...] = 0

    engine = CopyEngine()
    previous = tuning.register_engine("cpu", lambda: engine)  # in-process cluster: this process's
    try:
        report = pipeline.run(stores["a"], tmp_path / "o.zarr", op="inv", backend="cpu", client=client,
                              progress=False, config={"io-processes": 0})
    finally:
        tuning.register_engine("cpu", previous)
    assert report.status == "complete" and report.ok == report.count
    a = zarr.open_array(stores["a"], mode="r")[...]
    inv = zarr.open_array(str(tmp_path / "o.zarr"), path="inv", mode="r")[...]
    np.testing.assert_array_equal(inv, a)  # a copy: bit for bit, NaN included
    report = pipeline.run(stores["a"], tmp_path / "p.zarr", op="inv", backend="cpu", client=client,
                          progress=False, config={"io-processes": 0})
    assert report.ok < report.count  # the real engine again: singular and non-finite inputs flagged


@pytest.mark.parametrize("backend,threads,expected", [("gpu", 16, (8, 2)), ("gpu", 1, (1, 1)),
                                                      ("cpu", 8, (0, 8))])
def test_io_settings_auto(backend, threads, expected):
    assert tuning.io_settings(None, None, backend, threads) == expected
    assert tuning.io_settings(3, None, backend, threads)[0] == 3
    assert tuning.io_settings(2, 5, backend, threads) == (2, 5)


def _aged(monkeypatch):
    monkeypatch.setattr(_fingerprint, "FRESH_SECONDS", 0.0)  # the input was written just now


def test_resume_checks_one_by_one(client, stores, tmp_path, monkeypatch):
    _aged(monkeypatch)
    out = tmp_path / "o.zarr"
    pipeline.run(stores["a"], out, op="lu", client=client, progress=False, config={"chunk": 10})
    checks = tuning.ResumeChecks(str(out))
    checks.stored()
    n_chunks = complete_flags(out).size
    assert n_chunks == 6
    assert checks.input() == n_chunks       # every completed chunk's input read again and compared
    os.remove(out / "piv" / "c" / "3" / "0")
    with pytest.raises(errors.ResumeError, match="piv"):
        tuning.ResumeChecks(str(out)).stored()


def test_resume_checks_read_a_rewritten_input(client, stores, tmp_path, monkeypatch):
    _aged(monkeypatch)
    source = shutil.copytree(stores["a"], tmp_path / "a.zarr")
    out = tmp_path / "o.zarr"
    pipeline.run(source, out, op="inv", client=client, progress=False, config={"chunk": 10})
    a = zarr.open_array(source, mode="r+")
    a[...] = a[...]  # the same values, written again: new files
    checks = tuning.ResumeChecks(str(out))
    assert checks.input() == 6
    a[5] = a[6]      # other values: refused
    with pytest.raises(errors.ResumeError, match="Got other values in matrices 0:10"):
        checks.input()


def test_resume_checks_need_an_output(tmp_path):
    with pytest.raises(errors.ResumeError, match="batchlu output"):
        tuning.ResumeChecks(str(tmp_path / "none.zarr"))


def test_without_input_checksums(client, stores, tmp_path):
    out = tmp_path / "o.zarr"
    with tuning.without_input_checksums():
        report = pipeline.run(stores["a"], out, op="inv", client=client, progress=False,
                              config={"chunk": 10, "io-processes": 0})
    assert report.status == "complete" and complete_flags(out).all()
    digests = zarr.open_array(str(out), path="_input_xxh3", mode="r")[...]
    assert not digests.any()   # none stored ...
    with pytest.raises(errors.ResumeError, match="Got other values"):
        tuning.ResumeChecks(str(out)).input()   # ... so the input check refuses
    out2 = tmp_path / "o2.zarr"   # and afterwards the checksums are taken again
    pipeline.run(stores["a"], out2, op="inv", client=client, progress=False,
                 config={"chunk": 10, "io-processes": 0})
    assert zarr.open_array(str(out2), path="_input_xxh3", mode="r")[...].all()
    assert tuning.ResumeChecks(str(out2)).input() == 6
