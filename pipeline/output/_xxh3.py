"""XXH3-64 (xxHash's, seed 0) of data another processor hashes in parallel: the host half.

The ledger keeps the XXH3-64 of each output chunk's input values (:mod:`batchlu.pipeline.output._fingerprint`,
computed there by the ``xxhash`` package). On the GPU codec path those values are decoded on the
device and never reach the host, so the device hashes them (``kernels/cuda/xxh3.cu``). This module is
the host half: the constants, the last step (:func:`merge`), and a NumPy model of the device's two
passes that the tests check against ``xxhash``.

XXH3 of ``L > 240`` bytes keeps eight 64-bit lanes. Each 64-byte stripe adds to every lane ``j`` a
term of the stripe's words ``j`` and ``j ^ 1`` and a key word of the secret; a block is 16 stripes
(1,024 bytes), and after each block every lane is scrambled on its own. The additions are mod 2**64,
so a block's terms can be summed in any order and each lane runs on its own:

* pass 1 (``xxh3_blocks``): one thread per block, the eight sums of its 16 stripes' terms;
* pass 2 (``xxh3_lanes``): one thread per lane of a range, block after block ``acc = scramble(acc +
  sum)``, then the terms of the stripes after the last whole block and of the range's last 64 bytes;
* :func:`merge` (here): the eight lanes and the length into the 64-bit value.

A range of at most :data:`SHORT` bytes takes XXH3's short paths: the host hashes it.
"""

from __future__ import annotations

import numpy as np

from ..errors import InputError

__all__ = ["BLOCK", "INIT", "SECRET", "SHORT", "STRIPE", "merge", "model"]

MASK = (1 << 64) - 1
PRIME32_1 = 0x9E3779B1
PRIME64_1 = 0x9E3779B185EBCA87
SHORT = 240     # longest range of XXH3's short paths
STRIPE = 64
BLOCK = 1024    # 16 stripes of the default secret
SECRET = bytes.fromhex(  # XXH3_kSecret (xxhash.h), 192 bytes
    "b8fe6c3923a44bbe7c01812cf721ad1cded46de9839097db7240a4a4b7b3671f"
    "cb79e64eccc0e578825ad07dccff7221b8084674f743248ee03590e6813a264c"
    "3c2852bb91c300cb88d0658b1b532ea371644897a20df94e3819ef46a9deacd8"
    "a8fa763fe39c343ff9dcbbc7c70b4f1d8a51e04bcdb45931c89f7ec9d9787364"
    "eac5ac8334d3ebc3c581a0fffa1363eb170ddd51b7f0da49d316552629d4689e"
    "2b16be587d47a1fc8ff8b8d17ad031ce45cb3a8f95160428afd7fbcabb4b407e")
INIT = (0xC2B2AE3D, 0x9E3779B185EBCA87, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9,
        0x85EBCA77C2B2AE63, 0x85EBCA77, 0x27D4EB2F165667C5, 0x9E3779B1)
MERGE_AT = 11       # XXH_SECRET_MERGEACCS_START
LAST_AT = 121       # the last stripe's key: secret size - stripe - XXH_SECRET_LASTACC_START (7)
SCRAMBLE_AT = 128   # secret size - stripe


def _word(offset: int) -> int:
    return int.from_bytes(SECRET[offset:offset + 8], "little")


def merge(acc, length: int) -> int:
    """The XXH3-64 of ``length`` bytes (``> SHORT``) from its eight lanes after the last stripe."""
    acc = [int(x) & MASK for x in acc]
    result = (length * PRIME64_1) & MASK
    for i in range(4):
        product = (acc[2 * i] ^ _word(MERGE_AT + 16 * i)) * (acc[2 * i + 1] ^ _word(MERGE_AT + 16 * i + 8))
        result = (result + ((product & MASK) ^ (product >> 64))) & MASK
    result ^= result >> 37
    result = (result * 0x165667919E3779F9) & MASK
    return result ^ (result >> 32)


# ------------------------------------------------------------------------ the model of the device
def _terms(words: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """The eight lane terms of stripes ``words`` (..., 8) uint64 with key words ``keys`` (..., 8)."""
    key = words ^ keys
    product = (key & np.uint64(0xFFFFFFFF)) * (key >> np.uint64(32))
    return product + words[..., [1, 0, 3, 2, 5, 4, 7, 6]]


def _keys(offsets) -> np.ndarray:
    return np.array([[_word(o + 8 * j) for j in range(8)] for o in offsets], np.uint64)


def model(data: bytes) -> int:
    """XXH3-64 of ``data`` (``> SHORT`` bytes) as the device computes it: pass 1's block sums, pass 2's
    lanes, :func:`merge`."""
    length = len(data)
    if length <= SHORT:
        raise InputError(f"Expected more than {SHORT} bytes. Got {length} instead.")
    words = np.frombuffer(data[:length // 8 * 8], "<u8").astype(np.uint64)
    blocks = (length - 1) // BLOCK
    stripe_keys = _keys(range(0, 16 * 8, 8))                                  # (16, 8)
    with np.errstate(over="ignore"):
        sums = _terms(words[:blocks * 128].reshape(blocks, 16, 8), stripe_keys).sum(axis=1, dtype=np.uint64)
        acc = np.array(INIT, np.uint64)
        scramble = _keys([SCRAMBLE_AT])[0]
        for k in range(blocks):                                                   # pass 2
            acc = acc + sums[k]
            acc = ((acc ^ (acc >> np.uint64(47))) ^ scramble) * np.uint64(PRIME32_1)
        tail = ((length - 1) - BLOCK * blocks) // STRIPE
        for s in range(tail):
            at = BLOCK * blocks + STRIPE * s
            acc = acc + _terms(np.frombuffer(data[at:at + STRIPE], "<u8").astype(np.uint64), stripe_keys[s])
        last = np.frombuffer(data[length - STRIPE:], "<u8").astype(np.uint64)
        acc = acc + _terms(last, _keys([LAST_AT])[0])
    return merge(acc, length)
