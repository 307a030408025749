"""Where each array's chunks are decoded and encoded, and the bytes of its stored chunks.

The GPU codec path (``batchlu.codec-device``) moves the stored bytes of each chunk to the GPU and
decodes them there with nvCOMP (:mod:`batchlu.pipeline._gpu_codecs`); outputs are encoded there and
their frames written as chunk files. This module is the host half, with no CUDA in it:

* :func:`choose` decides per array, in the client: the GPU where the codec, the byte order, the
  chunking and the store allow it (and the workers have nvCOMP), else the host path, with the reason,
  which the run's report prints.
* :class:`Stored` is what a worker needs to find an array's chunk files and their frames: the folder,
  the chunk key encoding, the chunk (or shard and inner chunk) length along N, and how a chunk's
  bytes wrap the codec's frame (:class:`Frames`: numcodecs' LZ4 size header, zarr's crc32c trailer).
* :func:`plan_reads` / :func:`read_frames` read a batch's frames into one host buffer (from chunk
  files, or from shards through their index); :func:`write_chunks` writes encoded frames back as chunk
  files or whole shards (index and its CRC-32C included) that plain zarr-python reads; where the
  array has zarr's crc32c codec (batchlu's outputs by default, ``batchlu.output-checksum``), each
  chunk's CRC-32C trailer is computed here, on the host.
* :func:`faults` checks the CRC-32C trailers of stored chunk files and shards without decoding them
  (what ``--resume`` does to the chunks it trusts).

Only local folders (zarr's ``LocalStore``) take this path: the files are read and written directly.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import warnings

import numpy as np

from . import _nvcomp
from .errors import ConfigError, FrameError


__all__ = ["CODEC_DEVICES", "Choice", "Frames", "OUTPUT_CHECKSUMS", "OUTPUT_CODECS", "Read", "Stored", "choose",
           "crc32c", "describe", "faults", "plan_reads", "read_frames", "write_chunks", "write_file",
           "zarr_compressors"]

CODEC_DEVICES = ("auto", "gpu", "cpu")
OUTPUT_CODECS = ("zstd", "lz4", "none")
OUTPUT_CHECKSUMS = ("crc32c", "none")   # batchlu.output-checksum: zarr's crc32c codec after the compressor
# Codecs whose standard frames nvCOMP decodes bit-exactly (checked on the GPU by tests/pipeline/test_gpu_codecs.py)
GPU_ALGORITHMS = ("zstd", "lz4")
ALIGN = 16   # bytes: nvCOMP's strictest alignment of a frame in a batch
# ``auto`` encodes on the GPU only frames at most this large, and decodes larger ones there only where
# they are barely compressed: nvCOMP spreads a batch over its frames, one thread block each, so a batch
# of a few large compressed frames decodes and encodes slower on the GPU than on the host
# (docs/performance.md, "GPU codecs")
AUTO_FRAME_BYTES = 4 << 20
# a group of large frames whose stored bytes are under this fraction of their decoded bytes counts as
# compressed (zstd stores the blocks of random data raw: ratio 1.04; nvCOMP copies those at tens of GB/s)
COMPRESSED = 0.9
EMPTY = 2**64 - 1   # a shard index entry of a chunk that is not stored
IOV_MAX = 1024      # buffers one preadv call may take (Linux's limit)


def _crc32c_extend():
    """``extend(crc, data)`` of the CRC-32C library at hand: the ``crc32c`` package where it is
    installed (it releases the GIL, so the I/O threads checksum in parallel), else ``google_crc32c``
    (zarr's codec's own library, which holds the GIL). Both give the same values."""
    global _EXTEND
    if _EXTEND is None:
        try:
            import crc32c as package
            _EXTEND = lambda crc, data: package.crc32c(data, crc)
        except ImportError:
            import google_crc32c
            _EXTEND = google_crc32c.extend
    return _EXTEND


_EXTEND = None


def crc32c(data, crc: int = 0) -> int:
    """CRC-32C of ``data`` (bytes-like), continuing ``crc``: the value zarr's ``crc32c`` codec appends."""
    # read in place (no copy: 6x faster); google_crc32c takes bytes and NumPy arrays, not memoryviews
    if isinstance(data, np.ndarray):
        data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    elif not isinstance(data, bytes):
        data = np.frombuffer(memoryview(data).cast("B"), np.uint8)
    return int(_crc32c_extend()(crc, data))


