"""One writer per output (issue 16, item 2): a second run on an output being written is refused with
one line naming the owner, before it deletes or writes anything; the lock is given back at the end
of a run, whether it succeeds or fails; a lock left by a dead process is taken over with a warning;
a lock from another host is reported with its owner and age."""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest
import zarr
from _pipeline_helpers import complete_flags, contend, outputs_of, sigkill, start_script, wait_for_chunks

from batchlu import pipeline
from batchlu.pipeline import errors
from batchlu.pipeline.output import _lock

RUNNER = textwrap.dedent("""
    import sys
    from distributed import Client, LocalCluster
    import dask
    from batchlu import pipeline

    if __name__ == "__main__":
        dask.config.set({"batchlu-testing.task-delay": 0.25})  # slowed down: it is still running when killed
        with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                          dashboard_address=None) as cluster, Client(cluster) as client:
            report = pipeline.run(sys.argv[1], sys.argv[2], op="inv", client=client, progress=False,
                                  config={"chunk": 4, "memory-budget": 1})
            print(report.status, report.processed)
""")


def _lock_file(out) -> str:
    return str(out) + ".lock"


def _write_lock(out, **fields) -> dict:
    owner = {"host": socket.gethostname(), "pid": os.getpid(), "started": "2020-01-02T03:04:05+00:00",
             "token": "t" * 32, "boot_id": None, "pid_start": None, **fields}
    with open(_lock_file(out), "w") as f:
        json.dump(owner, f)
    return owner


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# ------------------------------------------------------------------------------------- whole runs
def test_second_run_is_refused_and_the_first_completes_unharmed(client, stores, tmp_path):
    """The reported case: ``--overwrite`` (or ``--resume``) while a first run writes the output
    crashed the first run and left an output whose resume said complete with zero inverses."""
    out, clean = tmp_path / "o.zarr", tmp_path / "clean.zarr"
    first = start_script(tmp_path, RUNNER, stores["a"], out)
    try:
        wait_for_chunks(first, out, 2)
        owner = json.loads(open(_lock_file(out)).read())
        assert owner["pid"] == first.pid and owner["host"] == socket.gethostname()
        for kind in ({"overwrite": True}, {"resume": True}, {}):
            with pytest.raises(errors.OutputLockedError,
                               match=rf"^Expected no other batchlu run writing .*o\.zarr\. Got one running "
                                     rf"instead: PID {first.pid} on host {socket.gethostname()}, started"):
                pipeline.run(stores["a"], out, op="inv", client=client, progress=False, **kind)
        assert first.poll() is None and 0 < complete_flags(out).sum() < complete_flags(out).size
        output, _ = first.communicate(timeout=180)
    finally:
        if first.poll() is None:
            first.kill()
            first.wait()
    assert first.returncode == 0, output.decode()
    assert "complete 53" in output.decode()
    assert not os.path.exists(_lock_file(out))  # released at the end
    pipeline.run(stores["a"], clean, op="inv", client=client, progress=False, config={"chunk": 4})
    got, want = outputs_of(str(out)), outputs_of(str(clean))
    assert {k: v.tobytes() for k, v in got.items()} == {k: v.tobytes() for k, v in want.items()}
    assert zarr.open_group(str(out), mode="r").attrs["batchlu"]["status"] == "complete"
    assert pipeline.verify(stores["a"], out).ok


