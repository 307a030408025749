"""The CUDA text handed to NVRTC (no GPU needed): it carries a digest of the headers, so that CuPy's
on-disk kernel cache, whose key covers the text and not the files it includes, compiles afresh
after a header changes and reuses the module otherwise; and which CuPy reads that cache back."""

from __future__ import annotations

import shutil

import pytest

from batchlu.kernels import _cuda_sources as sources


def test_every_family_ends_with_the_headers_digest():
    tag = sources.headers_tag()
    assert tag.startswith("//") and tag.endswith("\n") and len(tag.split()[-1]) == 64
    assert sources.families() == ("gesv", "getrf", "getri", "getrs", "ldlt", "slogdet", "xxh3")
    for family in sources.families():
        code = sources.read(family)
        text = sources.compiled_text(code)
        assert text.startswith(code) and text.endswith(tag)
        assert "#include" in code  # the headers the digest stands for


def test_a_header_edit_changes_the_text_and_nothing_else_does(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    shutil.copytree(sources.CUDA_DIR, one)
    shutil.copytree(sources.CUDA_DIR, two)
    code = sources.read("getrf")
    assert sources.compiled_text(code, one) == sources.compiled_text(code, two) == sources.compiled_text(code)
    header = two / "rows.cuh"
    header.write_text(header.read_text() + "\n// an edit\n")
    sources.headers_tag.cache_clear()
    assert sources.compiled_text(code, two) != sources.compiled_text(code, one)
    edited = sources.compiled_text(code, two)
    (two / "extra.cuh").write_text("#pragma once\n")  # a new header counts too
    sources.headers_tag.cache_clear()
    assert sources.compiled_text(code, two) not in (edited, sources.compiled_text(code, one))


_HOST_HARNESS = r"""
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>
#define __global__
#define __device__
#define __constant__
#define __forceinline__ inline
#define __restrict__
struct { unsigned x; } blockIdx, blockDim, threadIdx;
#include "xxh3.cu"
int main(int argc, char** argv) {   // FILE (offset length)...: each range's 8 lanes after both passes
    std::vector<unsigned char> data;
    FILE* f = fopen(argv[1], "rb");
    for (int c; (c = fgetc(f)) != EOF;) data.push_back((unsigned char)c);
    int ranges = (argc - 2) / 2;
    std::vector<long long> offsets(ranges), lengths(ranges), blocks(ranges);
    long long widest = 1;
    for (int r = 0; r < ranges; ++r) {
        offsets[r] = atoll(argv[2 + 2 * r]), lengths[r] = atoll(argv[3 + 2 * r]);
        blocks[r] = (lengths[r] - 1) / 1024;
        if (blocks[r] > widest) widest = blocks[r];
    }
    std::vector<blu::xxh3_u64> sums(ranges * widest * 8, 0x5a5a5a5a5a5a5a5aULL), acc(ranges * 8, 0);
    blockDim.x = 32;
    for (long long id = 0; id < ((ranges * widest + 31) / 32) * 32; ++id) {   // every thread of the grid
        blockIdx.x = id / 32, threadIdx.x = id % 32;
        blu::xxh3_blocks(data.data(), offsets.data(), blocks.data(), sums.data(), widest, ranges);
    }
    for (long long id = 0; id < ((8LL * ranges + 31) / 32) * 32; ++id) {
        blockIdx.x = id / 32, threadIdx.x = id % 32;
        blu::xxh3_lanes(data.data(), offsets.data(), lengths.data(), sums.data(), acc.data(), widest, ranges);
    }
    for (auto a : acc) printf("%llu\n", a);
}
"""


def test_the_xxh3_kernels_compiled_for_the_host_give_xxhashs_values(tmp_path):
    """``kernels/cuda/xxh3.cu`` itself (not a model of it), compiled as host C++ with each thread of
    the grid run in turn, then merged by the host half: xxhash's XXH3-64 of every range, around the
    stripe and block ends. The GPU test (tests/pipeline/test_gpu_codecs.py) runs it on a device."""
    import subprocess

    import numpy as np
    import xxhash

    from batchlu.pipeline.output import _xxh3

    compiler = shutil.which("g++") or shutil.which("clang++")
    if compiler is None:
        pytest.skip("no C++ compiler")
    (tmp_path / "common.cuh").write_text("")   # the kernels use nothing of it; it holds device code
    shutil.copy(sources.CUDA_DIR / "xxh3.cu", tmp_path)
    (tmp_path / "harness.cpp").write_text(_HOST_HARNESS)
    subprocess.run([compiler, "-O1", "-std=c++17", "-I", str(tmp_path), str(tmp_path / "harness.cpp"),
                    "-o", str(tmp_path / "harness")], check=True, capture_output=True)
    data = np.random.default_rng().integers(0, 256, 70_004, dtype=np.uint8)
    (tmp_path / "data.bin").write_bytes(data.tobytes())
    ranges = [(8, 244), (4, 244), (16, 1020), (12, 1024), (4, 1028), (1024, 2048), (100, 4100), (12, 69_992)]
    out = subprocess.run([str(tmp_path / "harness"), str(tmp_path / "data.bin")]
                         + [str(x) for r in ranges for x in r], check=True, capture_output=True, text=True)
    lanes = np.array([int(x) for x in out.stdout.split()], dtype=np.uint64).reshape(len(ranges), 8)
    for (offset, length), acc in zip(ranges, lanes):
        assert _xxh3.merge(acc, length) == xxhash.xxh3_64_intdigest(data[offset:offset + length].tobytes())
