"""Test matrices: reproducible chunk by chunk, of the asked dtype and shape, and of the asked kind."""

from __future__ import annotations

import numpy as np
import pytest

from batchlu import kernels
from batchlu.testing import matrices

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind,n", [("random", 3), ("random", 64), ("illcond", 33),
                                    ("singular-mix", 5), ("singular-mix", 64)])
def test_chunks_concatenate_to_the_whole(kind, n, dtype):
    """Sizes chosen so that [0, 100) spans several internal blocks for some of them."""
    whole = matrices.generate(kind, n, dtype, seed=9, start=0, stop=100)
    assert whole.shape == (100, n, n) and whole.dtype == dtype and whole.flags.c_contiguous
    parts = [matrices.generate(kind, n, dtype, seed=9, start=lo, stop=hi)
             for lo, hi in [(0, 37), (37, 38), (38, 100)]]
    np.testing.assert_array_equal(np.concatenate(parts), whole)
    np.testing.assert_array_equal(matrices.generate(kind, n, dtype, seed=9, start=0, stop=100), whole)


def test_every_matrix_differs_and_seeds_differ():
    a = matrices.generate("random", 4, np.float64, seed=1, stop=3000)
    assert len(np.unique(a.reshape(len(a), -1), axis=0)) == len(a)
    b = matrices.generate("random", 4, np.float64, seed=2, stop=3000)
    assert not np.any(np.all(a == b, axis=(1, 2)))
    assert a.min() >= -1 and a.max() < 1 and a.std() > 0.5


def test_far_index_is_cheap_and_reproducible():
    far = matrices.generate("random", 16, np.float64, seed=0, start=10**9, stop=10**9 + 3)
    again = matrices.generate("random", 16, np.float64, seed=0, start=10**9 + 1, stop=10**9 + 2)
    np.testing.assert_array_equal(far[1:2], again)


def test_precisions_hold_the_same_matrices_up_to_rounding():
    a64 = matrices.generate("random", 6, np.float64, seed=4, stop=10)
    a32 = matrices.generate("random", 6, np.float32, seed=4, stop=10)
    np.testing.assert_array_equal(a32, a64.astype(np.float32))
    c128 = matrices.generate("random", 6, np.complex128, seed=4, stop=10)
    assert np.all(c128.imag != 0)
    np.testing.assert_array_equal(matrices.generate("random", 6, np.complex64, seed=4, stop=10),
                                  c128.astype(np.complex64))


@pytest.mark.parametrize("dtype", DTYPES)
def test_illcond_is_ill_conditioned(dtype):
    a = matrices.generate("illcond", 24, dtype, seed=6, stop=5)
    wide = a.astype(np.complex128 if np.dtype(dtype).kind == "c" else np.float64)
    cond = np.linalg.cond(wide)
    target = matrices.illcond_target(dtype)
    assert target == (1e12 if np.finfo(dtype).bits == 64 else 1e5)
    assert np.all(cond > target / 3) and np.all(cond < target * 3), cond
    # Not a scaled identity in disguise: entries are spread out.
    assert np.all(np.abs(wide).std(axis=(1, 2)) > 1e-3)


def test_singular_mix_holds_every_bad_kind():
    count = 250
    a = matrices.generate("singular-mix", 6, np.float64, seed=8, stop=count)
    masks = matrices.singular_mix_masks(0, count)
    for name, mask in masks.items():
        assert mask.any(), name
    assert sum(m.astype(int) for m in masks.values()).max() == 1, "masks overlap"
    clean = ~np.any(list(masks.values()), axis=0)
    assert clean.sum() > count // 2
    assert np.isnan(a[masks["nan"]]).any(axis=(1, 2)).all()
    assert np.isinf(a[masks["inf"]]).any(axis=(1, 2)).all()
    assert np.isfinite(a[~(masks["nan"] | masks["inf"])]).all()
    assert np.all(a[masks["zero"]] == 0)
    assert np.all((a[masks["singular"]] == 0).all(axis=1).any(axis=1)), "a zero column"
    assert np.all(np.count_nonzero(a[masks["singular"]], axis=(1, 2)) == 6 * 5), "only that column"
    _, _, info = kernels.lu_factor(a)
    assert np.all(info[clean] == 0)
    assert np.all(info[masks["singular"] | masks["zero"]] > 0)
    assert np.all(info[masks["nan"] | masks["inf"]] == -1)
    # Outside the bad ones, singular-mix is the random collection itself.
    r = matrices.generate("random", 6, np.float64, seed=8, stop=count)
    np.testing.assert_array_equal(a[clean], r[clean])


def test_singular_mix_masks_depend_on_the_global_index():
    whole = matrices.singular_mix_masks(0, 500)
    part = matrices.singular_mix_masks(123, 456)
    for name in whole:
        np.testing.assert_array_equal(part[name], whole[name][123:456])


@pytest.mark.parametrize("dtype", DTYPES)
def test_rhs(dtype):
    vec = matrices.rhs(5, None, dtype, seed=3, start=10, stop=20)
    assert vec.shape == (10, 5) and vec.dtype == dtype and vec.flags.c_contiguous
    mat = matrices.rhs(5, 4, dtype, seed=3, start=10, stop=20)
    assert mat.shape == (10, 5, 4) and mat.dtype == dtype
    np.testing.assert_array_equal(matrices.rhs(5, 4, dtype, seed=3, start=0, stop=20)[10:], mat)
    np.testing.assert_array_equal(np.concatenate([matrices.rhs(5, 4, dtype, seed=3, start=10, stop=13),
                                                  matrices.rhs(5, 4, dtype, seed=3, start=13, stop=20)]),
                                  mat)
    a = matrices.generate("random", 5, dtype, seed=3, start=10, stop=20)
    assert not np.isin(mat, a).any(), "right-hand sides must not reuse the matrices' stream"


def test_empty_ranges_and_sizes():
    assert matrices.generate("random", 4, np.float64, seed=0, start=5, stop=5).shape == (0, 4, 4)
    assert matrices.generate("illcond", 0, np.float32, seed=0, stop=3).shape == (3, 0, 0)
    assert matrices.generate("singular-mix", 1, np.float32, seed=0, stop=30).shape == (30, 1, 1)
    assert matrices.rhs(3, 0, np.float64, seed=0, stop=2).shape == (2, 3, 0)


@pytest.mark.parametrize("call,error", [
    (lambda: matrices.generate("hilbert", 3, np.float64, stop=2), ValueError),
    (lambda: matrices.generate("random", 3, np.float64, start=4, stop=2), ValueError),
    (lambda: matrices.generate("random", 3, np.float64, start=-1, stop=2), ValueError),
    (lambda: matrices.generate("random", -3, np.float64, stop=2), ValueError),
    (lambda: matrices.generate("random", 3, np.int32, stop=2), TypeError),
    (lambda: matrices.rhs(3, -1, np.float64, stop=2), ValueError),
    (lambda: matrices.rhs(3, 1, np.float16, stop=2), TypeError),
])
def test_bad_arguments(call, error):
    with pytest.raises(error, match="Expected .* Got .* instead"):
        call()
