"""One writer per output: an exclusive lock file next to the output, ``OUT.zarr.lock``.

A run takes the lock before it touches the output (before ``overwrite`` deletes anything) and gives
it back when it ends, normally, on an error or on KeyboardInterrupt. A second run on the same output
is refused with a one-line :class:`OutputLockedError` naming the owner.

* **Beside the output, not in it**, so that ``overwrite`` can delete the output while holding it and a
  run can hold it before the output exists.
* **Atomic, also on NFS.** The owner's record (host, PID, start time, a random token) is written to a
  private file first, which is then hard-linked to the lock's name: ``link`` fails if the name
  exists, on every POSIX file system including NFS (where ``O_EXCL`` and ``flock`` were long
  unreliable, and ``flock`` does not reach across nodes at all). A link whose reply was lost still
  shows as a link count of 2. Where hard links are not supported, ``O_CREAT | O_EXCL`` is used.
* **Stale locks.** A run killed with SIGKILL (or a crashed node) leaves its lock. On the same host the
  owner is checked: a PID that no longer runs (or a PID reused by another process, or a reboot since)
  means stale, and the lock is taken over with a warning. A lock from another host cannot be checked
  from here: it is reported with its owner and age, and the user deletes the file if that run is gone.
  Two runs taking over the same stale lock at once are serialised by a second lock, ``.break``.
  A run whose store failed may not be able to delete its lock either: the lock is left (the run's
  own error is raised), and taken over as stale by the next run, of this process too.
* **On object storage** (an ``s3://`` output) the lock is the object ``OUT.zarr.lock`` beside the
  output, created with S3's conditional write (``If-None-Match: *``, atomic at the server: of two
  runs, one creates it and the other is refused), read and deleted as the file is. The lock is then
  created a second time, which must be refused: a server that ignores the condition (it would let
  two runs in) is found so, and the run refused in one line.
* **Fences.** The lock guards clients; a client killed on an external cluster leaves its tasks
  running. Each task carries its run's :class:`Fence` (the lock's path and the run's token) and,
  before it writes a batch's outputs and again before it records them complete, checks that the
  lock still names its run (one small file read); if not, it stops with a
  :class:`FencedError` and writes nothing more.

:func:`releases_locks` (a decorator) and :func:`acquire` tie a lock to one call of
:func:`batchlu.pipeline.run`: taken inside it, given back when it returns or raises.
"""

from __future__ import annotations

import contextvars
import dataclasses
import datetime
import errno
import functools
import json
import os
import socket
import time
import uuid
import warnings

from ..errors import BatchluWarning, FencedError, ObjectStoreError, OutputLockedError
from ..store import _object_store
from ..store._object_store import is_url

SUFFIX = ".lock"
BREAK_SUFFIX = ".break"
BREAK_TIMEOUT = 600.0  # seconds after which a ``.break`` left by a crashed process is ignored
_ATTEMPTS = 50


def lock_path(output: str) -> str:
    """Where the lock of the output at ``output`` lives: ``OUTPUT.lock`` in the same folder."""
    return os.fspath(output).rstrip(os.sep) + SUFFIX


# ------------------------------------------------------------------------------------------ the owner
def _read_text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def _process_start(pid: int) -> str | None:
    """The start time of process ``pid`` (clock ticks after boot; Linux), telling a reused PID apart."""
    text = _read_text(f"/proc/{pid}/stat")
    if not text or ")" not in text:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return fields[19] if len(fields) > 19 else None


def _process_state(pid: int) -> str | None:
    text = _read_text(f"/proc/{pid}/stat")
    if not text or ")" not in text:
        return None
    fields = text.rsplit(")", 1)[1].split()
    return fields[0] if fields else None