@dataclasses.dataclass(frozen=True)
class Frames:
    """How one stored chunk's bytes wrap the codec's frame."""

    algorithm: str         # "zstd", "lz4", or "none" (the bytes are the values)
    head: int = 0          # bytes before the frame: numcodecs' LZ4 keeps the decoded size there
    crc32c: bool = False   # zarr's crc32c codec: a CRC-32C of the rest, 4 bytes little-endian, after it
    level: int = 0         # zstd level the output is declared with (decoders ignore it)


@dataclasses.dataclass(frozen=True)
class Stored:
    """An array's chunk files, as a worker reads or writes them directly."""

    root: str                  # the array's folder
    prefix: str                # chunk key prefix: "c" + separator (v3 default encoding) or ""
    separator: str
    shape: tuple[int, ...]
    dtype: str
    unit: int                  # matrices per stored object along N: the shard, else the chunk
    inner: int                 # matrices per chunk inside a shard (== unit when not sharded)
    frames: Frames
    sharded: bool = False
    index_at_end: bool = True

    @property
    def per_shard(self) -> int:
        return self.unit // self.inner

    @property
    def matrix_bytes(self) -> int:
        return int(np.prod(self.shape[1:], dtype=np.int64)) * np.dtype(self.dtype).itemsize

    @property
    def index_bytes(self) -> int:
        return 16 * self.per_shard + 4

    def key(self, index: int) -> str:
        return self.prefix + self.separator.join([str(index)] + ["0"] * (len(self.shape) - 1))

    def path(self, index: int) -> str:
        return os.path.join(self.root, *self.key(index).split("/"))


@dataclasses.dataclass(frozen=True)
class Choice:
    """Where an array's codec runs: ``device`` "gpu" or "cpu", and why."""

    device: str
    reason: str
    stored: Stored | None = None
    route: bool = False   # an input of large frames: groups of compressed ones go to the host (_device_batches)

    def as_dict(self) -> dict:
        return {"device": self.device, "reason": self.reason}


# ------------------------------------------------------------------------------------ the layout
def _name(codec) -> str:
    to_dict = getattr(codec, "to_dict", None)
    if to_dict is not None:
        return str(to_dict().get("name", type(codec).__name__))
    return str(getattr(codec, "codec_id", type(codec).__name__))


def _frames(chain: list, where: str) -> tuple[Frames | None, str]:
    """The :class:`Frames` of a chain of bytes-to-bytes codecs, or why the GPU cannot decode it."""
    crc = bool(chain) and _name(chain[-1]) == "crc32c"
    if crc:
        chain = chain[:-1]
    if not chain:
        return Frames("none", crc32c=crc), ""
    if len(chain) > 1:
        return None, f"{where} has the codecs {', '.join(_name(c) for c in chain)}: only one compressor decodes on the GPU"
    name = _name(chain[0])
    if name == "zstd":
        return Frames("zstd", crc32c=crc, level=int(getattr(chain[0], "level", 0) or 0)), ""
    if name in ("lz4", "numcodecs.lz4"):
        return Frames("lz4", head=4, crc32c=crc), ""
    return None, f"{where} is compressed with {name}, which nvCOMP does not decode to the standard format"


