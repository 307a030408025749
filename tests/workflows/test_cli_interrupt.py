"""Ctrl-C and SIGTERM on a ``batchlu run`` with worker processes end in one line and leave nothing
behind. A terminal sends Ctrl-C to its whole process group, the embedded cluster's workers included:
they used to die with tracebacks of their own (killed mid-import, mid-task, "reaping stray process")
over the client's ``Aborted!``, and a stopped run waited 4 s for busy workers. The run resumes to the
bits of a run never stopped."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import zarr

from batchlu import pipeline
from batchlu.pipeline.cluster import _connect

pytestmark = pytest.mark.skipif(not hasattr(os, "killpg") or not os.path.isdir("/proc/self/task"),
                                reason="process groups and /proc (Linux)")

MASK_OF_SIGINT = 1 << (signal.SIGINT - 1)   # in /proc's SigBlk


def _blocked(task: str = "self") -> int:
    """The signals blocked in a thread (``/proc/self/task/<id>``) or this process's main thread."""
    path = "/proc/self/status" if task == "self" else f"/proc/self/task/{task}/status"
    with open(path) as f:
        line = next(line for line in f if line.startswith("SigBlk:"))
    return int(line.split()[1], 16)


def _worker_blocked() -> int:
    return _blocked()


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    path = tmp_path_factory.mktemp("interrupt") / "in.zarr"
    rng = np.random.default_rng(20261206)
    a = zarr.create_array(str(path), shape=(48, 6, 6), chunks=(2, 6, 6), dtype="float64")
    a[...] = rng.standard_normal((48, 6, 6))
    return path


CPU_PROCESSES = ("--config", "cluster.processes=true", "--config", "cluster.n-workers=2",
                 "--config", "cluster.threads-per-worker=1")
GPU = ("--backend", "gpu")   # one worker process per GPU


def _command(source, out, *extra, cluster=CPU_PROCESSES):
    return [sys.executable, "-m", "batchlu", "run", str(source), str(out), "--op", "inv",
            "--no-progress", *cluster, *extra]


def _completed(out) -> int:
    try:
        return int(zarr.open_array(str(out), path="_complete", mode="r")[...].sum())
    except Exception:
        return 0


def _run_caller(text: str, source, tmp_path):
    """Run the program ``text`` on ``source`` (its run slowed, to be stopped midway): the finished
    process and the JSON of its last line of output."""
    import json

    script = tmp_path / "caller.py"
    script.write_text(text)
    env = dict(os.environ, DASK_BATCHLU_TESTING__TASK_DELAY="0.5")   # alive until stopped
    done = subprocess.run([sys.executable, str(script), str(source), str(tmp_path / "out.zarr"),
                           str(tmp_path / "run.log")], capture_output=True, text=True, env=env, timeout=300,
                          cwd=tmp_path)
    lines = done.stdout.strip().splitlines()
    return done, json.loads(lines[-1]) if lines else None   # None: it printed nothing (see its stderr)


def _kill_if_running(run) -> None:
    """SIGKILL ``run``'s process group if it still runs (a test that failed midway)."""
    if run.poll() is None:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()


def _ended_as(run, stderr: str, status: int, line: str) -> None:
    """``run`` exited with ``status``, its stderr that one line and nothing else."""
    assert run.returncode == status, stderr
    assert [text for text in stderr.splitlines() if text.strip()] == [line], stderr


def _wait_for_two_chunks(run, out) -> None:
    """Wait (5 min at most) until ``run`` has recorded two chunks of ``out`` complete; it still runs."""
    deadline = time.monotonic() + 300
    while _completed(out) < 2 and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert run.poll() is None and _completed(out) >= 2, run.communicate()


def _alive(group: int) -> list[str]:
    """The processes of a process group that still run (zombies waiting for init do not)."""
    found = subprocess.run(["ps", "-o", "pid=,stat=,args=", "-g", str(group)], capture_output=True, text=True)
    return [line for line in found.stdout.splitlines() if line.split()[1:2] and not line.split()[1].startswith("Z")]


def _ended(pid: int) -> bool:
    """Gone, or a zombie (a process may go between the two looks: gone, then)."""
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _watch_exit(run, stopped: float, ended: dict) -> None:
    while run.poll() is None and time.monotonic() < stopped + 60:
        time.sleep(0.01)
    ended["client"] = time.monotonic() - stopped
    ended["alive"] = _alive(run.pid)


