"""What is at a path, and writing there: Zarr stores batchlu wrote, outputs that exist, whole files.

* :func:`is_zarr_store`, :func:`written_by`: a folder with Zarr metadata at its root, and whether
  ``batchlu run`` or ``batchlu generate`` wrote it;
* :func:`occupied` / :func:`refuse_occupied`: the one test of "the output exists" (anything at the
  path but an empty folder), for ``batchlu run``, ``batchlu generate`` and the command line alike;
  :func:`check_replaceable` and :func:`remove`, what ``overwrite`` may delete and deletes;
* :func:`check_output_path`: an output path apart from the inputs and writable, checked before
  anything is written; :func:`naming_full_device`: a full device named by the store being written;
* :func:`write_file`: a file written whole, through a temporary file renamed into place;
  :func:`file_mode`, the mode zarr's own writes give a new file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import pathlib
import shutil
import tempfile

import zarr

from ..errors import OutputError, OutputExistsError
from . import _object_store
from ._object_store import is_url, join

METADATA_FILES = ("zarr.json", ".zarray", ".zgroup")


def has_metadata(path: str) -> bool:
    """Whether ``path`` holds Zarr metadata at its root (``zarr.json``, ``.zarray`` or ``.zgroup``)."""
    if is_url(path):
        return any(_object_store.head(join(path, f)) for f in METADATA_FILES)
    return any(os.path.exists(os.path.join(path, f)) for f in METADATA_FILES)


def is_zarr_store(path: str) -> bool:
    if is_url(path):
        return has_metadata(path)
    return os.path.isdir(path) and has_metadata(path)


def is_empty_folder(path: str) -> bool:
    if is_url(path):
        return False   # object storage has no folders: a prefix with nothing below is nothing
    return os.path.isdir(path) and not os.listdir(path)


def occupied(path: str) -> bool:
    """Whether anything is at ``path`` that a new store written there would replace: anything but
    nothing or an empty folder."""
    if is_url(path):
        return _object_store.probe(path, "the output")
    return os.path.exists(path) and not is_empty_folder(path)


def refuse_occupied(path: str, then: str, name: str | None = None) -> None:
    """Raise :class:`OutputExistsError` when something is at ``path`` (:func:`occupied`), naming it
    ``name`` (default: the path) and saying what to do ``then``."""
    if occupied(path):
        raise OutputExistsError(f"Expected {name or path} not to exist. Got an existing path instead; {then}.")


def zarr_location(obj, what: str, error: type = OutputError) -> tuple[str, str] | None:
    """Where a zarr object given in place of a path lives: ``(directory, path inside it)`` of a
    ``zarr.Array`` or ``zarr.Group``, of a ``zarr.storage`` store (its root), or of ``(group or store,
    name)``; None for a path. A store that is not on the local file system (``LocalStore``) is refused
    with one ``error`` naming ``what`` (one over S3 reaches here as its URL: see
    :func:`batchlu.pipeline.store._object_store.takes_storage_options`)."""
    store, inner, name = _object_store.zarr_parts(obj)
    if store is None and name:
        raise error(f"Expected the {what} as (zarr.Group or zarr.storage store, array name). Got "
                    f"({type(obj[0]).__name__}, {name!r}) instead.")
    if store is None:
        return None
    if not isinstance(store, zarr.storage.LocalStore):
        raise error(f"Expected the {what} on the local file system (a path, or a zarr object over "
                    f"zarr.storage.LocalStore) or on S3 (an s3:// URL, or a zarr object over "
                    f"zarr.storage.ObjectStore with obstore's S3Store). Got a zarr object over "
                    f"{type(store).__name__} instead.")
    return str(store.root), "/".join(part.strip("/") for part in (inner, name) if part.strip("/"))


def output_path(output, *, writing: bool = True) -> str | os.PathLike:
    """``output`` as a path: a path as given, the directory of a zarr group or local store (refused
    where the object is an array: an output is a group of arrays; and, ``writing``, where the store
    is read-only)."""
    if isinstance(output, zarr.Array):
        raise OutputError(f"Expected the output as a path, a zarr.Group or a zarr.storage.LocalStore "
                          f"(batchlu writes a group of arrays). Got the zarr.Array {output.path or '/'} instead.")
    location = zarr_location(output, "output")
    if location is None:
        if not isinstance(output, (str, os.PathLike)):
            raise OutputError(f"Expected the output as a path, a zarr.Group or a zarr.storage.LocalStore. "
                              f"Got a {type(output).__name__} instead.")
        return output
    store = output[0] if isinstance(output, tuple) else output
    store = store.store_path.store if isinstance(store, zarr.Group) else store
    if writing and store.read_only:
        raise OutputError(f"Expected a writable store for the output. Got a read-only "
                          f"{type(store).__name__} at {store.root} instead.")
    root, inner = location
    return os.path.join(root, *inner.split("/")) if inner else root


def check_output_path(output: str | os.PathLike, inputs: list) -> str:
    """Resolve the output path and check it can be written and does not overlap an input (``inputs``:
    their :class:`batchlu.pipeline.store._arrays.ArrayRef`)."""
    if is_url(output):
        return _check_output_url(str(output), inputs)
    path = pathlib.Path(os.fspath(output_path(output))).expanduser().resolve()
    for ref in inputs:
        src = pathlib.Path(ref.path)
        if path == src or src in path.parents or path in src.parents:
            raise OutputError(f"Expected the output {path} to be apart from the input {ref}. "
                              f"Got the same or a nested path instead.")
    if path.exists() and not path.is_dir():
        raise OutputError(f"Expected the output {path} to be a Zarr store (a directory) or not to "
                          f"exist. Got a regular file instead.")
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise OutputError(f"Expected the output's parent {parent} to be a directory. "
                          f"Got a regular file instead.")
    target = path if path.exists() else parent
    try:  # os.access says yes to root everywhere: try a real write (read-only mounts, /proc, ...)
        os.rmdir(tempfile.mkdtemp(prefix=".batchlu-probe-", dir=target))
    except OSError as err:
        raise OutputError(f"Expected the output location {target} to be writable. "
                          f"Got {err.strerror or err} instead.") from None
    return str(path)


def _check_output_url(output: str, inputs: list) -> str:
    """:func:`check_output_path` of an ``s3://`` output: apart from the inputs, its bucket there and
    the credentials accepted (one listing request)."""
    parsed = _object_store.parse(output, OutputError)
    url = str(parsed)
    if not parsed.key:   # its lock, OUT.lock beside it, would be another bucket's name
        raise OutputError(f"Expected the output below a bucket's root (s3://{parsed.bucket}/NAME.zarr). "
                          f"Got the root of s3://{parsed.bucket} itself instead.")
    for ref in inputs:
        if url == ref.path or url.startswith(ref.path + "/") or ref.path.startswith(url + "/"):
            raise OutputError(f"Expected the output {url} to be apart from the input {ref}. "
                              f"Got the same or a nested location instead.")
    _object_store.probe(url, "the output")
    return url


FULL_DEVICE = (errno.ENOSPC, errno.EDQUOT)   # "No space left on device", "Disk quota exceeded"


@contextlib.contextmanager
def naming_full_device(path, then: str):
    """Inside the block, an :class:`OSError` that says the device is full (a write cut short, which
    names no file) becomes an :class:`OutputError` naming ``path``, the store being written, and what
    to do ``then`` once there is room."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in FULL_DEVICE:
            raise
        where = pathlib.Path(os.fspath(output_path(path))).expanduser().resolve()
        raise OutputError(f"Expected room on the device to write {where}. Got \"{exc.strerror or exc}\" "
                          f"instead: free some space, then {then}.") from exc