@dataclasses.dataclass(frozen=True)
class Owner:
    """Who holds a lock: host, PID, start time (UTC, ISO 8601) and a token unique to the holder."""

    host: str
    pid: int
    started: str
    token: str
    boot_id: str | None = None      # the host's boot (Linux): a PID from before a reboot is gone
    pid_start: str | None = None    # the process's start (Linux): a PID reused later is not the owner

    @classmethod
    def me(cls) -> Owner:
        return cls(host=socket.gethostname(), pid=os.getpid(),
                   started=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                   token=uuid.uuid4().hex, boot_id=_read_text("/proc/sys/kernel/random/boot_id"),
                   pid_start=_process_start(os.getpid()))

    def to_bytes(self) -> bytes:
        return (json.dumps(dataclasses.asdict(self)) + "\n").encode()

    @classmethod
    def parse(cls, text: str) -> Owner | None:
        try:
            data = json.loads(text)
            return cls(host=str(data["host"]), pid=int(data["pid"]), started=str(data["started"]),
                       token=str(data["token"]), boot_id=data.get("boot_id"),
                       pid_start=data.get("pid_start"))
        except (ValueError, TypeError, KeyError):
            return None

    def age(self) -> str:
        """How long ago the owner started, e.g. ``3 h 2 min``."""
        try:
            then = datetime.datetime.fromisoformat(self.started)
        except ValueError:
            return "unknown time"
        seconds = int((datetime.datetime.now(datetime.timezone.utc) - then).total_seconds())
        if seconds < 0:
            return "0 s (its clock is ahead)"
        if seconds < 120:
            return f"{seconds} s"
        if seconds < 7200:
            return f"{seconds // 60} min"
        return f"{seconds // 3600} h {seconds % 3600 // 60} min"

    def describe(self) -> str:
        return f"PID {self.pid} on host {self.host}, started {self.started} ({self.age()} ago)"

    def is_local(self) -> bool:
        return self.host == socket.gethostname()

    def is_running(self) -> bool:
        """Whether the owner still runs; only meaningful on its own host (:meth:`is_local`)."""
        boot_id = _read_text("/proc/sys/kernel/random/boot_id")
        if self.boot_id and boot_id and self.boot_id != boot_id:
            return False  # the host rebooted since
        if self.pid <= 0:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # someone else's process: it exists
        if _process_state(self.pid) in ("Z", "X"):
            return False  # exited, not yet reaped
        start = _process_start(self.pid)
        return not (self.pid_start and start and self.pid_start != start)


