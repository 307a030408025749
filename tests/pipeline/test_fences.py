"""Fences (issue 38, item 6): the lock guards clients, not tasks. A client killed on an external
cluster leaves its running tasks behind; each task checks that the output's lock still names its run
before it writes a batch's outputs and again before it records them complete, and stops with a
one-line :class:`FencedError` once another run took the output."""

from __future__ import annotations

import json
import os
import pickle

import pytest

from batchlu.pipeline import _lock, errors

FOREIGN = {"host": "node-elsewhere-7", "pid": 4242, "started": "2020-01-02T03:04:05+00:00",
           "token": "f" * 32, "boot_id": None, "pid_start": None}


def _take_over(lock_file) -> None:
    """Another run takes the output: its record replaces the lock file, atomically, as a new lock
    would (another host's, so that no run here takes it over as stale)."""
    tmp = f"{lock_file}.tmp"
    with open(tmp, "w") as f:
        json.dump(FOREIGN, f)
    os.replace(tmp, lock_file)


def _fenced_message(lock_file, token, got) -> str:
    return (rf"^Expected the lock {lock_file} to name this run \(token {token}\)\. Got {got} instead: "
            rf"another run took the output; this task stops without writing\.$")


# --------------------------------------------------------------------------------------- the fence
def test_fence_passes_while_the_lock_names_the_run_and_stops_once_it_does_not(tmp_path):
    out = str(tmp_path / "o.zarr")
    lock = _lock.OutputLock(out).acquire()
    fence = lock.fence()
    assert (fence.path, fence.token) == (out + ".lock", lock.owner.token)
    assert pickle.loads(pickle.dumps(fence)) == fence   # it travels to the workers in the Job
    fence.check()
    _take_over(lock.path)
    with pytest.raises(errors.FencedError, match=_fenced_message(
            lock.path, lock.owner.token, "the token f{32} of PID 4242 on host node-elsewhere-7, started "
                                         r"2020-01-02T03:04:05\+00:00 \(\d+ h \d+ min ago\)")):
        fence.check()
    os.remove(lock.path)   # released, or deleted by hand
    with pytest.raises(errors.FencedError, match=_fenced_message(lock.path, lock.owner.token, "no lock file")):
        fence.check()
    with open(lock.path, "w") as f:
        f.write('{"token": "' + lock.owner.token + '"')   # a record cut short: not this run's
    with pytest.raises(errors.FencedError, match=_fenced_message(lock.path, lock.owner.token,
                                                                 "unreadable content")):
        fence.check()
    assert issubclass(errors.FencedError, errors.OutputLockedError)
    assert isinstance(pickle.loads(pickle.dumps(errors.FencedError("x"))), errors.FencedError)


def test_a_lock_not_held_has_no_fence(tmp_path):
    lock = _lock.OutputLock(str(tmp_path / "o.zarr"))
    with pytest.raises(RuntimeError, match="held by this run"):
        lock.fence()
