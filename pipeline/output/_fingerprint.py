"""What identifies the input a run computed from, so that ``--resume`` and the end of a run refuse
an input changed since it was read.

Two records:

* **Per output chunk, the XXH3-64 of the values it was computed from** (:func:`digest`: the
  matrices, then the right-hand sides, as decoded, and which of them were missing from the store),
  taken by the task on the batch it has just read, in the worker, whether zarr decoded it there, in
  an I/O process or on the GPU (``kernels/cuda/xxh3.cu``, the same values), and kept in the ledger
  (:data:`batchlu.pipeline.output._ledger.DIGESTS`) just before the chunk is recorded complete.
* **Per run, a signature of the input's files** (:func:`signature`), taken by the client when the
  run starts and again before it reports complete: a difference fails the run. A file's entry is its
  name, size, inode, mtime and ctime; a file written within :data:`FRESH_SECONDS` of the first
  signature (when a later write could keep its times) is entered by the XXH3-128 of its bytes. On
  object storage (an ``s3://`` input) an object's entry is its key, size and ETag (one listing
  request per 1,000 objects): the server gives every write a new ETag, so no time is trusted.

``--resume`` does not trust the times: a write through a shared memory map to a page that is already
dirty changes no time at all. It reads the input of every completed chunk again and compares its
digest with the recorded one (:func:`compare_content`); any difference refuses the resume.
"""

from __future__ import annotations

import hashlib
import os
import stat
import struct
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import xxhash

from ..errors import InputChangedError, ResumeError
from ..store import _missing, _object_store
from ..store._arrays import ArrayRef, read_range
from . import _ledger

FRESH_SECONDS = 5.0  # a file written this recently may be written again with the same times
READ_BYTES = 8 << 20  # a file's bytes are hashed in pieces of this many (the GIL released on each)
MISSING_TAG = b"batchlu missing\0"


def digest(a, b=None, missing=None) -> int:
    """XXH3-64 of the values of ``a`` (C order, native byte order); with ``b``, of the two values'
    XXH3-64 (little-endian, ``a`` first); with ``missing`` (one bool per matrix) holding a True,
    of that value, :data:`MISSING_TAG` and the mask's bits, so that a matrix read as the fill value
    of a missing chunk never has the digest of a stored matrix of the same values."""
    value = _xxh3_64(a)
    if b is not None:
        value = pair(value, _xxh3_64(b))
    return fold_missing(value, missing)


def pair(a: int, b: int) -> int:
    """The digest of a chunk's matrices and right-hand sides from their XXH3-64 ``a`` and ``b``."""
    return _xxh3_64(struct.pack("<QQ", int(a), int(b)))


def fold_missing(value: int, missing) -> int:
    """``value`` (the digest of a chunk's values) with the chunk's mask of missing matrices folded
    in, where it holds a True (else ``value``)."""
    if missing is None or not np.any(missing):
        return int(value)
    bits = np.packbits(np.asarray(missing, bool), bitorder="little").tobytes()
    return _xxh3_64(struct.pack("<Q", int(value)) + MISSING_TAG + bits)


def _xxh3_64(x) -> int:
    h = xxhash.xxh3_64()
    h.update(_contiguous(x))  # the hasher's update releases the GIL (the one-shot call may not)
    return h.intdigest()


def _contiguous(x):
    if isinstance(x, (bytes, bytearray, memoryview)):
        return x
    x = np.asarray(x)
    if not x.dtype.isnative:
        x = x.astype(x.dtype.newbyteorder("="))
    return np.ascontiguousarray(x)


