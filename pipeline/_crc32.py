"""CRC-32 (zlib's) of data that another processor hashes in pieces: the algebra that joins the pieces.

The ledger keeps the CRC-32 of each output chunk's input values (:mod:`batchlu.pipeline._fingerprint`).
On the GPU codec path those values are decoded on the device and never reach the host, so the device
hashes them (``kernels/cuda/crc32.cu``): each thread the register of one short segment, then a tree
joins neighbouring segments. This module is the host half: the linear algebra over GF(2) that joins
two registers, and a NumPy model of the device's segmenting that the tests check against :mod:`zlib`.

Notation: ``R(s, M)`` is the CRC register after the bytes ``M`` from state ``s`` (no final inversion).
zlib's value is ``crc32(M) = ~R(~0, M)``. ``R`` is affine in ``s``: ``R(s, M) = Z^|M| s  xor  R(0, M)``
where ``Z`` is the register's linear map for one zero byte; and leading zero bytes leave ``R(0, .)``
unchanged. So a message hashes as zero-padded segments of one length, joined pairwise up a tree with
``Z^(segment bytes * 2^level)``, and ``crc32(A || B) = ~(Z^(|A|+|B|) ~0  xor  Z^|B| R(0, A)  xor  R(0, B))``.
"""

from __future__ import annotations

import functools
import zlib

import numpy as np

try:   # zlib-ng's CRC-32 (carry-less multiply, 10-30 GB/s a core): the same values as zlib's (2-4 GB/s)
    from zlib_ng.zlib_ng import crc32 as _crc32
except ImportError:   # zlib-ng is a dependency; without it zlib gives the same values, slower
    _crc32 = zlib.crc32

MASK = 0xFFFFFFFF
POLY = 0xEDB88320  # zlib's CRC-32, bit-reflected

__all__ = ["TABLE", "apply", "combine", "crc32", "join", "register", "segment_registers", "shift_matrix", "tree"]


def crc32(data, value: int = 0) -> int:
    """zlib's CRC-32 of ``data`` (a buffer) from ``value``, computed by zlib-ng where it is installed
    (the GIL released, as zlib does): the pipeline hashes every input chunk it reads."""
    return _crc32(data, value)


def _table() -> np.ndarray:
    table = np.zeros(256, np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (POLY if c & 1 else 0)
        table[i] = c
    return table


TABLE = _table()


def apply(matrix: tuple[int, ...], value: int) -> int:
    """``matrix`` (32 columns, GF(2)) times the 32-bit ``value``."""
    out = 0
    i = 0
    while value:
        if value & 1:
            out ^= matrix[i]
        value >>= 1
        i += 1
    return out


def _multiply(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(apply(a, column) for column in b)


@functools.lru_cache(maxsize=1)
def _zero_byte() -> tuple[int, ...]:
    """``Z``: the register's map for one zero byte, column ``i`` = Z (1 << i)."""
    return tuple(int(TABLE[(1 << i) & 0xFF]) ^ ((1 << i) >> 8) for i in range(32))


@functools.lru_cache(maxsize=256)
def shift_matrix(nbytes: int) -> tuple[int, ...]:
    """``Z^nbytes``: what ``nbytes`` zero bytes do to a register (square-and-multiply)."""
    result = tuple(1 << i for i in range(32))
    power = _zero_byte()
    n = int(nbytes)
    while n:
        if n & 1:
            result = _multiply(power, result)
        n >>= 1
        if n:
            power = _multiply(power, power)
    return result


def register(data) -> int:
    """``R(0, data)``, through :func:`crc32`."""
    return ~crc32(memoryview(data).cast("B"), MASK) & MASK


def join(left: int, right: int, right_bytes: int) -> int:
    """``R(0, A || B)`` from ``R(0, A)``, ``R(0, B)`` and ``|B|``."""
    return apply(shift_matrix(right_bytes), left) ^ right


def finish(reg: int, nbytes: int) -> int:
    """zlib's CRC-32 of a message of ``nbytes`` bytes whose ``R(0, .)`` is ``reg``."""
    return ~(apply(shift_matrix(nbytes), MASK) ^ reg) & MASK


def combine(reg_a: int, bytes_a: int, reg_b: int | None = None, bytes_b: int = 0) -> int:
    """zlib's CRC-32 of ``A || B`` (or of ``A`` alone) from their ``R(0, .)`` registers."""
    if reg_b is None:
        return finish(reg_a, bytes_a)
    return finish(join(reg_a, reg_b, bytes_b), bytes_a + bytes_b)


def padded_segments(nbytes: int, segment: int) -> int:
    """Segments of the device's tree for a message of ``nbytes``: a power of two, at least 1."""
    k = max(1, -(-int(nbytes) // segment))
    return 1 << (k - 1).bit_length()


def tree(nbytes: int, segment: int) -> list[tuple[int, ...]]:
    """The join matrices of the tree's levels, ``Z^(segment * 2^t)`` for t = 0, 1, ..."""
    levels = padded_segments(nbytes, segment).bit_length() - 1
    return [shift_matrix(segment << t) for t in range(levels)]


def segment_registers(data: bytes, segment: int, count: int) -> list[int]:
    """The model of the device's first pass: ``R(0, .)`` of each of ``count`` segments of ``segment``
    bytes of ``data`` front-padded with zeros to ``count * segment`` bytes."""
    padded = bytes(count * segment - len(data)) + bytes(data)
    return [register(padded[i * segment:(i + 1) * segment]) for i in range(count)]


def reduce_registers(registers: list[int], segment: int) -> int:
    """The model of the device's tree: join neighbours level by level; returns ``R(0, whole)``."""
    values = list(registers)
    t = 0
    while len(values) > 1:
        m = shift_matrix(segment << t)
        values = [apply(m, values[2 * i]) ^ values[2 * i + 1] for i in range(len(values) // 2)]
        t += 1
    return values[0]