# ------------------------------------------------------------------------------------ file operations
def _create_exclusive(path: str, content: bytes) -> bool:
    """``O_CREAT | O_EXCL`` for file systems without hard links; False if ``path`` exists."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, content)
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def _create(path: str, content: bytes) -> bool:
    """Create ``path`` holding ``content``, atomically; False if it exists already."""
    if is_url(path):
        return _object_store.put_new(path, content)
    private = f"{path}.{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:12]}"
    try:   # the private file goes whatever happens, Ctrl-C while it is written included
        with open(private, "xb") as f:
            f.write(content)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(private, path)
            return True
        except OSError as exc:
            try:  # NFS: the link may have been made although its reply was lost
                if os.stat(private).st_nlink == 2:
                    return True
            except OSError:
                pass
            if exc.errno == errno.EEXIST:
                return False
            if exc.errno in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.ENOSYS, errno.EMLINK):
                return _create_exclusive(path, content)  # no hard links on this file system
            raise
    finally:
        try:
            os.unlink(private)
        except OSError:
            pass


_UNREADABLE = object()


def _read(path: str, tries: int = 20):
    """The :class:`Owner` recorded in ``path``, None if there is no such file, ``_UNREADABLE`` if it
    does not hold a record (after waiting a little: an ``O_EXCL`` writer may be writing it)."""
    for attempt in range(tries):
        text = _read_lock(path)
        if text is None:
            return None
        owner = Owner.parse(text)
        if owner is not None:
            return owner
        if attempt + 1 < tries:
            time.sleep(0.05)
    return _UNREADABLE


def _read_lock(path: str) -> bytes | None:
    """The lock file's (or object's) first 64 KiB; None where there is none."""
    if is_url(path):
        data = _object_store.get(path)
        return None if data is None else data[:65536]
    try:
        with open(path, "rb") as f:
            return f.read(65536)
    except FileNotFoundError:
        return None


def _unlink(path: str) -> None:
    if is_url(path):
        _object_store.delete(path)
    else:
        os.unlink(path)


def _age(path: str) -> float:
    """Seconds since the lock file (or object) was written; 0 where there is none."""
    if is_url(path):
        meta = _object_store.head(path)
        return 0.0 if meta is None else time.time() - meta["last_modified"].timestamp()
    return time.time() - os.stat(path).st_mtime


def _unlink_if(path: str, token: str) -> bool:
    owner = _read(path, tries=1)
    if isinstance(owner, Owner) and owner.token == token:
        try:
            _unlink(path)
            return True
        except FileNotFoundError:
            pass
    return False


# ------------------------------------------------------------------------------------------ the lock
class OutputLock:
    """The lock of one output path. :meth:`acquire` raises :class:`OutputLockedError` if another run
    holds it; :meth:`release` gives it back (only if this process still holds it)."""

    def __init__(self, output: str):
        self.output = os.fspath(output)
        self.path = lock_path(self.output)
        self.owner: Owner | None = None

    def acquire(self) -> OutputLock:
        if not is_url(self.path):
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        me = Owner.me()
        for _ in range(_ATTEMPTS):
            try:
                created = _create(self.path, me.to_bytes())
            except OSError as exc:
                raise OutputLockedError(
                    f"Expected to create the lock file {self.path} (one batchlu run per output). "
                    f"Got {exc.strerror or exc} instead.") from None
            if created:
                if is_url(self.path):
                    _refuse_unconditional(self.path, self.output, me)
                self.owner = me
                return self
            holder = _read(self.path)
            if holder is None:
                continue  # released meanwhile: try again
            if holder is _UNREADABLE:
                raise OutputLockedError(
                    f"Expected the lock file {self.path} to name the batchlu run writing {self.output}. "
                    f"Got unreadable content instead; if no run writes it, delete that file.")
            if not holder.is_local():
                raise OutputLockedError(
                    f"Expected no other batchlu run writing {self.output}. Got a lock held by "
                    f"{holder.describe()} instead; this host cannot tell if that run is still going: "
                    f"if it is not, delete {self.path} and run again.")
            ended = holder.token in _LEFT   # a run of this process that could not give it back
            if holder.is_running() and not ended:
                raise OutputLockedError(
                    f"Expected no other batchlu run writing {self.output}. Got one running instead: "
                    f"{holder.describe()}; wait for it to end or stop it (its lock: {self.path}).")
            if _break_stale(self.path, holder, me):
                warnings.warn(f"Took over the stale lock {self.path} of {holder.describe()}, which "
                              f"{'ended without giving it back' if ended else 'no longer runs'}.",
                              BatchluWarning, stacklevel=2)
        raise OutputLockedError(f"Expected to take the lock {self.path} within {_ATTEMPTS} attempts. "
                                f"Got it taken by other runs each time instead.")

    def fence(self) -> Fence:
        """What this run's tasks check before they write (see :class:`Fence`); needs the lock held."""
        if self.owner is None:
            raise RuntimeError(f"Expected the lock {self.path} held by this run. Got it not held instead.")
        return Fence(self.path, self.owner.token)

    def release(self) -> None:
        if self.owner is not None:
            _unlink_if(self.path, self.owner.token)
            self.owner = None


@dataclasses.dataclass(frozen=True)
class Fence:
    """A run's claim on its output, carried by its tasks (small and picklable): the lock file's path
    and the run's token. :meth:`check` raises :class:`FencedError` unless the lock file still names
    that token, i.e. unless no other run took the output since (after this run's client was killed,
    or its lock was released or deleted). A lock that cannot be read counts as taken: a task writes
    only while it can tell the output is its run's. An object store that fails the read (no answer,
    a 5xx) says nothing of another run: its :class:`ObjectStoreError` stops the task as it is."""

    path: str
    token: str

    def check(self) -> None:
        try:
            text = _read_lock(self.path)
        except ObjectStoreError:
            raise
        except OSError as exc:
            raise FencedError(self._message(f"a lock file it cannot read ({exc.strerror or exc})")) from None
        if text is None:
            raise FencedError(self._message("no lock file"))
        holder = Owner.parse(text)
        if holder is not None and holder.token == self.token:
            return
        raise FencedError(self._message("unreadable content" if holder is None else
                                        f"the token {holder.token} of {holder.describe()}"))

    def _message(self, got: str) -> str:
        return (f"Expected the lock {self.path} to name this run (token {self.token}). Got {got} instead: "
                f"another run took the output; this task stops without writing.")