def test_lock_is_released_after_a_run_and_after_errors(client, stores, tmp_path, monkeypatch):
    out = tmp_path / "o.zarr"
    assert pipeline.run(stores["a"], out, op="slogdet", client=client, progress=False).status == "complete"
    assert not os.path.exists(_lock_file(out))
    with pytest.raises(errors.ResumeError):  # refused after the lock was taken
        pipeline.run(stores["a"], out, op="inv", resume=True, client=client, progress=False)
    assert not os.path.exists(_lock_file(out))
    with pytest.raises(errors.OutputExistsError):
        pipeline.run(stores["a"], out, op="slogdet", client=client, progress=False)
    assert not os.path.exists(_lock_file(out))

    seen = []

    def interrupted(*args, **kwargs):
        seen.append(json.loads(open(_lock_file(out)).read())["pid"])  # held while tasks run
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline.client._submit, "submit", interrupted)
    with pytest.raises(KeyboardInterrupt):
        pipeline.run(stores["a"], out, op="lu", overwrite=True, client=client, progress=False)
    assert seen == [os.getpid()] and not os.path.exists(_lock_file(out))
    # the lock is free: the next run takes it
    monkeypatch.undo()
    report = pipeline.run(stores["a"], out, op="lu", overwrite=True, client=client, progress=False)
    assert report.status == "complete" and not os.path.exists(_lock_file(out))


def test_stale_lock_of_a_dead_process_is_taken_over_with_a_warning(client, stores, tmp_path):
    out = tmp_path / "o.zarr"
    pid = _dead_pid()
    _write_lock(out, pid=pid)
    with pytest.warns(errors.BatchluWarning, match=rf"stale lock .*o\.zarr\.lock of PID {pid} on host "
                                                   rf"{socket.gethostname()}, .* no longer runs"):
        report = pipeline.run(stores["a"], out, op="inv", client=client, progress=False)
    assert report.status == "complete" and report.processed == 53
    assert not os.path.exists(_lock_file(out))


def test_lock_of_another_host_is_reported_with_owner_and_age(client, stores, tmp_path):
    out = tmp_path / "o.zarr"
    pipeline.run(stores["a"], out, op="inv", client=client, progress=False)
    stamp = (out / "zarr.json").read_bytes()
    owner = _write_lock(out, host="node-elsewhere-7", pid=4242)
    with pytest.raises(errors.OutputLockedError,
                       match=r"held by PID 4242 on host node-elsewhere-7, started 2020-01-02T03:04:05\+00:00 "
                             r"\(\d+ h \d+ min ago\).* delete .*o\.zarr\.lock"):
        pipeline.run(stores["a"], out, op="inv", overwrite=True, client=client, progress=False)
    assert (out / "zarr.json").read_bytes() == stamp and (out / "inv").is_dir()  # not deleted
    assert json.loads(open(_lock_file(out)).read()) == owner  # not ours to remove
    os.remove(_lock_file(out))  # what the message says to do once that run is known to be gone
    assert pipeline.run(stores["a"], out, op="inv", overwrite=True, client=client,
                        progress=False).status == "complete"


def test_refused_before_a_new_output_is_created(client, stores, tmp_path):
    out = tmp_path / "new.zarr"
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _write_lock(out, pid=sleeper.pid, pid_start=_lock._process_start(sleeper.pid))
        with pytest.raises(errors.OutputLockedError, match=rf"Got one running instead: PID {sleeper.pid}"):
            pipeline.run(stores["a"], out, op="inv", client=client, progress=False)
        assert not out.exists()
    finally:
        sleeper.kill()
        sleeper.wait()


# --------------------------------------------------------------------------------------- the lock
def test_owner_record_and_release(tmp_path):
    lock = _lock.OutputLock(str(tmp_path / "o.zarr")).acquire()
    owner = json.loads(open(lock.path).read())
    assert owner["host"] == socket.gethostname() and owner["pid"] == os.getpid()
    assert owner["started"].endswith("+00:00") and len(owner["token"]) == 32
    assert [f for f in os.listdir(tmp_path)] == ["o.zarr.lock"]  # the private file is gone
    with pytest.raises(errors.OutputLockedError, match=f"PID {os.getpid()}"):
        _lock.OutputLock(str(tmp_path / "o.zarr")).acquire()
    lock.release()
    assert os.listdir(tmp_path) == []