SIGNALS = pytest.mark.parametrize("signum, line, status",
                                  [(signal.SIGINT, "Aborted!", 1),
                                   (signal.SIGTERM, "Aborted! (SIGTERM)", 128 + signal.SIGTERM)],
                                  ids=["ctrl-c", "sigterm"])


@SIGNALS
def test_a_signal_to_the_whole_group_is_one_line_and_resumes_bit_identical(source, tmp_path, signum, line, status):
    _stop_and_resume(source, tmp_path, signum, line, status, CPU_PROCESSES)


@SIGNALS
def test_a_signal_to_a_run_on_threads_of_its_process_is_one_line_and_resumes_bit_identical(source, tmp_path, signum,
                                                                                        line, status):
    """The CPU's default for small inputs: the tasks on a thread pool of the command's own process."""
    _stop_and_resume(source, tmp_path, signum, line, status, ("--backend", "cpu"))


def test_ctrl_c_on_a_run_in_its_process_with_an_io_process_is_one_line(source, tmp_path):
    """The I/O process of a run in the command's own process did not block SIGINT (a worker
    process's child inherits its block): it died with a traceback over "Aborted!"."""
    _stop_and_resume(source, tmp_path, signal.SIGINT, "Aborted!", 1,
                     ("--backend", "cpu", "--config", "io-processes=1"))


@pytest.mark.gpu
@SIGNALS
def test_gpu_a_signal_to_the_whole_group_is_one_line_and_resumes_bit_identical(source, tmp_path, signum, line,
                                                                               status):
    _stop_and_resume(source, tmp_path, signum, line, status, GPU)


@pytest.mark.parametrize("signum, line, status", [(signal.SIGINT, "Aborted!", 1),
                                                  (signal.SIGTERM, "Aborted! (SIGTERM)", 128 + signal.SIGTERM)],
                         ids=["ctrl-c", "sigterm"])
def test_ctrl_c_pressed_again_and_again_during_the_stop_changes_nothing(source, tmp_path, signum, line, status):
    """A second Ctrl-C 0.5 s into the stop cut its bounded closes short (distributed's exit hook then
    closed the cluster again: 11 s), and one during the interpreter's exit ended it by SIGINT (130)."""
    _stop_and_resume(source, tmp_path, signum, line, status, CPU_PROCESSES, again=signal.SIGINT)


@pytest.mark.parametrize("signum, line, status, again",
                         [(signal.SIGINT, "Aborted!", 1, signal.SIGTERM),
                          (signal.SIGTERM, "Aborted! (SIGTERM)", 128 + signal.SIGTERM, signal.SIGINT)],
                         ids=["ctrl-c-then-sigterm", "sigterm-then-ctrl-c"])
def test_the_first_signal_to_a_run_on_threads_of_its_process_decides_its_end(source, tmp_path, signum, line,
                                                                             status, again):
    """The run in the command's own process had no hold: the other signal 20 ms behind the first was
    raised in its stop and decided the exit (SIGTERM then Ctrl-C exited 1, Ctrl-C then SIGTERM 143)."""
    _stop_and_resume(source, tmp_path, signum, line, status, ("--backend", "cpu"), again=again, every=0.02)


def _again(group: int, signum: int, stopped: float, every: float = 0.05) -> None:
    """``signum`` to ``group`` every ``every`` s while it runs, as a user pressing Ctrl-C over and over."""
    while time.monotonic() < stopped + 60:
        time.sleep(every)
        try:
            os.killpg(group, signum)
        except ProcessLookupError:
            return


_HOLD = r"""
import os, signal, sys, time
from batchlu.pipeline.cluster import _connect
if sys.argv[1] == "ignored":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
stop = _connect._Stop()
stop.left()   # the first close of a stop
os.kill(os.getpid(), signal.SIGINT)
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.2)
held = signal.getsignal(signal.SIGINT)
stop.release()
print(held is signal.SIG_IGN, {s: signal.getsignal(s) for s in before} == before)
"""


@pytest.mark.parametrize("sigint", ["default", "ignored"])
def test_a_stop_drops_ctrl_c_and_sigterm_from_its_first_close_until_it_ends(sigint):
    """A second Ctrl-C 0.5 s into a stopped run's closes cut them short, and distributed's exit hook
    closed the cluster again (11 s). A Ctrl-C the process ignores (``batchlu run ... &`` in a script)
    stays ignored."""
    done = subprocess.run([sys.executable, "-c", _HOLD, sigint], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(sigint == "ignored"), "True"], done.stdout