def _refuse_unconditional(path: str, output: str, me: Owner) -> None:
    """Just after creating the lock object ``path``: create it again, which S3's conditional write
    must refuse. A server that accepts it ignores ``If-None-Match`` (an old MinIO or Ceph), so two
    runs could each "create" the lock: the lock is taken back and the run refused."""
    if not _object_store.put_new(path, me.to_bytes()):
        return
    _unlink_if(path, me.token)
    raise OutputLockedError(
        f"Expected the object store to refuse a second create of the lock {path} (S3's conditional write, "
        f"If-None-Match: *), which keeps one batchlu run per output. Got it accepted instead: this server "
        f"ignores the condition, so two runs could write {output} at once; use a store that honours "
        f"conditional writes (AWS S3, MinIO, moto) or a local or shared disk.")


def _break_stale(path: str, stale: Owner, me: Owner) -> bool:
    """Delete the lock ``path`` if it still holds ``stale``; True if this call deleted it. A second
    lock, ``path.break``, keeps two runs from deleting each other's fresh lock."""
    breaker = path + BREAK_SUFFIX
    if not _create(breaker, me.to_bytes()):
        other = _read(breaker, tries=1)
        try:
            old = _age(breaker) > BREAK_TIMEOUT
        except OSError:
            old = False
        if isinstance(other, Owner) and ((other.is_local() and not other.is_running()) or old):
            _unlink_if(breaker, other.token)  # left by a crashed breaker
        elif other is _UNREADABLE and old:
            try:
                _unlink(breaker)
            except OSError:
                pass
        else:
            time.sleep(0.1)  # another run is taking over: look again
        return False
    try:
        return _unlink_if(path, stale.token)
    finally:
        _unlink_if(breaker, me.token)


# ------------------------------------------------------------------------------- lock per run() call
_HELD: contextvars.ContextVar[list | None] = contextvars.ContextVar("batchlu_locks", default=None)
# Tokens of this process's locks whose release failed (the object store that failed the run did not
# answer it either): their runs have ended, so a later run of this process takes them over as stale
_LEFT: set[str] = set()


def releases_locks(func):
    """Decorator: every lock :func:`acquire` takes during a call of ``func`` is released when the call
    returns or raises (KeyboardInterrupt included). Where the call raised, a release that fails too
    (the object store that failed the run does not answer the release either) leaves the lock for
    the next run to take over (a run of this process too: :data:`_LEFT`), and the call's own error
    is the one raised."""
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        token = _HELD.set([])
        try:
            result = func(*args, **kwargs)
        except BaseException:
            _release(token, quiet=True)
            raise
        _release(token, quiet=False)
        return result
    return wrapper


def _release(token, quiet: bool) -> None:
    """Release the locks taken since ``token``; ``quiet``: ignore a release that fails."""
    held = _HELD.get() or []
    _HELD.reset(token)
    for lock in reversed(held):
        try:
            lock.release()
        except Exception:
            if lock.owner is not None:
                _LEFT.add(lock.owner.token)
            if not quiet:
                raise


def acquire(output: str) -> OutputLock:
    """Take the lock of ``output`` for the rest of the enclosing :func:`releases_locks` call."""
    held = _HELD.get()
    if held is None:
        raise RuntimeError("Expected batchlu.pipeline.output._lock.acquire inside a releases_locks call. "
                           "Got a call outside one instead.")
    lock = OutputLock(output).acquire()
    held.append(lock)
    return lock
