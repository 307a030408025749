"""The output group: create it with its provenance, reopen it for resume (refusing a different
input or op), and move its status from "running" to "complete" (or "failed") in the group attrs.

The group attributes hold one ``batchlu`` entry: the provenance and the status. The status says
"complete" only once every chunk is recorded in the ledger and the run has ended.
"""

from __future__ import annotations

import datetime
import os
import warnings

import numpy as np
import zarr

from .._ops import OutputSpec
from .._plan import Plan
from ..codecs._frames import faults
from ..config._choices import OUTPUT_CHECKSUMS
from ..config._settings import Options
from ..errors import BatchluWarning, ConfigError, OutputError, ResumeError
from ..store._arrays import stored_key
from ..store import _object_store
from ..store._files import is_zarr_store, occupied, refuse_occupied, remove
from ..store._object_store import is_url, join, zarr_store
from ..store._layout import describe
from . import _ledger

ATTR = "batchlu"
FORMAT = 1


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def version() -> str:
    try:
        from importlib.metadata import version as _version

        return _version("batchlu")
    except Exception:
        return "0+unknown"


def read_provenance(path: str) -> dict | None:
    """The ``batchlu`` attrs of the group at ``path``, or None if it is not a batchlu output."""
    if not is_zarr_store(path):
        return None
    try:
        node = zarr.open(store=zarr_store(path, read_only=True), mode="r")
    except Exception as exc:   # not a group, unreadable metadata: no provenance; a failing store says so
        failed = _object_store.store_error(exc, path)
        if failed is not None:
            raise failed from None
        return None
    if not isinstance(node, zarr.Group):
        return None
    record = node.attrs.get(ATTR)
    return dict(record) if isinstance(record, dict) else None


def check_existing(path: str, *, resume: bool, overwrite: bool) -> dict | None:
    """Decide what to do with whatever is at ``path``; return the recorded provenance to resume."""
    if resume and overwrite:
        raise OutputError("Expected at most one of resume and overwrite. Got both instead.")
    if not occupied(path):
        return None
    if overwrite:
        remove(path)
        return None
    if not resume:
        refuse_occupied(path, "pass resume (--resume) to finish an interrupted run or overwrite (--overwrite) "
                              "to replace it", name=f"the output {path}")
    record = read_provenance(path)
    if record is None:
        raise ResumeError(f"Expected the output {path} to be a batchlu output to resume. Got a path "
                          f"without batchlu provenance instead; use overwrite (--overwrite).")
    return record


def check_resume(record: dict, provenance: dict) -> None:
    """Refuse resume when the input, right-hand side, op or their shapes differ from the record."""
    def same(key, sub=None):
        a, b = record.get(key), provenance.get(key)
        if sub and isinstance(a, dict) and isinstance(b, dict):
            return all(a.get(s) == b.get(s) for s in sub)
        return a == b

    fields = ("path", "array", "shape", "dtype")
    for key, sub in (("op", None), ("input", fields), ("rhs", fields)):
        if not same(key, sub):
            def show(value):
                if isinstance(value, dict):
                    array = f":{value['array']}" if value.get("array") else ""
                    return f"{value.get('path')}{array} {tuple(value.get('shape', ()))} {value.get('dtype')}"
                return repr(value)
            raise ResumeError(f"Expected {key} {show(provenance.get(key))} to match the one recorded "
                              f"in the output for resume. Got {show(record.get(key))} recorded "
                              f"instead; use overwrite (--overwrite) to start again.")


def create(path: str, provenance: dict, specs: list[OutputSpec], plan: Plan,
           codec: str, layout: str, *, checksum: str | None = None) -> zarr.Group:
    """A fresh output group: provenance first (status "running"), then the arrays (compressed with
    ``codec``, the ``output-codec`` setting, in ``layout``, with the ``output-checksum`` ``checksum``:
    None, the shipped default), then the ledger."""
    group = zarr.open_group(store=zarr_store(path), mode="w-", zarr_format=3, attributes={ATTR: provenance})
    ensure_arrays(group, specs, plan, codec, layout, checksum=checksum)
    return group


def created_with(record: dict) -> tuple[str, str, str]:
    """The codec, the layout and the checksum of the output whose provenance is ``record``, as the run
    that created it recorded them among its settings: ``output_codec`` (``output_compressor`` in an
    output of a batchlu from before the setting's rename; neither: zstd, that batchlu's one codec),
    ``output_layout`` (none: ``chunks``, the one layout of the batchlu that recorded none) and
    ``output_checksum`` (none: ``none``, the batchlu that recorded none wrote no checksum)."""
    settings = record.get("settings") or {}
    codec = settings.get("output_codec", settings.get("output_compressor", "zstd"))
    return codec, settings.get("output_layout", "chunks"), settings.get("output_checksum", "none")


INNER_BYTES = 256 << 10   # sharded outputs: inner chunks of about this many bytes (nvCOMP's sweet spot)