def chunk_digests(chunk: int, start: int, stop: int, a, b=None, missing=None) -> np.ndarray:
    """One :func:`digest` per output chunk of a batch: ``a`` (and ``b``) hold matrices ``[start,
    stop)``, whole chunks of ``chunk`` matrices from chunk ``start // chunk`` on; ``missing`` (None,
    or one bool per matrix) marks those read as the fill value of a missing chunk."""
    m = stop - start
    out = np.empty(-(-m // chunk), np.uint64)
    for i, lo in enumerate(range(0, m, chunk)):
        hi = min(lo + chunk, m)
        out[i] = digest(a[lo:hi], None if b is None else b[lo:hi], None if missing is None else missing[lo:hi])
    return out


def fold_chunks(chunk: int, values, missing) -> np.ndarray:
    """:func:`fold_missing` on each of ``values`` (a digest per output chunk of a batch) with its
    chunk's part of ``missing`` (one bool per matrix of the batch, or None)."""
    values = np.asarray(values, np.uint64)
    if missing is None:
        return values
    return np.array([fold_missing(int(v), missing[i * chunk:(i + 1) * chunk]) for i, v in enumerate(values)],
                    np.uint64)


# ------------------------------------------------------------------------------------ file signature
def _root(ref: ArrayRef) -> str:
    return ref.location()


def _files(root: str) -> list[tuple[str, os.stat_result]]:
    """Every file of the folder ``root``, through symbolic links to files and folders (each folder
    once), with its ``stat``."""
    found = []
    seen = set()
    for folder, folders, files in os.walk(root, followlinks=True):
        try:
            st = os.stat(folder)
        except OSError:
            folders[:] = []
            continue
        if (st.st_dev, st.st_ino) in seen:  # a link back to a folder already walked
            folders[:] = []
            continue
        seen.add((st.st_dev, st.st_ino))
        for name in files:
            path = os.path.join(folder, name)
            try:
                st = os.stat(path)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):   # not a named pipe (opening one waits for a writer, forever),
                found.append((path, st))   # a socket or a device; a chunk there reads as corrupt
    return found


def file_digest(path: str) -> str:
    """XXH3-128 of the bytes of the file ``path``, read in pieces of :data:`READ_BYTES`."""
    h = xxhash.xxh3_128()
    with open(path, "rb", buffering=0) as f:
        while True:
            piece = f.read(READ_BYTES)
            if not piece:
                break
            h.update(piece)
    return h.hexdigest()


def _threads() -> int:
    return max(1, min(8, os.cpu_count() or 1))


def signature(ref: ArrayRef | None, horizon: int | None = None) -> dict | None:
    """The signature of the files of the array ``ref``: ``{"files", "digest", "horizon"}``. A file
    whose mtime or ctime is after ``horizon`` (ns since the epoch; default now less
    :data:`FRESH_SECONDS`) is entered by its name, size and :func:`file_digest`, the others by name,
    size, inode, mtime and ctime. Taken again with the recorded ``horizon``, an unchanged file is
    entered the same way, so the two digests are equal exactly when no file differs."""
    if ref is None:
        return None
    root = _root(ref)
    if horizon is None:
        horizon = time.time_ns() - int(FRESH_SECONDS * 1e9)
    if _object_store.is_url(root):
        objects = _object_store.listing(root)
        return _signed([f"{name}\0{size}\0etag {etag}" for name, (size, etag) in objects.items()], horizon)
    files = _files(root)
    fresh = [path for path, st in files if max(st.st_mtime_ns, st.st_ctime_ns) > horizon]
    contents = {}
    if fresh:   # xxhash lets the GIL go while it hashes: the files are read and hashed side by side
        with ThreadPoolExecutor(min(_threads(), len(fresh))) as pool:
            contents = dict(zip(fresh, pool.map(file_digest, fresh)))
    entries = []
    for path, st in files:
        name = os.path.relpath(path, root)
        if path in contents:
            entries.append(f"{name}\0{st.st_size}\0xxh3-128 {contents[path]}")
        else:
            entries.append(f"{name}\0{st.st_size}\0{st.st_ino}\0{st.st_mtime_ns}\0{st.st_ctime_ns}")
    return _signed(entries, horizon)


def _signed(entries: list[str], horizon: int) -> dict:
    h = hashlib.blake2b(digest_size=16)
    for entry in sorted(entries):
        h.update(entry.encode("utf-8", "surrogateescape") + b"\n")
    return {"files": len(entries), "digest": h.hexdigest(), "horizon": int(horizon)}


def signatures(matrices: ArrayRef, rhs: ArrayRef | None) -> dict:
    """What the provenance records as ``input_files``."""
    return {"input": signature(matrices), "rhs": signature(rhs)}


def check_same_files(before: dict, matrices: ArrayRef, rhs: ArrayRef | None) -> None:
    """At the end of a run: raise :class:`InputChangedError` if a file of the input (or of the
    right-hand side) differs from the signature ``before`` taken when the run started."""
    for key, ref, what in (("input", matrices, "input"), ("rhs", rhs, "right-hand side")):
        was = (before or {}).get(key)
        if ref is None or was is None:
            continue
        now = signature(ref, was["horizon"])
        if now["digest"] != was["digest"]:
            raise InputChangedError(
                f"Expected the {what} {ref} to be the one the run read. Got files that changed during "
                f"the run instead ({was['files']:,} files when it started, {now['files']:,} now, "
                f"written or replaced since): the results may mix old and new values; use overwrite "
                f"(--overwrite) to start again.")


# ---------------------------------------------------------------------------------------- the check
def check_unchanged(out_path: str, record: dict, plan, complete, matrices: ArrayRef,
                    rhs: ArrayRef | None, memory_budget: int) -> bool:
    """Refuse to resume ``out_path`` if the values its completed chunks were computed from are not the
    ones in ``matrices`` (and ``rhs``) now. ``record`` is the output's provenance, ``complete`` the
    ledger. Returns whether the input of the completed chunks was read again (False: none complete)."""
    if complete is None or not np.any(complete):
        return False
    if not _ledger.has_digests(out_path):
        older = " (CRC-32)" if _ledger.has_older_digests(out_path) else ""
        raise ResumeError(f"Expected checksums of the input (XXH3-64) recorded in {out_path} for resume. "
                          f"Got an output without them{older} (batchlu {record.get('version')}) instead; "
                          f"use overwrite (--overwrite) to start again.")
    compare_content(out_path, plan, complete, matrices, rhs, memory_budget)
    return True


def _missing_rows(arrays, start: int, stop: int) -> np.ndarray | None:
    """The mask of matrices ``[start, stop)`` held by chunks missing from any of ``arrays`` (None:
    none), as a task of ``missing-chunks: fill`` marks them."""
    rows = None
    for array in arrays:
        mask = _missing.judge(_missing.find(array, start, stop), "", start, stop, "fill")
        if mask is not None:
            rows = mask if rows is None else rows | mask
    return rows


def compare_content(out_path: str, plan, complete, matrices: ArrayRef, rhs: ArrayRef | None,
                    memory_budget: int) -> None:
    """Read the input of every completed chunk again and compare its digest with the recorded one."""
    a = matrices.open()
    b = rhs.open() if rhs is not None else None
    per_matrix = a.dtype.itemsize * int(np.prod(a.shape[1:], dtype=np.int64))
    if b is not None:
        per_matrix += b.dtype.itemsize * int(np.prod(b.shape[1:], dtype=np.int64))
    per_read = max(1, int(memory_budget) // max(1, per_matrix * plan.chunk))  # chunks per read
    done = np.flatnonzero(np.asarray(complete, bool))
    recorded = np.zeros(plan.n_chunks, np.uint64)
    recorded[done] = _ledger.read_digests(out_path, done)
    edges = np.flatnonzero(np.diff(done) != 1) + 1
    for span in np.split(done, edges):
        for c0 in range(int(span[0]), int(span[-1]) + 1, per_read):
            c1 = min(c0 + per_read, int(span[-1]) + 1)
            lo, hi = plan.chunk_range(c0, c1)
            x = read_range(matrices, a, lo, hi)
            y = read_range(rhs, b, lo, hi) if b is not None else None
            gaps = _missing_rows([v for v in (a, b) if v is not None], lo, hi)
            bad = np.flatnonzero(chunk_digests(plan.chunk, lo, hi, x, y, gaps) != recorded[c0:c1])
            if bad.size:
                m0, m1 = plan.chunk_range(c0 + int(bad[0]), c0 + int(bad[0]) + 1)
                what = f"the input {matrices}" + (f" or the right-hand side {rhs}" if rhs else "")
                raise ResumeError(
                    f"Expected {what} to hold the values the {done.size:,} completed chunks of "
                    f"{out_path} were computed from. Got other values in matrices {m0}:{m1} instead: "
                    f"it changed since the run started; use overwrite (--overwrite) to start again.")
