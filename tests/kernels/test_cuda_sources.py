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
    assert {"getrf", "getri", "getrs"} <= set(sources.families())
    assert len(sources.families()) == len(list(sources.CUDA_DIR.glob("*.cu")))
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


@pytest.mark.parametrize("version,reused", [("13.6.0", False), ("14.0.1", False), ("14.1.1", False),
                                            ("14.2.0", True), ("14.10.0", True), ("15.0.0rc1", True)])
def test_which_cupy_reads_its_disk_cache_back(version, reused):
    assert sources.disk_cache_reused(version) is reused