def test_a_run_started_with_ctrl_c_ignored_ignores_it(source, tmp_path):
    """A shell starts ``batchlu run ... &`` with SIGINT ignored: the terminal's Ctrl-C is not for it."""
    out = tmp_path / "out.zarr"
    env = dict(os.environ, DASK_BATCHLU_TESTING__TASK_DELAY="0.2")
    run = subprocess.Popen(_command(source, out, cluster=("--backend", "cpu")), stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=env, start_new_session=True,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    try:
        _wait_for_two_chunks(run, out)
        os.killpg(run.pid, signal.SIGINT)
        _, stderr = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == 0 and stderr == "", stderr
    assert zarr.open_group(str(out), mode="r").attrs["batchlu"]["status"] == "complete"


_SLOW_RECORD = r"""
import os, sys, time
from batchlu.pipeline.output import _group

recording, sent = sys.argv[1], sys.argv[2]
real = _group.update

def update(path, **fields):
    if fields.get("status") == "failed":   # the stop's record: held until the test's second signal is in
        open(recording, "w").close()
        deadline = time.monotonic() + 60
        while not os.path.exists(sent) and time.monotonic() < deadline:
            time.sleep(0.01)
    return real(path, **fields)

if __name__ == "__main__":
    _group.update = update
    sys.argv = ["batchlu", *sys.argv[3:]]
    from batchlu.workflows import console
    console()
"""


@SIGNALS
def test_a_second_signal_during_the_failure_record_of_a_run_on_threads_of_its_process_is_dropped(source, tmp_path,
                                                                                                signum, line,
                                                                                                status):
    """A signal while the stopped run recorded its failure was raised in the record: the output said
    running, and the second signal decided the exit. The record says failed, naming the first; the
    lock is given back."""
    out, recording, sent = tmp_path / "out.zarr", tmp_path / "recording", tmp_path / "sent"
    script = tmp_path / "slow_record.py"
    script.write_text(_SLOW_RECORD)
    other = signal.SIGINT if signum == signal.SIGTERM else signal.SIGTERM
    env = dict(os.environ, DASK_BATCHLU_TESTING__TASK_DELAY="0.5")   # alive until stopped
    command = _command(source, out, cluster=("--backend", "cpu"))[3:]   # after "-m batchlu"
    run = subprocess.Popen([sys.executable, str(script), str(recording), str(sent), *command],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                           start_new_session=True, cwd=tmp_path)
    try:
        _wait_for_two_chunks(run, out)
        os.kill(run.pid, signum)
        deadline = time.monotonic() + 60
        while not recording.exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert recording.exists(), run.communicate()
        os.kill(run.pid, other)   # while the failure is being recorded
        sent.touch()
        _, stderr = run.communicate(timeout=120)
    finally:
        _kill_if_running(run)
    _ended_as(run, stderr, status, line)
    record = zarr.open_group(str(out), mode="r").attrs["batchlu"]
    first = "Terminated" if signum == signal.SIGTERM else "KeyboardInterrupt"
    assert record["status"] == "failed" and record["error"].startswith(first), record
    assert not (tmp_path / "out.zarr.lock").exists()


# the test scripts' count of the output's chunks recorded complete (0 before the output exists)
_COMPLETE = r"""
def complete(out):
    try:
        return int(zarr.open_array(out, path="_complete", mode="r")[...].sum())
    except Exception:
        return 0
"""


_IN_PROCESS_CALLER = r"""
import json, os, signal, sys, threading, time
import zarr
from batchlu import pipeline
from batchlu.pipeline.client import _submit
from batchlu.pipeline.cluster import _stops

""" + _COMPLETE + r"""
real_stop = _submit._Stopping.stop
seen = {}

def stop(self):   # the run's stop has begun: SIGTERM and Ctrl-C again, in it
    real_stop(self)
    seen["held"] = signal.getsignal(signal.SIGTERM) is _stops.dropped
    os.kill(os.getpid(), signal.SIGTERM)   # its default action would end this process
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.1)   # their handlers run here, in the stop

if __name__ == "__main__":
    src, out = sys.argv[1], sys.argv[2]
    _submit._Stopping.stop = stop
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}

    def interrupt():   # a notebook's "interrupt kernel"
        while complete(out) < 2:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    try:
        pipeline.run(src, out, op="inv", backend="cpu", progress=False,
                     config={"cluster.log-file": sys.argv[3]})
        ended = "returned"
    except KeyboardInterrupt:
        ended = "KeyboardInterrupt"
    now = {s: signal.getsignal(s) for s in before}
    print(json.dumps({"ended": ended, "held": seen.get("held"), "given_back": now == before,
                      "status": zarr.open_group(out, mode="r").attrs["batchlu"]["status"]}), flush=True)
"""


def test_a_program_that_stops_a_run_on_threads_of_its_process_gets_its_handlers_back(source, tmp_path):
    """A notebook's interrupt of a run on threads of its own process: signals after it are dropped
    while the run stops (SIGTERM's default action ended the process), the first decides
    (KeyboardInterrupt), and the program's handlers are back once run() has raised."""
    done, result = _run_caller(_IN_PROCESS_CALLER, source, tmp_path)
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert result == {"ended": "KeyboardInterrupt", "held": True, "given_back": True, "status": "failed"}, \
        (result, done.stderr[-2000:])


def _stop_and_resume(source, tmp_path, signum, line, status, cluster, again=None, every=0.05):
    out = tmp_path / "out.zarr"
    env = dict(os.environ, DASK_BATCHLU_TESTING__TASK_DELAY="0.5")   # alive until stopped
    run = subprocess.Popen(_command(source, out, cluster=cluster), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env=env, start_new_session=True)   # its own group: the terminal's, here
    try:
        _wait_for_two_chunks(run, out)
        os.killpg(run.pid, signum)   # the client and its workers, as a terminal does
        stopped = time.monotonic()
        ended = {}   # the client's own exit, and what of the group outlived it: named if slow
        watch = threading.Thread(target=_watch_exit, args=(run, stopped, ended), daemon=True)
        watch.start()
        if again is not None:
            threading.Thread(target=_again, args=(run.pid, again, stopped, every), daemon=True).start()
        stdout, stderr = run.communicate(timeout=60)   # until the last process holding its output ends
        took = time.monotonic() - stopped
        watch.join(5)
    finally:
        _kill_if_running(run)
    _ended_as(run, stderr, status, line)
    assert took < 4, (f"a stopped run took {took:.1f} s to exit (the client {ended.get('client', -1):.1f} s; "
                      f"alive then: {ended.get('alive')})")   # distributed's 4 s wait for busy workers
    time.sleep(0.5)
    assert _alive(run.pid) == []   # no worker left running
    assert zarr.open_group(str(out), mode="r").attrs["batchlu"]["status"] == "failed"

    resumed = subprocess.run(_command(source, out, "--resume", cluster=cluster), capture_output=True, text=True,
                             timeout=300)
    assert resumed.returncode == 0 and "Warning" not in resumed.stderr, resumed.stderr
    whole = tmp_path / "whole.zarr"
    fresh = subprocess.run(_command(source, whole, cluster=cluster), capture_output=True, text=True, timeout=300)
    assert fresh.returncode == 0, fresh.stderr
    for name in ("inv", "info"):
        got = zarr.open_array(str(out), path=name, mode="r")[...]
        want = zarr.open_array(str(whole), path=name, mode="r")[...]
        assert got.tobytes() == want.tobytes(), name


def test_worker_processes_start_with_sigint_blocked_and_the_client_gets_it_back(tmp_path):
    options = pipeline.options({"cluster.processes": True, "cluster.n-workers": 2,
                                "cluster.threads-per-worker": 1, "cluster.dashboard-address": "127.0.0.1:0",
                                "cluster.log-file": str(tmp_path / "run.log")})
    assert not _blocked() & MASK_OF_SIGINT
    with _connect._embedded(options, None) as client:
        workers = client.run(_worker_blocked)
        assert len(workers) == 2 and all(mask & MASK_OF_SIGINT for mask in workers.values()), workers
        assert not _blocked() & MASK_OF_SIGINT   # this thread takes Ctrl-C as before
    assert not _blocked() & MASK_OF_SIGINT


def test_ctrl_c_while_the_workers_start_takes_effect_when_the_start_ends():
    handler = signal.getsignal(signal.SIGINT)
    reached = []
    with pytest.raises(KeyboardInterrupt):
        with _connect._sigint_held(True):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)   # time for the signal to land: held, not raised here
            reached.append(_blocked() & MASK_OF_SIGINT)
    assert reached and reached[0]
    assert signal.getsignal(signal.SIGINT) is handler and not _blocked() & MASK_OF_SIGINT