def test_release_leaves_a_lock_taken_by_someone_else(tmp_path):
    lock = _lock.OutputLock(str(tmp_path / "o.zarr")).acquire()
    os.remove(lock.path)
    other = _write_lock(tmp_path / "o.zarr", host="node-elsewhere-7")
    lock.release()
    assert json.loads(open(lock.path).read()) == other


def test_only_one_of_many_concurrent_runs_gets_the_lock(tmp_path):
    out = str(tmp_path / "o.zarr")
    won, refused = contend(lambda: _lock.OutputLock(out).acquire(), threads=8)
    assert len(won) == 1 and len(refused) == 7


def test_only_one_of_many_concurrent_runs_takes_over_a_stale_lock(tmp_path):
    out = tmp_path / "o.zarr"
    _write_lock(out, pid=_dead_pid())
    def take():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _lock.OutputLock(str(out)).acquire()

    won, refused = contend(take)
    assert len(won) == 1 and len(refused) == 5, refused
    assert json.loads(open(_lock_file(out)).read())["token"] == won[0].owner.token
    assert not os.path.exists(_lock_file(out) + ".break")


def test_reused_pid_and_reboot_make_a_lock_stale(tmp_path):
    me = _lock.Owner.me()
    assert me.is_local() and me.is_running()
    if me.pid_start is not None:  # Linux: a live PID started at another time is another process
        assert not _lock.Owner(me.host, me.pid, me.started, "x", me.boot_id, str(int(me.pid_start) + 1)).is_running()
    if me.boot_id is not None:
        assert not _lock.Owner(me.host, me.pid, me.started, "x", "another-boot", me.pid_start).is_running()
    assert not _lock.Owner(me.host, _dead_pid(), me.started, "x").is_running()


def test_without_hard_links_exclusive_create_is_used(tmp_path, monkeypatch):
    def no_links(src, dst):
        raise OSError(errno.EPERM, "Operation not permitted")

    monkeypatch.setattr(os, "link", no_links)
    out = str(tmp_path / "o.zarr")
    lock = _lock.OutputLock(out).acquire()
    assert json.loads(open(lock.path).read())["token"] == lock.owner.token
    with pytest.raises(errors.OutputLockedError, match="Got one running instead"):
        _lock.OutputLock(out).acquire()
    lock.release()
    assert os.listdir(tmp_path) == []


def test_unreadable_lock_is_reported(tmp_path):
    out = tmp_path / "o.zarr"
    with open(_lock_file(out), "w") as f:
        f.write("not a lock")
    with pytest.raises(errors.OutputLockedError, match=r"unreadable content instead; if no run writes it"):
        _lock.OutputLock(str(out)).acquire()


def test_killed_run_leaves_a_lock_that_resume_takes_over(client, stores, tmp_path):
    """SIGKILL skips every ``finally``: the lock stays, and the next run sees its owner is dead."""
    out = tmp_path / "o.zarr"
    proc = start_script(tmp_path, RUNNER, stores["a"], out)
    try:
        wait_for_chunks(proc, out, 2)
        sigkill(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert json.loads(open(_lock_file(out)).read())["pid"] == proc.pid
    with pytest.warns(errors.BatchluWarning, match=f"PID {proc.pid}"):
        report = pipeline.run(stores["a"], out, op="inv", resume=True, client=client, progress=False)
    assert report.status == "complete" and not os.path.exists(_lock_file(out))
    assert np.asarray(complete_flags(out)).all()


def test_ctrl_c_while_the_lock_is_written_leaves_no_private_file(tmp_path, monkeypatch):
    """The lock is made by a hard link from a private file; Ctrl-C while that file is written (its
    fsync) left it beside the output for good."""
    from batchlu.pipeline.output import _lock

    def interrupted(fd):
        raise KeyboardInterrupt

    monkeypatch.setattr(_lock.os, "fsync", interrupted)
    path = tmp_path / "out.zarr.lock"
    with pytest.raises(KeyboardInterrupt):
        _lock._create(str(path), b"content")
    assert list(tmp_path.iterdir()) == []