def describe(array) -> tuple[Stored | None, str]:
    """The :class:`Stored` layout of a zarr array, or None and why its chunks cannot go to the GPU."""
    from zarr.storage import LocalStore

    store = array.store
    if not isinstance(store, LocalStore):
        return None, f"its store is a {type(store).__name__}, not a local folder"
    shape = tuple(int(s) for s in array.shape)
    dtype = np.dtype(array.dtype)
    if dtype.byteorder == ">" or (dtype.byteorder == "=" and not np.little_endian):
        return None, "its values are big-endian"
    root = os.path.join(str(store.root), *[p for p in str(array.path).split("/") if p])
    meta = array.metadata
    sharded = False
    index_at_end = True
    if meta.zarr_format == 2:
        if getattr(meta, "filters", None):
            return None, f"it has the filters {', '.join(_name(f) for f in meta.filters)}"
        if getattr(meta, "order", "C") != "C":
            return None, "its chunks are in Fortran order"
        compressor = getattr(meta, "compressor", None)
        frames, why = _frames([] if compressor is None else [compressor], "it")
        prefix, separator = "", str(getattr(meta, "dimension_separator", ".") or ".")
        chunk = unit = int(array.chunks[0])
        chunk_shape = tuple(array.chunks)
    else:
        codecs = list(meta.codecs)
        if len(codecs) == 1 and _name(codecs[0]) == "sharding_indexed":
            sharding = codecs[0]
            sharded = True
            index = [_name(c) for c in sharding.index_codecs]
            if index not in (["bytes"], ["bytes", "crc32c"]) or _endian(sharding.index_codecs[0]) == "big":
                return None, f"its shard index has the codecs {', '.join(index)}"
            if index == ["bytes"]:
                return None, "its shard index has no crc32c codec"
            index_at_end = str(getattr(sharding.index_location, "value", sharding.index_location)) == "end"
            codecs = list(sharding.codecs)
            chunk_shape = tuple(int(c) for c in sharding.chunk_shape)
            unit = int(array.shards[0])
        else:
            chunk_shape = tuple(array.chunks)
            unit = int(chunk_shape[0])
        if not codecs or _name(codecs[0]) != "bytes":
            return None, f"its codecs start with {_name(codecs[0]) if codecs else 'nothing'}, not bytes"
        if _endian(codecs[0]) == "big" and dtype.itemsize > 1:
            return None, "its values are stored big-endian"
        frames, why = _frames(codecs[1:], "it")
        encoding = meta.chunk_key_encoding
        separator = str(getattr(encoding, "separator", "/"))
        prefix = ("c" + separator) if getattr(encoding, "name", "default") == "default" else ""
        chunk = int(chunk_shape[0])
    if frames is None:
        return None, why
    if tuple(chunk_shape[1:]) != shape[1:] or (array.shards is not None and tuple(array.shards[1:]) != shape[1:]):
        return None, f"its chunks {chunk_shape} cut through the matrices {shape[1:]}"
    stored = Stored(root, prefix, separator, shape, dtype.str, unit, chunk, frames, sharded, index_at_end)
    for index in (0, 1, 17):
        expected = meta.encode_chunk_key((index,) + (0,) * (len(shape) - 1))
        if stored.key(index) != expected:
            return None, f"its chunk keys ({expected}) use an encoding batchlu does not know"
    return stored, ""


def _endian(codec) -> str | None:
    endian = getattr(codec, "endian", None)
    return None if endian is None else str(getattr(endian, "value", endian))


def choose(array, setting: str, *, gpu: bool, nvcomp: str | None, reading: bool = False) -> Choice:
    """Where ``array``'s codec runs for ``batchlu.codec-device`` = ``setting``.

    ``gpu``: the run computes on GPUs; ``nvcomp``: None when every worker imports nvCOMP, else why not;
    ``reading``: an input. nvCOMP cannot be relied on to notice a damaged frame (a zstd frame cut in
    half decoded without an error on the H100), and a run must never compute from one, so every frame
    is checked on the host before it goes to the device: its crc32c where the array has zarr's crc32c
    codec, else (zstd) the frame's structure (:func:`zstd_check`); an lz4 input without crc32c
    decodes on the host.
    ``auto`` takes the GPU where it can and says why not otherwise; ``gpu`` asked for an array the GPU
    cannot decode falls back to the host with the reason too (the run does not fail over it).
    """
    if setting == "cpu":
        return Choice("cpu", "codec-device is cpu")
    if not gpu:
        return Choice("cpu", "the run computes on the CPU")
    if nvcomp is not None:
        return Choice("cpu", nvcomp)
    stored, why = describe(array)
    if stored is None:
        return Choice("cpu", why)
    if reading and stored.frames.algorithm == "lz4" and not stored.frames.crc32c:
        return Choice("cpu", "its lz4 chunks carry no crc32c checksum, which the GPU path needs to catch a "
                             "damaged frame (batchlu generate writes one)")
    frame_bytes = stored.inner * stored.matrix_bytes
    limit = _nvcomp.ENCODE_LIMIT.get(stored.frames.algorithm)
    if not reading and limit is not None and frame_bytes > limit:
        return Choice("cpu", f"its chunks of {frame_bytes / 2**20:.0f} MiB are larger than nvCOMP's "
                             f"{stored.frames.algorithm} encoder takes ({limit >> 20} MiB)")
    large = setting == "auto" and frame_bytes > AUTO_FRAME_BYTES and stored.frames.algorithm != "none"
    if large and not reading:
        return Choice("cpu", f"its chunks of {frame_bytes / 2**20:.0f} MiB are faster on the host (the GPU "
                             f"encodes many small frames well, few large ones slowly; the sharded layout "
                             f"suits it)")
    frames = stored.frames
    what = "raw bytes" if frames.algorithm == "none" else frames.algorithm + (
        " + crc32c" if frames.crc32c else ", frames checked on the host" if reading else "")
    layout = f"shards of {stored.unit} matrices in chunks of {stored.inner}" if stored.sharded \
        else f"chunks of {stored.unit} matrices"
    if large:
        return Choice("gpu", f"{what}, {layout}; the chunks are {frame_bytes / 2**20:.0f} MiB frames: "
                             f"those that are compressed are decoded on the host, which decodes few large "
                             f"compressed frames faster", stored, route=True)
    return Choice("gpu", f"{what}, {layout}", stored)