def test_ctrl_c_while_the_command_line_loads_is_one_line():
    """``batchlu`` loads its command line inside its entry point: Ctrl-C there is ``Aborted!``."""
    script = ("import signal, sys, builtins\n"
              "real = builtins.__import__\n"
              "def stop(name, *args, **kwargs):\n"
              "    if name == 'click':\n"
              "        signal.raise_signal(signal.SIGINT)\n"
              "    return real(name, *args, **kwargs)\n"
              "builtins.__import__ = stop\n"
              "from batchlu.workflows import main\n"
              "main(['--help'])\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and done.stderr.strip() == "Aborted!", done.stderr


def _sleep_here(seconds: float) -> None:
    time.sleep(seconds)


def test_a_stopped_run_whose_workers_do_not_close_leaves_in_seconds(monkeypatch, tmp_path):
    """After Ctrl-C the worker processes' close is bounded: one that does not end (a busy GPU worker
    on a loaded machine held a stopped run over 60 s) is waited for INTERRUPTED_CLUSTER_CLOSE_S in
    all, the client's, the workers' and the cluster's closes together, then killed. No worker
    process is left."""
    import asyncio

    import psutil

    async def never(*args, **kwargs):
        await asyncio.sleep(3600)

    monkeypatch.setattr(_connect, "_close_workers", never)
    options = pipeline.options({"cluster.processes": True, "cluster.n-workers": 2,
                                "cluster.threads-per-worker": 1, "cluster.dashboard-address": "127.0.0.1:0",
                                "cluster.log-file": str(tmp_path / "run.log")})
    with pytest.raises(KeyboardInterrupt):
        with _connect._embedded(options, None) as client:
            pids = list(client.run(os.getpid).values())
            client.submit(_sleep_here, 30, pure=False)   # a worker busy when the run stops
            stopped = time.monotonic()
            raise KeyboardInterrupt
    took = time.monotonic() - stopped
    bound = _connect.INTERRUPTED_CLUSTER_CLOSE_S + _connect.LEAST_CLOSE_S + _connect.INTERRUPTED_CLOSE_S + 1
    assert took < bound, f"the stopped run took {took:.1f} s to close"
    assert len(pids) == 2
    for pid in pids:
        assert _ended(pid), pid


def test_the_closes_of_a_stopped_run_share_one_deadline(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(_connect.time, "monotonic", lambda: clock[0])
    stop = _connect._Stop()
    assert stop.left() == _connect.INTERRUPTED_CLUSTER_CLOSE_S   # the deadline starts at the first close
    clock[0] += 1.5
    assert stop.left() == _connect.INTERRUPTED_CLUSTER_CLOSE_S - 1.5
    clock[0] += 5
    assert stop.left() == _connect.LEAST_CLOSE_S   # past it: the least a close gets


def _spawned_sleeper() -> None:
    time.sleep(60)


def test_worker_processes_left_after_a_stop_are_killed_and_the_resource_tracker_kept():
    import multiprocessing

    import psutil
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    tracker = resource_tracker._resource_tracker._pid
    child = multiprocessing.get_context("spawn").Process(target=_spawned_sleeper)
    child.start()
    try:
        deadline = time.monotonic() + 30   # this child, not a worker process an earlier test left
        while "spawn_main" not in " ".join(psutil.Process(child.pid).cmdline()) and time.monotonic() < deadline:
            time.sleep(0.05)
        _connect._kill_worker_processes({child.pid})
        child.join(5)
        assert child.exitcode == -signal.SIGKILL, child.exitcode
        assert tracker is not None and psutil.pid_exists(tracker), tracker
        assert psutil.Process(tracker).status() != psutil.STATUS_ZOMBIE
    finally:
        if child.is_alive():
            child.kill()


def _spawned_parent_of_a_sleeper(path: str) -> None:
    import subprocess

    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    with open(path + ".tmp", "w") as f:
        f.write(str(sleeper.pid))
    os.replace(path + ".tmp", path)
    time.sleep(60)


def test_the_children_of_worker_processes_named_before_the_close_are_killed_after_their_worker_ended(tmp_path):
    """A GPU worker's I/O process blocks SIGINT as its worker does: its worker ending first left it
    to init, out of reach of a kill of the worker's children."""
    import multiprocessing

    import psutil

    path = str(tmp_path / "sleeper.pid")
    worker = multiprocessing.get_context("spawn").Process(target=_spawned_parent_of_a_sleeper, args=(path,))
    worker.start()
    sleeper = None
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.05)
        sleeper = int(open(path).read())
        below = _connect._descendants({worker.pid})
        assert [process.pid for process in below] == [sleeper]
        worker.terminate()   # ended before the kill: its child is init's now
        worker.join(10)
        assert worker.exitcode is not None and psutil.Process(sleeper).status() != psutil.STATUS_ZOMBIE
        _connect._kill_worker_processes({worker.pid}, below)
        assert _ended(sleeper)
    finally:
        if worker.is_alive():
            worker.kill()
        if sleeper is not None:
            with contextlib.suppress(psutil.Error):
                psutil.Process(sleeper).kill()


_STOPPED_PROCESS = r"""
import asyncio, os, sys, time
from batchlu import pipeline
from batchlu.pipeline.cluster import _connect
from distributed.deploy.spec import SpecCluster

async def never(*args, **kwargs):
    await asyncio.sleep(3600)

def nap(seconds):
    time.sleep(seconds)

if __name__ == "__main__":
    _connect._close_workers = never
    if sys.argv[2] == "slow-close":   # a cluster whose own close does not end in time either
        real = SpecCluster._close
        async def slow(self):
            await asyncio.sleep(30)
            await real(self)
        SpecCluster._close = slow
    options = pipeline.options({"cluster.processes": True, "cluster.n-workers": 1,
                                "cluster.threads-per-worker": 1, "cluster.dashboard-address": "127.0.0.1:0",
                                "cluster.log-file": sys.argv[1]})
    try:
        with _connect._embedded(options, None) as client:
            client.submit(nap, 30, pure=False)
            time.sleep(0.5)
            print("stopping", flush=True)
            raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
"""


@pytest.mark.parametrize("close", ["slow-close", "plain"])
def test_a_stopped_run_exits_without_distributed_closing_its_cluster_again(tmp_path, close):
    """After Ctrl-C and the bounded close, the process exits at once: distributed's atexit hook
    (``close_clusters``) closed a cluster whose close had not finished again, waiting up to 10 s more
    for it (a GPU run stopped by Ctrl-C took 12.8 s to exit on an H100)."""
    script = tmp_path / "stopped.py"
    script.write_text(_STOPPED_PROCESS)
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "run.log"), close],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    line = proc.stdout.readline()
    stopped = time.monotonic()
    assert line.strip() == "stopping", proc.communicate(timeout=60)
    proc.communicate(timeout=60)
    took = time.monotonic() - stopped
    assert proc.returncode == 0
    assert took < 3 * _connect.INTERRUPTED_CLUSTER_CLOSE_S + 2, f"the stopped process took {took:.1f} s to exit"