def inner_chunk(chunk: int, matrix_bytes: int, target: int = INNER_BYTES) -> int:
    """Matrices per inner chunk of a shard of ``chunk`` matrices: the largest divisor of ``chunk``
    whose chunk takes at most ``target`` bytes (at least one matrix)."""
    best = 1
    for d in range(1, chunk + 1):
        if chunk % d == 0 and d * matrix_bytes <= target:
            best = d
    return best


def chunk_shape(matrices: int, tail: tuple) -> tuple:
    """The chunk (or shard) shape of ``matrices`` matrices of shape ``tail``: at least 1 along each
    axis, since zarr-python >= 3.2 refuses a chunk of 0 along an empty axis (n = 0)."""
    return (matrices,) + tuple(max(1, int(t)) for t in tail)


def grid(layout: str, chunk: int, tail: tuple, matrix_bytes: int) -> dict:
    """zarr's ``chunks=`` (and ``shards=``) for an array of matrices of shape ``tail`` stored in
    ``layout`` (``batchlu.output-layout``, ``batchlu generate --layout``): ``chunks``, one chunk of
    ``chunk`` matrices; ``sharded``, one shard of them in inner chunks of about :data:`INNER_BYTES`
    (:func:`inner_chunk` of ``matrix_bytes`` each: what nvCOMP decodes fastest)."""
    if layout == "sharded":
        return {"chunks": chunk_shape(inner_chunk(chunk, matrix_bytes), tail), "shards": chunk_shape(chunk, tail)}
    return {"chunks": chunk_shape(chunk, tail)}


def ensure_arrays(group: zarr.Group, specs: list[OutputSpec], plan: Plan, codec: str,
                  layout: str, *, checksum: str | None = None) -> None:
    """Create whichever output arrays (and the ledger) are missing, e.g. after a kill during creation;
    ``codec``, ``layout`` and ``checksum`` are the settings of the run that created the output
    (:func:`created_with`; ``checksum`` None: the shipped default)."""
    if checksum is None:
        checksum = Options().output_checksum
    count, chunk = plan.count, plan.chunk
    for spec in specs:
        if spec.name in group:
            array = group[spec.name]
            if tuple(array.shape) != (count,) + spec.tail or (array.shards or array.chunks)[0] != chunk:
                raise ResumeError(f"Expected the output array {spec.name} to have shape "
                                  f"{(count,) + spec.tail} and chunks of {chunk} along N. Got shape "
                                  f"{array.shape}, chunks {array.chunks} instead.")
            continue
        matrix_bytes = int(np.prod(spec.tail, dtype=np.int64)) * np.dtype(spec.dtype).itemsize
        group.create_array(spec.name, shape=(count,) + spec.tail, dtype=spec.dtype, fill_value=spec.fill,
                           compressors=compressors(codec, checksum, spec.dtype),
                           config={"write_empty_chunks": True},
                           **grid(layout, chunk, spec.tail, matrix_bytes))
    if not _ledger.exists(group):
        _ledger.create(group, plan.n_chunks)
    elif _ledger.DIGESTS not in group:  # an older batchlu's output, with no chunk complete (resume checked)
        _ledger.create_digests(group, plan.n_chunks)


def check_stored(path: str, group: zarr.Group, specs: list[OutputSpec], plan: Plan, complete) -> list:
    """Before resume trusts the ledger ``complete`` (None: no ledger yet): each output array has the
    shape, dtype and chunks of the plan, and each chunk recorded complete is stored in every array.
    A missing array is made again (by :func:`ensure_arrays`) only while no chunk is complete.

    Returns the chunks recorded complete whose stored bytes fail their CRC-32C in some array (one
    with zarr's crc32c codec, ``batchlu.output-checksum``; an output without it cannot be checked so),
    as ``(chunk, why)`` in order: :func:`redo` has them computed again. Each such chunk file is read
    once; none is decoded. On object storage the stored chunks are listed (one request per 1,000)
    and not read again: an object is written whole or not at all."""
    damaged: dict[int, str] = {}
    done = np.flatnonzero(np.asarray(complete, bool)) if complete is not None else np.zeros(0, np.int64)
    hint = "use overwrite (--overwrite) to start again."
    if complete is not None and np.size(complete) != plan.n_chunks:
        raise ResumeError(f"Expected {plan.n_chunks:,} completion records in {path}, one per chunk of "
                          f"{plan.chunk:,} matrices. Got {np.size(complete):,} instead; {hint}")
    for spec in specs:
        node = group.get(spec.name)
        if node is None:
            if done.size:
                raise ResumeError(f"Expected the output array {spec.name} in {path}, where {done.size:,} "
                                  f"of {plan.n_chunks:,} chunks are recorded complete. Got no such array "
                                  f"instead; {hint}")
            continue
        want = ((plan.count,) + spec.tail, np.dtype(spec.dtype), chunk_shape(plan.chunk, spec.tail))
        got = ((tuple(node.shape), np.dtype(node.dtype), tuple(node.shards or node.chunks))
               if isinstance(node, zarr.Array) else None)
        if got != want:
            found = (f"shape {got[0]}, dtype {got[1]}, chunks {got[2]}" if got else "a group")
            raise ResumeError(f"Expected the output array {spec.name} in {path} to have shape {want[0]}, "
                              f"dtype {want[1]} and chunks {want[2]}, as recorded. Got {found} instead; "
                              f"{hint}")
        if 0 in spec.tail:   # n = 0: an empty array stores no chunk files
            continue
        files = {int(c): join(path, spec.name, stored_key(node, int(c))) for c in done}
        if is_url(path):
            there = _object_store.listing(join(path, spec.name)) if done.size else {}
            missing = [c for c in files if stored_key(node, c) not in there]
        else:
            missing = [c for c, file in files.items() if not os.path.isfile(file)]
        if missing:
            lo, hi = plan.chunk_range(missing[0], missing[0] + 1)
            raise ResumeError(f"Expected every chunk recorded complete in {path} to be stored. Got "
                              f"{len(missing):,} of {done.size:,} missing from {spec.name} instead (first: "
                              f"{files[missing[0]]}, matrices {lo}:{hi}); {hint}")
        stored, _ = describe(node)
        if stored is not None:
            for c, why in faults(stored, done).items():
                damaged.setdefault(c, f"{files[c]} {why}")
    return sorted(damaged.items())