# --------------------------------------------------------------------------------- output arrays
def zarr_compressors(codec: str, checksum: str = "none"):
    """zarr ``compressors=`` for ``batchlu.output-codec``: ``zstd``, ``zstd:LEVEL``, ``lz4`` or ``none``;
    with ``checksum`` ``crc32c`` (``batchlu.output-checksum``), zarr's crc32c codec last, so that a
    reader notices a damaged chunk."""
    import zarr

    if checksum not in OUTPUT_CHECKSUMS:
        raise ConfigError(f"Expected batchlu.output-checksum in {', '.join(OUTPUT_CHECKSUMS)}. Got {checksum!r} instead.")
    name, _, level = codec.partition(":")
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


# ------------------------------------------------------------------------------------- reading
@dataclasses.dataclass(frozen=True)
class Read:
    """One frame to read: bytes ``[offset, offset + length)`` of ``path`` (``length`` None: the whole
    file), decoding to ``matrices`` matrices from matrix ``first`` of the array. ``missing`` says
    when a shard or an inner chunk is not stored (``length`` 0); a chunk file that is not there shows
    as size 0 in :func:`frame_sizes` (:func:`gaps` lists both for the missing-chunk check)."""

    path: str
    offset: int
    length: int | None
    first: int
    matrices: int
    label: str
    missing: str = ""   # "shard": the shard file is not there; "chunk": its index has no such chunk


def shard_index(stored: Stored, shard: int) -> np.ndarray | None:
    """The (offset, nbytes) pairs of a shard's chunks; None when the shard file is not there.
    A shard whose index is unreadable or fails its CRC-32C raises ``ValueError``."""
    path = stored.path(shard)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < stored.index_bytes:
                raise FrameError(f"the shard {path} has {size} bytes, fewer than its index ({stored.index_bytes})")
            f.seek(size - stored.index_bytes if stored.index_at_end else 0)
            raw = f.read(stored.index_bytes)
    except FileNotFoundError:
        return None
    body, trailer = raw[:-4], int.from_bytes(raw[-4:], "little")
    if crc32c(body) != trailer:
        raise FrameError(f"the index of shard {path} fails its CRC-32C")
    return np.frombuffer(body, "<u8").reshape(stored.per_shard, 2)


