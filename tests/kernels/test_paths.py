"""Which GPU path each (op, dtype, n) takes (``batchlu.kernels._gpu._paths``), checked on the CPU
without CuPy: the own kernels wherever their launchers accept n, cuSOLVER exactly where they refuse,
so no n is left to an error, on the H100's shared memory and on smaller devices'."""

from __future__ import annotations

import contextlib
import subprocess
import sys

import numpy as np
import pytest

from batchlu.kernels._gpu import _cusolver, _getrf, _getri, _getrs, _paths
from batchlu.kernels._gpu._runtime import MAX_N

DTYPES = [np.float32, np.float64, np.complex64, np.complex128]
KERNEL_PATHS = {"lu_factor": {"getrf"}, "slogdet": {"getrf"}, "inv": {"tiny", "fused", "getri"},
                "solve": {"rows", "getrs"}, "lu_solve": {"getrs"}}
# H100 / H200, A100, and a device with 99 KiB per block (Ada, e.g. L40S)
SMEMS = [_paths.SMEM_H100, _paths.SMEM_A100, 101376]


def test_importing_the_paths_imports_no_cupy():
    code = ("import sys; from batchlu.kernels import tuning; from batchlu.kernels._gpu import _paths; "
            "import numpy as np; "
            "p = _paths.path('inv', np.float64, 1500, smem=_paths.SMEM_H100); "
            "print(p, 'cupy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["cusolver", "False"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_issue_sizes_on_the_h100(dtype):
    """n = 1500 raised for float64 and complex64 (getrf's panel did not fit): now cuSOLVER; n = 2000
    takes cuSOLVER for every op and dtype but float32's LU (its panel still fits), n = 2300 for all;
    n = 1024 stays on the kernels for every op."""
    smem = _paths.SMEM_H100
    for op in _paths.OPS:
        assert _paths.path(op, dtype, 1024, 3, smem) in KERNEL_PATHS[op]
        own = dtype == np.float32 and op in ("lu_factor", "slogdet")
        assert _paths.path(op, dtype, 2000, 3, smem) == ("getrf" if own else _paths.CUSOLVER)
        assert _paths.path(op, dtype, 2300, 3, smem) == _paths.CUSOLVER
    large = _paths.path("lu_factor", dtype, 1500, smem=smem) == _paths.CUSOLVER
    assert large == (dtype != np.float32)  # float32's panel of 1500 rows fits with NB = 8
    with pytest.raises(ValueError, match="fit in shared memory") if large else contextlib.nullcontext():
        _getrf.getrf_plan(dtype, 1500, smem)


@pytest.mark.parametrize("smem", SMEMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_getrf_boundary_is_where_the_panel_stops_fitting(dtype, smem):
    n0 = _paths.first_cusolver_n("lu_factor", dtype, smem)
    assert _paths.first_cusolver_n("slogdet", dtype, smem) == n0
    plan = _getrf.getrf_plan(dtype, n0 - 1, smem)          # the largest n of the kernels fits...
    assert _getrf.blocked_smem(dtype, n0 - 1, plan.tile, kb=plan.kb) <= smem
    with pytest.raises(ValueError, match="Expected n small enough for the GPU getrf panel"):
        _getrf.getrf_plan(dtype, n0, smem)                 # ...and the next one is what raised before
    smallest = min(_getrf.BLOCKED_NB[np.dtype(dtype).itemsize])
    assert _getrf.blocked_smem(dtype, n0, smallest) > smem


@pytest.mark.parametrize("smem", SMEMS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_every_n_has_a_path_its_launcher_accepts(dtype, smem):
    """n = 1 ... 4200: where the path is a kernel path, each launcher's own checks pass (getrf's plan,
    getri's and getrs' n and shared memory); elsewhere it is cuSOLVER, and the kernels refuse n."""
    for n in range(1, 4201):
        plan = _getrf.fitting_plan(dtype, n, smem)
        for op in _paths.OPS:
            for k in ((1, 16, 40) if op in ("solve", "lu_solve") else (1,)):
                chosen = _paths.path(op, dtype, n, k, smem)
                assert chosen in KERNEL_PATHS[op] | {_paths.CUSOLVER}, (op, n, chosen)
                kernels_fit = {
                    "getrf": plan is not None,
                    "tiny": _getri.inv_plan(dtype, n) == "tiny",
                    "fused": _getri.inv_plan(dtype, n) == "fused",
                    "getri": plan is not None and _getri.getri_fits(dtype, n, smem),
                    "rows": _getrs.solve_plan(dtype, n, k) == "rows",
                    "getrs": _getrs.getrs_fits(dtype, n, k, smem) and (op == "lu_solve" or plan is not None),
                }
                if chosen == _paths.CUSOLVER:
                    assert not any(kernels_fit[p] for p in KERNEL_PATHS[op]), (op, n, k)
                else:
                    assert kernels_fit[chosen], (op, n, k, chosen)


@pytest.mark.parametrize("dtype", DTYPES)
def test_inverse_and_solve_above_1024_go_to_cusolver(dtype):
    """getri and getrs run one thread per column (n <= MAX_N): above, cuSOLVER for every device."""
    for smem in SMEMS:
        for op in ("inv", "solve", "lu_solve"):
            assert _paths.path(op, dtype, MAX_N + 1, 3, smem) == _paths.CUSOLVER
    assert _paths.first_cusolver_n("inv", dtype, _paths.SMEM_H100) == MAX_N + 1
    assert _paths.first_cusolver_n("lu_solve", dtype, _paths.SMEM_H100, k=16) == MAX_N + 1
    assert not _getri.getri_fits(dtype, MAX_N + 1, 1 << 30)
    assert not _getrs.getrs_fits(dtype, MAX_N + 1, 1, 1 << 30)


def test_small_n_keep_their_fused_kernels():
    for dtype in DTYPES:
        top = _getri.TINY_MAX_N[np.dtype(dtype)]
        assert 5 <= top <= _getri.TINY_LIMIT
        assert _paths.path("inv", dtype, 2, smem=_paths.SMEM_H100) == "tiny"
        assert _paths.path("inv", dtype, top, smem=_paths.SMEM_H100) == "tiny"
        assert _paths.path("inv", dtype, top + 1, smem=_paths.SMEM_H100) == "fused"
        assert _paths.path("inv", dtype, 64, smem=_paths.SMEM_H100) == "fused"
        assert _paths.path("inv", dtype, 65, smem=_paths.SMEM_H100) == "getri"
        assert _paths.path("solve", dtype, 16, 1, _paths.SMEM_H100) == "rows"
        assert _paths.path("solve", dtype, 16, 64, _paths.SMEM_H100) == "rows"
        assert _paths.path("solve", dtype, 16, 65, _paths.SMEM_H100) == "getrs"  # k > GESV_ROWS_MAX_RHS
    assert _paths.path("solve", np.float32, 64, 64, _paths.SMEM_H100) == "rows"
    assert _paths.path("solve", np.float32, 65, 16, _paths.SMEM_H100) == "getrs"
    assert _paths.path("solve", np.complex128, 48, 16, _paths.SMEM_H100) == "rows"
    assert _paths.path("solve", np.complex128, 49, 16, _paths.SMEM_H100) == "getrs"


def test_rows_tiles_pad_n_to_their_step_and_take_a_blocks_bound():
    """rows_plan pads n to 8 by default and to ``step`` when given (n = 33: 40 or 36 columns); a
    ``minb`` replaces rows_min_blocks' bound in the kernel's name; the dispatch at n = 33 pads to 4;
    a negative step is refused."""
    from batchlu.errors import InputError

    assert _getrf.rows_plan(33, 5, 4).tile == (8, 4, 5, 10)
    assert _getrf.rows_plan(33, 5, 4, 4).tile == (8, 4, 5, 9)
    assert _getrf.rows_plan(33, 9, 8, 4).tile == (4, 8, 9, 5)
    plan = _getrf.rows_plan(33, 5, 4, 4, minb=13)
    assert _getrf.kernel_name(plan, np.float64, 33).endswith("5, 9, 13>")
    default = _getrf.rows_min_blocks(np.float64, plan.tile)
    assert default != 13
    assert _getrf.kernel_name(_getrf.rows_plan(33, 5, 4, 4), np.float64, 33).endswith(f"5, 9, {default}>")
    for dtype in DTYPES:
        tile = _getrf.fitting_plan(dtype, 33, _paths.SMEM_H100).tile
        rows, cols = tile[0] * tile[2], tile[1] * tile[3]
        assert rows >= 33 and cols >= 33 and rows * cols == 40 * 36  # 40 x 40 before
    with pytest.raises(InputError, match="step >= 0"):
        _getrf.rows_plan(33, 5, 4, -1)


def test_gesv_rows_passes_give_each_right_hand_side_lanes_of_one_warp():
    """gesv_rows_tile: getrf_rows' tile plus KR, the right-hand sides a pass: the warps times the power
    of two that first reaches min(k, 16) (16 on one warp), fewer where the table asks for more lanes
    each; three warps take multiples of 3 (a right-hand side's lanes must not span warps); none past
    the table or above 64 right-hand sides; every dispatched tile is one the launcher
    takes. The factors' shared memory rows are odd numbers of 16-byte words."""
    from batchlu.kernels._gpu import _gesv

    assert _gesv.gesv_rows_tile(np.float64, 33, 16) == (8, 4, 5, 9, 16)
    assert [_gesv.gesv_rows_tile(np.float64, 33, k)[4] for k in (1, 2, 3, 9)] == [1, 2, 4, 16]
    assert _gesv.gesv_rows_tile(np.complex128, 33, 16) == (4, 8, 9, 5, 8)  # at least 4 lanes each
    # 3 warps, 8 lanes each
    assert _gesv.gesv_rows_tile(np.float32, 96, 16, (4, 4, 0, 8)) == (24, 4, 4, 24, 12)
    assert _gesv.gesv_rows_tile(np.float32, 96, 2, (4, 4)) == (24, 4, 4, 24, 3)
    assert _gesv.gesv_rows_tile(np.float64, 65, 16) is None
    assert _gesv.gesv_rows_tile(np.float64, 33, 40) == (8, 4, 5, 9, 16)  # three passes
    assert _gesv.gesv_rows_tile(np.float64, 33, 65) is None
    for dtype, rows in _gesv.GESV_ROWS.items():  # every dispatched tile is one the launcher takes
        for n in range(1, rows[-1][0] + 1):
            for k in (1, 3, 16, 40, 64):
                tile = _gesv.gesv_rows_tile(dtype, n, k)
                assert tile is None or _gesv._valid_tile(tile, n), (dtype, n, k, tile)
    assert _gesv.gesv_rows_smem(np.complex64, (8, 4, 5, 9)) == 40 * 38 * 8  # 36 columns -> 19 words
    assert _gesv.gesv_rows_smem(np.complex128, (4, 8, 9, 5)) == 36 * 41 * 16
    assert _gesv.gesv_rows_smem(np.float32, (8, 4, 5, 9)) == 40 * 36 * 4  # 9 words


def test_solve_takes_gesv_rows_only_where_its_block_fits():
    """The fused solve where its table has a tile and the block's shared memory (the factors and the
    static arrays' bound) fits the device: on the H100 and A100 limits everywhere the table says; on
    a 64 KB device float64 n = 96 (75 KB of factors) and the others too large go to getrf + getrs."""
    from batchlu.kernels._gpu import _gesv

    for smem in (_paths.SMEM_H100, _paths.SMEM_A100, 65536, 49152):
        for dtype in DTYPES:
            for n in range(1, 129):
                for k in (1, 16, 64):
                    tile = _gesv.gesv_rows_tile(dtype, n, k)
                    got = _paths.path("solve", dtype, n, k, smem)
                    if tile is None:
                        assert got != "rows"
                        continue
                    need = _gesv.gesv_rows_smem(dtype, tile) + _gesv.gesv_rows_static_smem(dtype, tile)
                    assert got == ("rows" if need <= smem else "getrs"), (smem, dtype, n, k, got)
                    if smem >= _paths.SMEM_A100:
                        assert got == "rows"
    assert _paths.path("solve", np.float64, 96, 16, 65536) == "getrs"
    assert _paths.path("solve", np.float64, 64, 16, 65536) == "rows"
    assert _gesv.gesv_rows_static_smem(np.complex128, (4, 8, 9, 5, 8)) == 4496  # ptxas -v: 4320


def test_getrs_plan_takes_the_warp_kernel_except_where_the_block_one_measured_faster():
    """getrs_warp below GETRS_BLOCK's (n, k) corners, getrs_kernel from them on; a warp's right-hand
    sides are the fewest powers of two covering k, at most GETRS_WARP_KC_MAX, fewer where its shared
    memory would pass the budget; every plan up to MAX_N fits the A100's limit; a kind or KC it cannot
    launch is a one-line InputError before any GPU work."""
    from batchlu.errors import InputError
    from batchlu.kernels._gpu import _getrs

    assert _getrs.getrs_plan(np.float32, 128, 16) == ("warp", 16)
    assert _getrs.getrs_plan(np.float64, 128, 16) == ("warp", 8)  # two warps a matrix
    assert _getrs.getrs_plan(np.float64, 128, 3) == ("warp", 4)
    assert _getrs.getrs_plan(np.complex128, 128, 16) == ("warp", 8)
    assert _getrs.getrs_plan(np.complex128, 190, 16)[0] == "block"
    assert _getrs.getrs_plan(np.complex128, 190, 4)[0] == "warp"
    assert _getrs.getrs_plan(np.complex128, 190, 16, "warp") == ("warp", 4)  # 4 x 192 x 16 B of Y
    assert _getrs.getrs_plan(np.float64, 1024, 40)[0] == "block"
    assert _getrs.getrs_plan(np.float64, 1024, 1)[0] == "warp"
    for dtype in DTYPES:
        for n in (1, 2, 31, 32, 33, 100, 159, 160, 512, 1023, 1024):
            for k in (1, 2, 3, 16, 31, 32, 40, 64):
                kind, kc = _getrs.getrs_plan(dtype, n, k)
                block = any(n >= nmin and k >= kmin for nmin, kmin in _getrs.GETRS_BLOCK[np.dtype(dtype)])
                assert kind == ("block" if block else "warp"), (dtype, n, k)
                kc_warp = _getrs.getrs_plan(dtype, n, k, "warp")[1]
                assert kc_warp <= _getrs.GETRS_WARP_KC_MAX[np.dtype(dtype)] and kc_warp & (kc_warp - 1) == 0
                assert kc_warp >= min(k, _getrs.GETRS_WARP_KC_MAX[np.dtype(dtype)]) or (
                    _getrs._warp_smem(dtype, n, 2 * kc_warp) > _getrs._GETRS_WARP_SMEM), (dtype, n, k)
                assert _getrs.getrs_fits(dtype, n, k, _paths.SMEM_A100), (dtype, n, k)
                # a 48 KB device: getrs_kernel where getrs_warp's four warps would not fit
                small = _getrs.getrs_plan(dtype, n, k, smem=49152)
                assert small[0] == kind or _getrs._plan_smem(dtype, n, (kind, kc)) > 49152, (dtype, n, k)
    lu, piv, b = np.ones((2, 8, 8)), np.zeros((2, 8), np.int32), np.ones((2, 8, 3))
    with pytest.raises(InputError, match="Expected getrs kind"):
        _getrs.launch_getrs(lu, piv, b, np.empty_like(b), kind="thread")
    with pytest.raises(InputError, match="a getrs_warp KC among"):
        _getrs.launch_getrs(lu, piv, b, np.empty_like(b), kind="warp", kc=3)


@pytest.mark.parametrize("tile", [(8, 4, 5, 9), (32, 3, 1, 12, 3), (1, 64, 5, 1, 2), (1, 32, 33, 2, 1),
                                  (-32, -1, -1, -64, 1), (8.0, 4, 5, 9, 16), (8, 4, 5, 9, 0),
                                  (8, 4, 5, 9, 3), (24, 4, 4, 24, 16), (8, 4, 4, 9, 16), (True, 32, 33, 2, 1)])
def test_gesv_rows_refuses_a_tile_it_cannot_launch(tile):
    """A tile that would not compile or not hold the matrix (TJ not dividing 32, RR above the 32-bit
    row mask, not whole warps, a right-hand side's lanes across warps, too few rows) is a one-line
    InputError before any GPU work (NumPy arrays: no CuPy is needed to get there)."""
    from batchlu.errors import InputError
    from batchlu.kernels._gpu import _gesv

    a, b = np.ones((2, 33, 33)), np.ones((2, 33, 4))
    with pytest.raises(InputError, match="Expected a gesv_rows tile"):
        _gesv.launch_gesv_rows(a, b, np.empty_like(b), np.empty(2, np.int32), tile)


def test_unknown_op_is_refused():
    with pytest.raises(ValueError, match="Expected op among"):
        _paths.path("det", np.float64, 10, smem=_paths.SMEM_H100)


@pytest.mark.parametrize("batch, lane_bytes, lanes", [
    (1, 1, 1), (3, 10 << 20, 3), (10, 10 << 20, _cusolver.MAX_LANES),
    (2, 256 << 20, 2),           # n = 4096 complex128: two lanes of 256 MiB
    (3, 256 << 20, 2), (5, 1 << 30, 1), (7, 200 << 20, 2)])
def test_lanes_one_per_matrix_within_their_memory(batch, lane_bytes, lanes):
    got = _cusolver.lanes_for(batch, lane_bytes)
    assert got == lanes
    assert 1 <= got <= batch and (got == 1 or got * lane_bytes <= _cusolver.LANE_BYTES)