_CALLER = r"""
import json, multiprocessing, os, signal, sys, threading, time
import numpy as np, zarr
from batchlu import pipeline

""" + _COMPLETE + r"""
if __name__ == "__main__":
    src, out = sys.argv[1], sys.argv[2]
    mine = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(300,))
    mine.start()   # the caller's own process

    def interrupt():   # a notebook's "interrupt kernel": SIGINT to this process only
        while complete(out) < 2:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=interrupt, daemon=True).start()
    try:
        pipeline.run(src, out, op="inv", progress=False, config={
            "cluster.processes": True, "cluster.n-workers": 2, "cluster.threads-per-worker": 1,
            "cluster.dashboard-address": "127.0.0.1:0", "cluster.log-file": sys.argv[3]})
        stopped = False
    except KeyboardInterrupt:
        stopped = True
    time.sleep(0.5)
    import psutil
    others = [" ".join(p.cmdline())[:80] for p in psutil.Process().children()
              if p.pid != mine.pid and p.status() != psutil.STATUS_ZOMBIE
              and "resource_tracker" not in " ".join(p.cmdline())]
    print(json.dumps({"stopped": stopped, "alive": mine.is_alive(), "exitcode": mine.exitcode,
                      "workers_left": others}), flush=True)
    mine.terminate()
    mine.join()
"""


def test_ctrl_c_in_the_api_kills_the_clusters_workers_only(source, tmp_path):
    """Ctrl-C in a program that calls batchlu (a Jupyter kernel's interrupt): the embedded cluster's
    worker processes end, and a process the program started itself lives on. Every child process
    started by multiprocessing's spawn was killed, a user's own processes and clusters' included."""
    done, result = _run_caller(_CALLER, source, tmp_path)
    assert result == {"stopped": True, "alive": True, "exitcode": None, "workers_left": []}, \
        (result, done.stderr[-2000:])