def plan_reads(stored: Stored, start: int, stop: int) -> list[Read]:
    """The frames that hold matrices ``[start, stop)`` (whole stored objects), in order."""
    count = stored.shape[0]
    reads = []
    for obj in range(start // stored.unit, -(-stop // stored.unit)):
        lo = obj * stored.unit
        if not stored.sharded:
            reads.append(Read(stored.path(obj), 0, None, lo, stored.unit, stored.key(obj)))
            continue
        index = shard_index(stored, obj)
        for i in range(stored.per_shard):
            first = lo + i * stored.inner
            if first >= count:
                break
            label = f"{stored.key(obj)} (chunk {i} of the shard)"
            if index is None or int(index[i, 0]) == EMPTY:
                reads.append(Read(stored.path(obj), 0, 0, first, stored.inner, label,
                                  "shard" if index is None else "chunk"))
            else:
                reads.append(Read(stored.path(obj), int(index[i, 0]), int(index[i, 1]), first, stored.inner, label))
    return reads


def gaps(stored: Stored, reads: list[Read], sizes: list[int]) -> list:
    """The :class:`batchlu.pipeline._missing.Gap` of every object ``reads`` need that is not stored
    (``sizes`` from :func:`frame_sizes`): a shard or chunk file not there, or an inner chunk its
    shard's index does not hold, as :func:`batchlu.pipeline._missing.find` names them. A chunk file
    that is there but empty, or an index entry of no bytes, raises :class:`FrameError`."""
    from ._missing import Gap

    count = stored.shape[0]
    tail = (0,) * (len(stored.shape) - 1)
    found, shards = [], set()
    for r, size in zip(reads, sizes):
        obj = r.first // stored.unit
        if r.missing == "shard":
            if obj not in shards:
                shards.add(obj)
                found.append(Gap(stored.key(obj), None, obj * stored.unit, min((obj + 1) * stored.unit, count)))
        elif r.missing == "chunk":
            inner = r.first // stored.inner
            found.append(Gap(stored.key(obj), (inner,) + tail, r.first, min(r.first + stored.inner, count)))
        elif size == 0:
            if r.length is None and not os.path.exists(r.path):
                found.append(Gap(stored.key(obj), None, obj * stored.unit, min((obj + 1) * stored.unit, count)))
            else:
                raise FrameError(f"the chunk {r.label} is stored with no bytes")
    return found


def frame_sizes(reads: list[Read]) -> list[int]:
    """Bytes each read takes (whole files: their size now; 0 for a chunk not stored)."""
    sizes = []
    for r in reads:
        if r.length is not None:
            sizes.append(r.length)
            continue
        try:
            sizes.append(os.stat(r.path).st_size)
        except FileNotFoundError:
            sizes.append(0)
    return sizes


def aligned(sizes: list[int]) -> tuple[list[int], int]:
    """Offsets of frames of ``sizes`` packed at :data:`ALIGN`-byte boundaries, and the total."""
    offsets, at = [], 0
    for size in sizes:
        offsets.append(at)
        at += -(-size // ALIGN) * ALIGN
    return offsets, at


def read_frames(reads: list[Read], sizes: list[int], offsets: list[int], buffer: np.ndarray, pool=None) -> None:
    """Read every frame into ``buffer`` (uint8) at ``offsets``: in ``pool``'s threads if given. The
    inner chunks of one shard that lie back to back in its file are read by one ``preadv`` each run
    (one system call for many frames, each landing at its own aligned offset)."""
    runs: list[list[int]] = []
    for i, (r, size) in enumerate(zip(reads, sizes)):
        if size == 0:
            continue
        if runs and r.length is not None:
            p = runs[-1][-1]
            if (reads[p].path == r.path and reads[p].length is not None
                    and reads[p].offset + sizes[p] == r.offset and len(runs[-1]) < IOV_MAX):
                runs[-1].append(i)
                continue
        runs.append([i])

    def one(run: list[int]) -> None:
        first = reads[run[0]]
        views = [memoryview(buffer)[offsets[i]:offsets[i] + sizes[i]] for i in run]
        want = sum(sizes[i] for i in run)
        with open(first.path, "rb", buffering=0) as f:
            got = os.preadv(f.fileno(), views, first.offset)
            if got == want:
                return
            # a short read: go on frame by frame from where it stopped, to name the chunk that ends early
            at = first.offset
            for i, view in zip(run, views):
                done = min(got, sizes[i])
                got -= done
                while done < sizes[i]:
                    more = os.preadv(f.fileno(), [view[done:]], at + done)
                    if not more:
                        raise FrameError(f"the chunk {reads[i].label} ended after {done} of {sizes[i]} bytes")
                    done += more
                at += sizes[i]

    if pool is None:
        for run in runs:
            one(run)
    else:
        list(pool.map(one, runs))


def zstd_check(buffer: np.ndarray, offset: int, size: int, want: int, label: str) -> None:
    """Check that ``buffer[offset:offset + size]`` is one whole zstd frame that declares ``want``
    decoded bytes: the magic number, a frame header with the content size, then blocks whose headers
    chain exactly to the frame's end through a last block (and its content checksum, if flagged).
    A frame cut short, run on, or with a damaged header or block header fails here, on the host,
    before nvCOMP sees it (RFC 8878, section 3.1.1); a flipped bit inside a compressed block is
    beyond any check without a checksum, on the host as on the GPU."""
    view = buffer[offset:offset + size]
    if size < 6 or int.from_bytes(view[:4].tobytes(), "little") != 0xFD2FB528:
        raise FrameError(f"the chunk {label} is not a zstd frame")
    descriptor = int(view[4])
    fcs_flag, single, checksum, did_flag = descriptor >> 6, descriptor >> 5 & 1, descriptor >> 2 & 1, descriptor & 3
    if descriptor & 0x08:
        raise FrameError(f"the chunk {label} has a damaged zstd frame header")
    at = 5 + (0 if single else 1) + (0, 1, 2, 4)[did_flag]
    fcs_bytes = (1 if single else 0, 2, 4, 8)[fcs_flag]
    if fcs_bytes == 0:
        raise FrameError(f"the chunk {label} is a zstd frame that does not declare its size")
    if at + fcs_bytes > size:
        raise FrameError(f"the chunk {label} ends inside its zstd frame header")
    declared = int.from_bytes(view[at:at + fcs_bytes].tobytes(), "little") + (256 if fcs_flag == 1 else 0)
    if declared != want:
        raise FrameError(f"the chunk {label} declares {declared} bytes; its matrices take {want}")
    at += fcs_bytes
    bytes_ = memoryview(view)
    while True:
        if at + 3 > size:
            raise FrameError(f"the chunk {label} ends inside its zstd frame (truncated?)")
        header = int.from_bytes(bytes_[at:at + 3], "little")
        kind, length = header >> 1 & 3, header >> 3
        if kind == 3 or length > 128 << 10:
            raise FrameError(f"the chunk {label} has a damaged zstd block header")
        at += 3 + (1 if kind == 1 else length)
        if header & 1:
            break
    at += 4 * checksum
    if at != size:
        raise FrameError(f"the chunk {label} holds {size} bytes; its zstd frame takes {at} (truncated or "
                         f"damaged)" if at > size else f"the chunk {label} has {size - at} bytes after its "
                         f"zstd frame")


def zstd_check_many(buffer: np.ndarray, offsets, sizes, want, labels) -> None:
    """:func:`zstd_check` of many frames at once: frame ``i`` is ``buffer[offsets[i]:offsets[i] +
    sizes[i]]``, declaring ``want`` decoded bytes (one number, or one per frame); ``labels[i]`` names
    it. The frames' headers are read with NumPy, their block headers walked one block of every frame
    at a time (a frame of B KiB has about B / 128 blocks), so the Python cost is per block, not per
    frame. The first frame that fails is checked again with :func:`zstd_check`, whose message it
    raises."""
    offsets = np.asarray(offsets, np.int64)
    sizes = np.asarray(sizes, np.int64)
    n = offsets.size
    if n == 0:
        return
    want = np.broadcast_to(np.asarray(want, np.int64), (n,))
    buf = buffer.reshape(-1).view(np.uint8)
    end = offsets + sizes
    limit = buf.size

    def byte(at):
        return buf[np.minimum(at, limit - 1)].astype(np.int64)

    def le(at, count):   # little-endian integers of count[i] bytes at at[i] (count <= 8)
        value = np.zeros(at.size, np.uint64)
        for k in range(8):
            use = k < count
            value |= np.where(use, byte(at + k).astype(np.uint64) << np.uint64(8 * k), np.uint64(0))
        return value

    bad = sizes < 6
    bad |= le(offsets, np.full(n, 4)) != 0xFD2FB528
    descriptor = byte(offsets + 4)
    fcs_flag, single, checksum, did = descriptor >> 6, descriptor >> 5 & 1, descriptor >> 2 & 1, descriptor & 3
    bad |= (descriptor & 0x08) != 0
    at = offsets + 5 + (1 - single) + np.array([0, 1, 2, 4])[did]
    fcs = np.where(fcs_flag == 0, single, np.array([0, 2, 4, 8])[fcs_flag])
    bad |= (fcs == 0) | (at + fcs > end)
    declared = le(at, fcs).astype(np.int64) + np.where(fcs_flag == 1, 256, 0)
    bad |= declared != want
    at = at + fcs
    active = ~bad
    while active.any():
        idx = np.flatnonzero(active)
        pos = at[idx]
        short = pos + 3 > end[idx]
        header = le(pos, np.full(idx.size, 3)).astype(np.int64)
        kind, length = header >> 1 & 3, header >> 3
        broken = short | (kind == 3) | (length > 128 << 10)
        at[idx] = pos + 3 + np.where(kind == 1, 1, length)
        last = (header & 1) == 1
        bad[idx[broken]] = True
        active[idx[broken | last]] = False
    at = at + 4 * checksum
    bad |= at != end
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        zstd_check(buf, int(offsets[i]), int(sizes[i]), int(want[i]), labels[i])
        raise FrameError(f"the chunk {labels[i]} is not a whole zstd frame")


def payload(frames: Frames, buffer: np.ndarray, offset: int, size: int, label: str) -> tuple[int, int]:
    """The codec frame inside one stored chunk's bytes: checks the crc32c trailer and numcodecs'
    LZ4 header; returns (offset, length) of the frame in ``buffer``. (A zstd frame without crc32c is
    checked by the caller, all of a group's at once: :func:`zstd_check_many`.)"""
    if frames.crc32c:
        if size < 4:
            raise FrameError(f"the chunk {label} has {size} bytes, too few for its CRC-32C")
        body = buffer[offset:offset + size - 4]
        if crc32c(body) != int.from_bytes(bytes(buffer[offset + size - 4:offset + size]), "little"):
            raise FrameError(f"the chunk {label} fails its CRC-32C")
        size -= 4
    if frames.head:
        if size < frames.head:
            raise FrameError(f"the chunk {label} has {size} bytes, too few for its header")
        offset += frames.head
        size -= frames.head
    return offset, size


def _trailer_fault(data: np.ndarray, offset: int, size: int) -> str | None:
    """Why ``data[offset:offset + size]``, one stored chunk, fails zarr's crc32c codec; None if it passes."""
    if size < 4:
        return f"has {size} bytes, too few for its CRC-32C"
    if crc32c(data[offset:offset + size - 4]) != int.from_bytes(data[offset + size - 4:offset + size].tobytes(),
                                                                 "little"):
        return "fails its CRC-32C"
    return None


def object_fault(stored: Stored, index: int, scratch: list | None = None) -> str | None:
    """Why stored object ``index`` (a chunk file, or a shard) of an array with zarr's crc32c codec
    fails its checksums, None if it passes (or is not stored): the file read whole, once, into
    ``scratch[0]`` (a buffer kept from call to call, grown as needed: a fresh one per file costs more
    in page faults than the read); a shard's index checked, then each of the chunks it lists. No
    chunk is decoded."""
    scratch = [np.empty(0, np.uint8)] if scratch is None else scratch
    try:
        with open(stored.path(index), "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            if scratch[0].size < size:
                scratch[0] = np.empty(size, np.uint8)
            data = scratch[0][:size]
            done = 0
            while done < size:
                got = f.readinto(memoryview(data)[done:])
                if not got:   # the file shrank while it was read
                    data = data[:done]
                    break
                done += got
    except FileNotFoundError:
        return None
    if not stored.sharded:
        return _trailer_fault(data, 0, data.size)
    if data.size < stored.index_bytes:
        return f"has {data.size} bytes, fewer than its shard index ({stored.index_bytes})"
    at = data.size - stored.index_bytes if stored.index_at_end else 0
    if _trailer_fault(data, at, stored.index_bytes):
        return "has a shard index that fails its CRC-32C"
    entries = data[at:at + stored.index_bytes - 4].view("<u8").reshape(stored.per_shard, 2)
    for i, (offset, size) in enumerate(entries.tolist()):
        if offset == EMPTY and size == EMPTY:   # a chunk the shard does not store
            continue
        if offset + size > data.size:
            return f"lists chunk {i} of the shard beyond the file's end"
        why = _trailer_fault(data, offset, size)
        if why:
            return f"(chunk {i} of the shard) {why}"
    return None


def faults(stored: Stored, objects, threads: int = 4) -> dict[int, str]:
    """:func:`object_fault` of each of ``objects`` (stored object numbers), in ``threads`` threads
    (the reads overlap the checksums): object -> why, for those that fail."""
    import concurrent.futures

    import threading

    objects = [int(o) for o in objects]
    if not stored.frames.crc32c or not objects:
        return {}
    local = threading.local()

    def one(o: int) -> str | None:
        if not hasattr(local, "scratch"):
            local.scratch = [np.empty(0, np.uint8)]
        return object_fault(stored, o, local.scratch)

    with concurrent.futures.ThreadPoolExecutor(max(1, min(threads, len(objects)))) as pool:
        found = dict(zip(objects, pool.map(one, objects)))
    return {o: why for o, why in found.items() if why}


# ------------------------------------------------------------------------------------- writing
def write_file(path: str, parts) -> None:
    """Write ``parts`` (bytes-like) to ``path`` through a temporary file renamed into place, with as
    few system calls as the parts allow (``writev`` of up to :data:`IOV_MAX` parts each; the GIL is
    let go during each)."""
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".batchlu-", dir=folder)
    try:
        try:
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


def wrap(frames: Frames, frame, decoded_bytes: int) -> list:
    """A stored chunk's parts around an encoded ``frame``: numcodecs' LZ4 header; the crc32c trailer
    is added by :func:`write_object`, as the file is written."""
    if frames.head:
        return [int(decoded_bytes).to_bytes(4, "little"), frame]
    return [frame]


def trailer(parts) -> bytes:
    """zarr's crc32c trailer of a chunk made of ``parts``: the CRC-32C of all of them, 4 bytes
    little-endian, as the codec appends it."""
    crc = 0
    for part in parts:
        crc = crc32c(part, crc)
    return crc.to_bytes(4, "little")


def write_object(path: str, frames: Frames, chunks: list, head=(), tail=()) -> None:
    """Write one stored object: ``head``, each chunk's parts (from :func:`wrap`) followed by its
    crc32c trailer where the array has zarr's crc32c codec, then ``tail`` (a shard's index before or
    after its chunks). The trailers are computed here, in the I/O thread that writes the file, not in
    the thread that encodes the next group."""
    parts = list(head)
    for chunk in chunks:
        parts += chunk
        if frames.crc32c:
            parts.append(trailer(chunk))
    write_file(path, parts + list(tail))


def write_chunks(stored: Stored, first_object: int, frames: list, decoded_bytes: list[int], pool=None) -> list:
    """Write encoded chunks of consecutive stored objects from ``first_object`` on: one chunk file per
    frame, or (sharded) one shard per ``per_shard`` frames with its index (and its CRC-32C). Where the
    array has zarr's crc32c codec, each chunk ends with its trailer (:func:`write_object`).
    ``decoded_bytes[i]`` is the size frame ``i`` decodes to (numcodecs' LZ4 header keeps it). With a
    ``pool``, the files are written there and the futures of the writes come back (the caller waits
    for them, and keeps ``frames`` alive until then); without, they are written here and the list is
    empty."""
    jobs = []
    if not stored.sharded:
        for i, frame in enumerate(frames):
            jobs.append((stored.path(first_object + i), [wrap(stored.frames, frame, decoded_bytes[i])], (), ()))
    else:
        k = stored.per_shard
        extra = 4 if stored.frames.crc32c else 0
        for s in range(-(-len(frames) // k)):
            chunks = [wrap(stored.frames, f, d) for f, d in zip(frames[s * k:(s + 1) * k],
                                                                   decoded_bytes[s * k:(s + 1) * k])]
            index = np.full((k, 2), EMPTY, "<u8")
            at = 0 if stored.index_at_end else stored.index_bytes
            for i, parts in enumerate(chunks):
                size = sum(len(memoryview(p).cast("B")) for p in parts) + extra
                index[i] = (at, size)
                at += size
            body = index.tobytes()
            index_parts = [body, crc32c(body).to_bytes(4, "little")]
            head, tail = ((), index_parts) if stored.index_at_end else (index_parts, ())
            jobs.append((stored.path(first_object + s), chunks, head, tail))
    if pool is None:
        for path, chunks, head, tail in jobs:
            write_object(path, stored.frames, chunks, head, tail)
        return []
    return [pool.submit(write_object, path, stored.frames, chunks, head, tail) for path, chunks, head, tail in jobs]