def redo(path: str, plan: Plan, damaged: list) -> None:
    """Say which chunks recorded complete fail their CRC-32C (``damaged``, from :func:`check_stored`)
    in one ``BatchluWarning`` line, and take their completion records back, so that the resume
    computes them again (their outputs are written whole again, then recorded)."""
    first, why = damaged[0]
    lo, hi = plan.chunk_range(first, first + 1)
    many = len(damaged) > 1
    warnings.warn(f"{len(damaged):,} chunk{'s' if many else ''} recorded complete in {path} "
                  f"{'fail their' if many else 'fails its'} CRC-32C (first: {why}, matrices {lo}:{hi}); "
                  f"the resume computes {'them' if many else 'it'} again.", BatchluWarning, stacklevel=3)
    _ledger.unrecord(path, [c for c, _ in damaged])


def compressors(setting: str, checksum: str = "none", dtype=None):
    """The codecs (zarr's ``compressors=``) of an output array of ``dtype`` for the ``output-codec``
    setting: ``zstd`` (zarr's default), ``zstd:LEVEL``, ``lz4`` (numcodecs' LZ4, which zarr-python
    reads), ``none``, or ``auto``: none for floating-point arrays (LU factors, inverses, solutions,
    log-determinants: their mantissas are noise, zstd shrinks them by a few per cent at a cost larger
    than the rest of a CPU run, and the GPU's host codec path moves 1.4x as much uncompressed), zstd
    for the others (info, pivots, signs: small integers); then zarr's crc32c codec where the
    ``output-checksum`` setting ``checksum`` is ``crc32c``, so that a reader notices a damaged chunk."""
    setting, checksum = str(setting), str(checksum)
    if setting == "auto":
        if dtype is None:
            raise ConfigError("batchlu.output-codec auto needs the output array's dtype")
        setting = "none" if np.dtype(dtype).kind in "fc" else "zstd"
    if checksum not in OUTPUT_CHECKSUMS:
        raise ConfigError(f"Expected batchlu.output-checksum in {', '.join(OUTPUT_CHECKSUMS)}. Got {checksum!r} instead.")
    name, _, level = setting.partition(":")
    if name == "none":
        compressor = None
    elif name == "lz4":
        with warnings.catch_warnings():   # numcodecs' codecs are "not in the v3 spec": zarr-python reads them
            warnings.simplefilter("ignore")
            from zarr.codecs.numcodecs import LZ4

            compressor = LZ4()
    else:
        compressor = zarr.codecs.ZstdCodec(level=int(level) if level else 0)
    if checksum == "none":
        return compressor
    return ([] if compressor is None else [compressor]) + [zarr.codecs.Crc32cCodec()]


def update(path: str, **changes) -> dict:
    """Rewrite the ``batchlu`` attrs with ``changes`` (one atomic metadata write)."""
    group = zarr.open_group(store=zarr_store(path), mode="r+")
    record = dict(group.attrs.get(ATTR, {}))
    record.update(changes)
    group.attrs[ATTR] = record
    return record


def clean_partials(path: str) -> None:
    """Remove temporary files a killed writer left behind (zarr writes ``*.partial`` then renames);
    object storage has none (an object is written whole or not at all)."""
    if is_url(path):
        return
    for root, _, files in os.walk(path):
        for name in files:
            if name.endswith(".partial"):
                try:
                    os.remove(os.path.join(root, name))
                except OSError:
                    pass