# Who wrote a store, from the attributes at its root: a run's output group, or a generated array
# (the second name marks one still being written, or killed while it was).
WRITERS = {"batchlu": "run", "batchlu_generate": "generate", "batchlu_generate_incomplete": "generate"}


def written_by(path: str) -> str | None:
    """``"run"`` or ``"generate"`` for a store batchlu wrote at ``path``; None for anything else."""
    if not is_zarr_store(path):
        return None
    try:
        attrs = dict(zarr.open(store=_object_store.zarr_store(path, read_only=True), mode="r").attrs)
    except Exception as exc:   # unreadable metadata: no writer batchlu knows; a failing store says so
        failed = _object_store.store_error(exc, path)
        if failed is not None:
            raise failed from None
        return None
    for key, writer in WRITERS.items():
        if isinstance(attrs.get(key), dict):
            return writer
    return None


def check_replaceable(path: str, *, writer: str, force: bool) -> None:
    """Before ``overwrite`` deletes ``path``: refuse a Zarr store that ``batchlu <writer>`` did not
    write, unless ``force`` (a user's own array is never deleted without a word)."""
    if force or not (occupied(path) if is_url(path) else os.path.exists(path)) or not is_zarr_store(path):
        return  # nothing there, an empty folder, or no Zarr store (that one is refused later)
    found = written_by(path)
    if found == writer:
        return
    got = f"the output of batchlu {found}" if found else "a Zarr store that batchlu did not write"
    raise OutputError(f"Expected {path} to be written by batchlu {writer} before overwrite replaces it. "
                      f"Got {got} instead; pass force=True (--force) with overwrite to delete it anyway.")


