"""What identifies the input a run computed from, so that ``--resume`` refuses an input changed since.

Two records:

* **Per output chunk, the CRC-32 of the values it was computed from** (the matrices, then the
  right-hand sides, as decoded), taken by the task on the batch it has just read, in the worker,
  whether zarr decoded it there or in an I/O process, and kept in the ledger
  (:data:`batchlu.pipeline._ledger.DIGESTS`) just before the chunk is recorded complete.
* **Per run, a signature of the input's files**: a digest of the name, size, inode, mtime and ctime
  of every file of the input array (and of the right-hand side), taken by the client when the run
  starts and kept in the output's provenance. Rewriting a file changes its mtime and ctime (no user
  tool can set a ctime back), and zarr writes each chunk as a new file (a new inode).

On resume, if the signature is the one recorded, no file of the input was written since the run
started, so the completed chunks were computed from the values there now, and nothing is read.
Otherwise (files rewritten, touched, copied back, or too fresh when the run started for their times
to tell a later write apart, :data:`FRESH_SECONDS`), the client reads the input of every completed
chunk again and compares its CRC-32 with the recorded one: any difference refuses the resume.
"""

from __future__ import annotations

import hashlib
import os
import time

import numpy as np

from . import _ledger
from ._crc32 import crc32
from ._store import ArrayRef, read_range
from .errors import ResumeError

FRESH_SECONDS = 5.0  # a file written this recently may be written again with the same times


def digest(a, b=None) -> int:
    """CRC-32 of the values of ``a`` (then ``b``): C order, native byte order."""
    crc = crc32(_contiguous(a))
    return crc if b is None else crc32(_contiguous(b), crc)


def _contiguous(x) -> np.ndarray:
    x = np.asarray(x)
    if not x.dtype.isnative:
        x = x.astype(x.dtype.newbyteorder("="))
    return np.ascontiguousarray(x)


def chunk_digests(chunk: int, start: int, stop: int, a, b=None) -> np.ndarray:
    """One CRC-32 per output chunk of a batch: ``a`` (and ``b``) hold matrices ``[start, stop)``,
    whole chunks of ``chunk`` matrices from chunk ``start // chunk`` on."""
    m = stop - start
    out = np.empty(-(-m // chunk), np.uint32)
    for i, lo in enumerate(range(0, m, chunk)):
        hi = min(lo + chunk, m)
        out[i] = digest(a[lo:hi], None if b is None else b[lo:hi])
    return out


# ------------------------------------------------------------------------------------ file signature
def signature(ref: ArrayRef | None) -> str | None:
    """A digest of (name, size, inode, mtime, ctime) of every file of the array ``ref``, through
    symbolic links to files and folders (each folder once); None when a file was written within
    :data:`FRESH_SECONDS` (its times could not show a write to come)."""
    if ref is None:
        return None
    root = os.path.join(ref.path, ref.array) if ref.array else ref.path
    horizon = time.time_ns() - int(FRESH_SECONDS * 1e9)
    entries = []
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
            if max(st.st_mtime_ns, st.st_ctime_ns) > horizon:
                return None
            entries.append(f"{os.path.relpath(path, root)}\0{st.st_size}\0{st.st_ino}\0"
                           f"{st.st_mtime_ns}\0{st.st_ctime_ns}")
    h = hashlib.blake2b(digest_size=16)
    for entry in sorted(entries):
        h.update(entry.encode("utf-8", "surrogateescape") + b"\n")
    return f"{len(entries)}:{h.hexdigest()}"


def signatures(matrices: ArrayRef, rhs: ArrayRef | None) -> dict:
    """What the provenance records as ``input_files``."""
    return {"input": signature(matrices), "rhs": signature(rhs)}


# ---------------------------------------------------------------------------------------- the check
def check_unchanged(out_path: str, record: dict, now: dict, plan, complete, matrices: ArrayRef,
                    rhs: ArrayRef | None, memory_budget: int) -> bool:
    """Refuse to resume ``out_path`` if the values its completed chunks were computed from are not the
    ones in ``matrices`` (and ``rhs``) now. ``record`` is the output's provenance, ``now`` the
    signatures of the input files now (:func:`signatures`), ``complete`` the ledger. Returns whether
    the input of the completed chunks was read again (False: no chunk complete, or the signatures
    are the recorded ones)."""
    if complete is None or not np.any(complete):
        return False
    if not _ledger.has_digests(out_path) or "input_files" not in record:
        raise ResumeError(f"Expected checksums of the input recorded in {out_path} for resume. Got an "
                          f"output without them (batchlu {record.get('version')}) instead; use "
                          f"overwrite (--overwrite) to start again.")
    before = record.get("input_files") or {}
    if now.get("input") is not None and before.get("input") == now["input"] and \
            (rhs is None or (now.get("rhs") is not None and before.get("rhs") == now["rhs"])):
        return False  # no file written since the run started
    compare_content(out_path, plan, complete, matrices, rhs, memory_budget)
    return True


def compare_content(out_path: str, plan, complete, matrices: ArrayRef, rhs: ArrayRef | None,
                    memory_budget: int) -> None:
    """Read the input of every completed chunk again and compare its CRC-32 with the recorded one."""
    a = matrices.open()
    b = rhs.open() if rhs is not None else None
    per_matrix = a.dtype.itemsize * int(np.prod(a.shape[1:], dtype=np.int64))
    if b is not None:
        per_matrix += b.dtype.itemsize * int(np.prod(b.shape[1:], dtype=np.int64))
    per_read = max(1, int(memory_budget) // max(1, per_matrix * plan.chunk))  # chunks per read
    done = np.flatnonzero(np.asarray(complete, bool))
    recorded = np.zeros(plan.n_chunks, np.uint32)
    recorded[done] = _ledger.read_digests(out_path, done)
    edges = np.flatnonzero(np.diff(done) != 1) + 1
    for span in np.split(done, edges):
        for c0 in range(int(span[0]), int(span[-1]) + 1, per_read):
            c1 = min(c0 + per_read, int(span[-1]) + 1)
            lo, hi = plan.chunk_range(c0, c1)
            x = read_range(matrices, a, lo, hi)
            y = read_range(rhs, b, lo, hi) if b is not None else None
            bad = np.flatnonzero(chunk_digests(plan.chunk, lo, hi, x, y) != recorded[c0:c1])
            if bad.size:
                m0, m1 = plan.chunk_range(c0 + int(bad[0]), c0 + int(bad[0]) + 1)
                what = f"the input {matrices}" + (f" or the right-hand side {rhs}" if rhs else "")
                raise ResumeError(
                    f"Expected {what} to hold the values the {done.size:,} completed chunks of "
                    f"{out_path} were computed from. Got other values in matrices {m0}:{m1} instead: "
                    f"it changed since the run started; use overwrite (--overwrite) to start again.")