def remove(path: str) -> None:
    """Delete an existing output for ``overwrite``; only Zarr stores and empty folders."""
    if is_url(path) and is_zarr_store(path):
        _object_store.delete_tree(path)
    elif is_empty_folder(path):
        os.rmdir(path)
    elif is_zarr_store(path):
        shutil.rmtree(path)
    else:
        raise OutputError(f"Expected the output {path} to be a Zarr store before overwriting it. "
                          f"Got a directory with other files instead; refusing to delete it.")


def discard(path: str) -> None:
    """Delete, whatever it holds, the output a run created and then wrote nothing into (no task was
    submitted); errors are ignored."""
    if is_url(path):
        try:
            _object_store.delete_tree(path)
        except Exception:
            pass
    else:
        shutil.rmtree(path, ignore_errors=True)


IOV_MAX = 1024   # buffers one writev or preadv call may take (Linux's limit)


_MODE = None


def file_mode() -> int:
    """The mode zarr's own writes give a new file: 0666 less the process's umask (read once, from
    ``/proc/self/status`` where there is one; else set and restored at once). :func:`write_file` gives it
    to its files (its temporary files are made 0600)."""
    global _MODE
    if _MODE is None:
        mask = None
        try:
            with open("/proc/self/status") as f:
                mask = next((int(line.split()[1], 8) for line in f if line.startswith("Umask:")), None)
        except OSError:
            pass
        if mask is None:
            mask = os.umask(0o022)
            os.umask(mask)
        _MODE = 0o666 & ~mask
    return _MODE


def write_file(path: str, parts) -> None:
    """Write ``parts`` (bytes-like) to ``path`` through a temporary file renamed into place, with as
    few system calls as the parts allow (``writev`` of up to :data:`IOV_MAX` parts each; the GIL is
    let go during each)."""
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".batchlu-", dir=folder)
    try:
        try:
            os.fchmod(fd, file_mode())   # mkstemp's 0600 -> the mode zarr's own writes give
            views = [v for v in (memoryview(p).cast("B") for p in parts) if v.nbytes]
            i = 0
            while i < len(views):
                done = os.writev(fd, views[i:i + IOV_MAX])
                while i < len(views) and done >= views[i].nbytes:
                    done -= views[i].nbytes
                    i += 1
                if done:   # a short write inside part i: go on from there
                    views[i] = views[i][done:]
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
