"""verify recomputes LAPACK test ratios and catches wrong outputs; inspect summarises stores."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from batchlu import pipeline
from batchlu.pipeline import errors


@pytest.fixture(scope="module")
def outputs(client, stores, tmp_path_factory):
    root = tmp_path_factory.mktemp("verify")
    made = {}
    for op in pipeline.DENSE_OPS:
        made[op] = str(root / f"{op}.zarr")
        pipeline.run(stores["a"], made[op], op=op, rhs=stores["b"] if op == "solve" else None,
                     client=client, progress=False, config={"chunk": 10})
    return made


def _copy(src: str, dst) -> str:
    import shutil

    shutil.copytree(src, dst)
    return str(dst)


def test_verify_all_ops_ok(outputs, stores):
    for op, out in outputs.items():
        result = pipeline.verify(stores["a"], out)
        assert result.ok, result.summary()
        assert result.checked == 53 and not result.sampled and result.semantic_errors == 0
        assert 0 <= result.median_ratio <= result.max_ratio < 30
        assert result.singular > 0 and result.nonfinite > 0
        summary = result.summary()
        assert "OK" in summary and "max" in summary and "median" in summary and "over 30" in summary


def test_verify_sample(outputs, stores):
    result = pipeline.verify(stores["a"], outputs["inv"], sample=10, seed=4)
    assert result.ok and result.sampled and result.checked == 10
    assert "random sample of 10" in result.summary()
    big = pipeline.verify(stores["a"], outputs["inv"], sample=1000)
    assert big.checked == 53


# ---- tampering: one defect per rule of verify, applied to a real output, must fail verify -------------
# singular-mix (tests/pipeline/conftest.py, N 53, n 6, float64): 6, 13, ... exactly singular (a zero
# column), 10, 21, ... all zero, 12, 25, ... one NaN, 16, 33, ... one Inf; the others regular.
OK, SINGULAR, NAN = 0, 6, 12
N6 = 6
RESULT = {"lu": "lu", "inv": "inv", "solve": "x", "slogdet": "sign"}


def _tamper(src: str, dst, i: int, **changes) -> str:
    """A copy of output ``src`` with matrix ``i`` of each named array changed: a value to store, or a
    function of the stored value (an array of that matrix's shape) that returns the new one."""
    out = _copy(src, dst)
    for name, change in changes.items():
        arr = zarr.open_array(store=out, path=name, mode="r+")
        value = np.asarray(arr[i:i + 1])
        arr[i:i + 1] = change(np.array(value[0]))[None] if callable(change) else np.full_like(value, change)
    return out


def _one_element(x: np.ndarray, value, at: int = -1) -> np.ndarray:
    x.reshape(-1)[at] = value
    return x


def _fails(a: str, out: str, rule: str, index: int, invoke=None):
    """verify must fail ``out`` naming ``rule`` for matrix ``index``; the CLI must exit 1 saying why."""
    result = pipeline.verify(a, out)
    assert not result.ok and "FAILED" in result.summary()
    assert rule in result.failures, result.summary()
    assert f"matrix {index}: {rule}:" in result.summary(), result.summary()
    assert result.problems()
    if invoke is not None:
        cli = invoke("verify", a, out)
        assert cli.exit_code == 1, cli.output
        assert "verification failed" in cli.output and f"{rule}:" in cli.output
    return result


@pytest.fixture(scope="module")
def invoke():
    from click.testing import CliRunner

    from batchlu.workflows.cli import cli

    return lambda *args: CliRunner().invoke(cli, [str(x) for x in args], catch_exceptions=False)


def _names(op: str) -> set:
    from batchlu.pipeline._ops import output_specs

    return {spec.name for spec in output_specs(op, N6, "float64", "float64")}


def test_tamper_info_never_written(outputs, stores, tmp_path, invoke):
    from batchlu.pipeline._ops import INFO_NOT_COMPUTED

    out = _tamper(outputs["inv"], tmp_path / "o.zarr", OK, info=INFO_NOT_COMPUTED)
    result = _fails(stores["a"], out, "info-written", OK, invoke)
    assert set(result.failures) == {"info-written"}


@pytest.mark.parametrize("code", [-5, N6 + 1])
def test_tamper_info_unknown_code(outputs, stores, tmp_path, code):
    out = _tamper(outputs["inv"], tmp_path / "o.zarr", OK, info=code)
    result = _fails(stores["a"], out, "info-code", OK)
    assert f"info {code} is not a code" in result.summary()


@pytest.mark.parametrize("op", pipeline.DENSE_OPS)
def test_tamper_nonfinite_input_not_flagged(outputs, stores, tmp_path, op):
    """A NaN input reported as ok (info 0)."""
    _fails(stores["a"], _tamper(outputs[op], tmp_path / "o.zarr", NAN, info=0), "nonfinite-flagged", NAN)


@pytest.mark.parametrize("op", pipeline.DENSE_OPS)
def test_tamper_finite_input_flagged_nonfinite(outputs, stores, tmp_path, op):
    """A regular matrix reported as non-finite, its outputs made NaN as for one: only info is wrong."""
    nan = {name: np.nan for name in ("lu", "inv", "x", "sign", "logabsdet") if name in _names(op)}
    piv = {"piv": lambda piv: np.arange(N6)} if op == "lu" else {}
    out = _tamper(outputs[op], tmp_path / "o.zarr", OK, info=-1, **nan, **piv)
    result = _fails(stores["a"], out, "nonfinite-only", OK)
    assert set(result.failures) == {"nonfinite-only"}


@pytest.mark.parametrize("op,name,value", [
    ("lu", "lu", 1.0), ("lu", "piv", 1), ("inv", "inv", 1.0), ("solve", "x", 1.0),
    ("slogdet", "sign", 1.0), ("slogdet", "logabsdet", 0.0)])
def test_tamper_nonfinite_outputs(outputs, stores, tmp_path, invoke, op, name, value):
    """A non-finite input's outputs must be all NaN and (lu) its pivots the identity: one element off
    (for piv: row 0 swapped with row 1, a valid pivot)."""
    at = 0 if name == "piv" else -1
    out = _tamper(outputs[op], tmp_path / "o.zarr", NAN, **{name: lambda x: _one_element(x, value, at)})
    result = _fails(stores["a"], out, "nan-outputs", NAN, invoke)
    assert set(result.failures) == {"nan-outputs"}


@pytest.mark.parametrize("op", pipeline.DENSE_OPS)
def test_tamper_regular_matrix_flagged_singular(outputs, stores, tmp_path, op):
    """A regular matrix reported as singular, with the outputs of a singular one (lu: its factors)."""
    outs = {"inv": {"inv": np.nan}, "solve": {"x": np.nan}, "slogdet": {"sign": 0.0, "logabsdet": -np.inf},
            "lu": {}}[op]
    out = _tamper(outputs[op], tmp_path / "o.zarr", OK, info=1, **outs)
    result = _fails(stores["a"], out, "singular-claim", OK)
    assert set(result.failures) == ({"singular-claim", "zero-pivot"} if op == "lu" else {"singular-claim"})


@pytest.mark.parametrize("op,name,value", [("inv", "inv", 1.0), ("solve", "x", 1.0),
                                           ("slogdet", "sign", 1.0), ("slogdet", "logabsdet", 0.0)])
def test_tamper_singular_outputs(outputs, stores, tmp_path, invoke, op, name, value):
    out = _tamper(outputs[op], tmp_path / "o.zarr", SINGULAR, **{name: lambda x: _one_element(x, value)})
    result = _fails(stores["a"], out, "singular-outputs", SINGULAR, invoke)
    assert set(result.failures) == {"singular-outputs"}


def test_tamper_lu_info_not_the_first_zero_pivot(outputs, stores, tmp_path, invoke):
    info = int(np.asarray(zarr.open_array(store=outputs["lu"], path="info")[SINGULAR]))
    assert info > 0
    out = _tamper(outputs["lu"], tmp_path / "o.zarr", SINGULAR, info=info + 1 if info < N6 else info - 1)
    result = _fails(stores["a"], out, "zero-pivot", SINGULAR, invoke)
    assert set(result.failures) == {"zero-pivot"}


@pytest.mark.parametrize("at,value", [(0, N6), (3, 2), (5, -1)])
def test_tamper_piv_out_of_range(outputs, stores, tmp_path, at, value):
    out = _tamper(outputs["lu"], tmp_path / "o.zarr", OK, piv=lambda piv: _one_element(piv, value, at))
    result = _fails(stores["a"], out, "piv-range", OK)
    assert set(result.failures) == {"piv-range"}


@pytest.mark.parametrize("op,value", [("lu", np.nan), ("inv", np.inf), ("solve", np.nan),
                                      ("slogdet", np.nan)])
def test_tamper_ok_result_not_finite(outputs, stores, tmp_path, op, value):
    out = _tamper(outputs[op], tmp_path / "o.zarr", OK, **{RESULT[op]: lambda x: _one_element(x, value)})
    result = _fails(stores["a"], out, "finite-result", OK)
    assert result.max_ratio == np.inf  # and its test ratio is infinite


@pytest.mark.parametrize("op,name,rule", [("lu", "lu", "dget01"), ("inv", "inv", "dget03"),
                                          ("solve", "x", "dget02")])
def test_tamper_lapack_ratio(outputs, stores, tmp_path, invoke, op, name, rule):
    out = _tamper(outputs[op], tmp_path / "o.zarr", OK,
                  **{name: lambda x: _one_element(x, x.reshape(-1)[-1] + 1)})
    result = _fails(stores["a"], out, rule, OK, invoke)
    assert set(result.failures) == {rule} and result.over_threshold == 1 and result.max_ratio > 30
    assert "1 matrix with a test ratio over 30" in invoke("verify", stores["a"], out).output


def test_tamper_swapped_pivots(outputs, stores, tmp_path):
    """A valid pivot sequence, but not the one of these factors."""
    out = _tamper(outputs["lu"], tmp_path / "o.zarr", OK,
                  piv=lambda piv: _one_element(piv, (piv[0] + 1) % N6, 0))
    result = _fails(stores["a"], out, "dget01", OK)
    assert set(result.failures) == {"dget01"}


def test_tamper_slogdet_logabsdet(outputs, stores, tmp_path, invoke):
    """logabsdet off by 1000 n eps (1.3e-12): well above the rounding error of a 6 x 6 determinant."""
    eps = np.finfo(np.float64).eps
    out = _tamper(outputs["slogdet"], tmp_path / "o.zarr", OK, logabsdet=lambda x: x + 1000 * N6 * eps)
    result = _fails(stores["a"], out, "logabsdet", OK, invoke)
    assert set(result.failures) == {"logabsdet"}


def test_tamper_slogdet_sign(outputs, stores, tmp_path, invoke):
    out = _tamper(outputs["slogdet"], tmp_path / "o.zarr", OK, sign=lambda s: -s)
    result = _fails(stores["a"], out, "sign", OK, invoke)
    assert set(result.failures) == {"sign"}


def test_tamper_slogdet_real_sign_modulus(outputs, stores, tmp_path):
    """A real sign must be exactly +-1: 1 + 2 eps is close to it, but not a sign."""
    eps = np.finfo(np.float64).eps
    out = _tamper(outputs["slogdet"], tmp_path / "o.zarr", OK, sign=lambda s: s * (1 + 2 * eps))
    result = _fails(stores["a"], out, "sign-modulus", OK)
    assert set(result.failures) == {"sign-modulus"}


# ---- slogdet in single precision at n = 128: correct outputs pass, wrong ones fail, every matrix ----
@pytest.fixture(scope="module")
def slogdet128(client, tmp_path_factory):
    root = tmp_path_factory.mktemp("slogdet128")
    made = {}
    for dtype in ("float32", "complex64"):
        a = pipeline.generate(root / f"a-{dtype}.zarr", count=12, size=128, chunk=4, dtype=dtype,
                              kind="random", seed=8)
        out = str(root / f"slogdet-{dtype}.zarr")
        pipeline.run(a, out, op="slogdet", client=client, progress=False)
        made[dtype] = (a, out)
    return made


@pytest.mark.parametrize("dtype", ["float32", "complex64"])
def test_slogdet128_correct_outputs_pass(slogdet128, dtype):
    a, out = slogdet128[dtype]
    result = pipeline.verify(a, out)
    assert result.ok and result.ratios == 12 and result.max_ratio < 30, result.summary()


def _tamper_all(src: str, dst, name: str, change) -> str:
    out = _copy(src, dst)
    arr = zarr.open_array(store=out, path=name, mode="r+")
    arr[...] = change(np.asarray(arr[...]))
    return out


@pytest.mark.parametrize("dtype", ["float32", "complex64"])
@pytest.mark.parametrize("wrong", ["sign", "logabsdet"])
def test_slogdet128_wrong_outputs_fail_every_matrix(slogdet128, tmp_path, dtype, wrong):
    """A wrong sign (-sign real, sign * 1j complex) or logabsdet + 100 n eps fails for each of the
    12 matrices at n = 128 (the old bound, 30 n eps cond1(A), let both through)."""
    a, src = slogdet128[dtype]
    eps = np.finfo(dtype).eps
    if wrong == "sign":
        out = _tamper_all(src, tmp_path / "o.zarr", "sign", lambda s: s * 1j if dtype == "complex64" else -s)
    else:
        out = _tamper_all(src, tmp_path / "o.zarr", "logabsdet", lambda x: x + np.float32(100 * 128 * eps))
    result = pipeline.verify(a, out)
    assert not result.ok and result.failures == {wrong: 12} and result.over_threshold == 12, result.summary()


def test_slogdet_complex_sign_modulus(slogdet128, tmp_path):
    a, src = slogdet128["complex64"]
    out = _tamper(src, tmp_path / "o.zarr", 3, sign=lambda s: s * np.float32(1 + 1e-3))
    result = _fails(a, out, "sign-modulus", 3)
    assert result.failures["sign-modulus"] == 1


# ---- scale, n = 0, incomplete outputs ------------------------------------------------------------
@pytest.mark.parametrize("scale", [1e300, 1e-300])
def test_verify_slogdet_of_scaled_matrices(client, tmp_path, scale):
    """log|det| of 8 x 8 matrices scaled by 1e+-300 is about +-5500, where one ulp is 4096 eps: results
    right to an ulp pass (the old check, |error| / (n eps cond1), failed the exact ones: ratio 30-32 and
    49-60 one ulp off), and a wrong sign still fails."""
    from batchlu.testing import matrices

    a = matrices.generate("random", 8, "float64", seed=3, stop=200) * scale
    store = zarr.create_array(str(tmp_path / "a.zarr"), shape=a.shape, dtype=a.dtype, chunks=(50, 8, 8))
    store[...] = a
    out = str(tmp_path / "slogdet.zarr")
    pipeline.run(str(tmp_path / "a.zarr"), out, op="slogdet", client=client, progress=False)
    logabsdet = zarr.open_array(store=out, path="logabsdet")[...]
    assert (np.abs(logabsdet) > 5000).all()
    result = pipeline.verify(str(tmp_path / "a.zarr"), out)
    assert result.ok and result.ratios == 200, result.summary()
    ulp_off = _tamper_all(out, tmp_path / "ulp.zarr", "logabsdet", lambda x: np.nextafter(x, np.inf))
    result = pipeline.verify(str(tmp_path / "a.zarr"), ulp_off)
    assert result.ok, result.summary()
    flipped = _tamper(out, tmp_path / "bad.zarr", 4, sign=lambda s: -s)
    _fails(str(tmp_path / "a.zarr"), flipped, "sign", 4)


@pytest.mark.parametrize("op,scale", [("inv", 1e-308), ("lu", 1e308), ("solve", 1e-308)])
def test_verify_judges_results_at_the_ends_of_the_range(client, tmp_path, op, scale):
    """4 x 4 matrices times 1e-308 (||A^-1||_1 and ||x||_1 overflow) or 1e308 (||A||_1 overflows):
    the run's results pass, and every info-0 result halved fails. An infinite norm made the ratio 0:
    verify said OK over 42 halved inverses (dget03 max 0), and over most halved factors and
    solutions."""
    from batchlu.testing import matrices

    a = matrices.generate("random", 4, "float64", seed=3, stop=200) * scale
    zarr.create_array(str(tmp_path / "a.zarr"), data=a, chunks=(50, 4, 4))
    rhs = None
    if op == "solve":
        rhs = str(tmp_path / "b.zarr")
        zarr.create_array(rhs, data=matrices.rhs(4, 2, "float64", seed=4, stop=200), chunks=(50, 4, 2))
    out = str(tmp_path / "out.zarr")
    pipeline.run(str(tmp_path / "a.zarr"), out, op=op, rhs=rhs, client=client, progress=False)
    info = np.asarray(zarr.open_array(store=out, path="info")[...])
    rule = {"inv": "dget03", "lu": "dget01", "solve": "dget02"}[op]
    right = pipeline.verify(str(tmp_path / "a.zarr"), out)
    assert right.ok and right.ratios == (info == 0).sum() >= 40, right.summary()
    halved = _tamper_all(out, tmp_path / "halved.zarr", RESULT[op],
                         lambda x: np.where((info == 0).reshape((-1,) + (1,) * (x.ndim - 1)), x / 2, x))
    result = pipeline.verify(str(tmp_path / "a.zarr"), halved)
    assert not result.ok and result.failures == {rule: right.ratios}, result.summary()


def test_singular_claim_judged_at_any_scale():
    """A regular matrix times 1e308 reported singular (info 1, NaN inverse): its sigma_max was
    infinite, the ratio sigma_min / sigma_max 0, and the false claim passed."""
    from batchlu.pipeline.verify._rules import Block, rules_for
    from batchlu.testing import matrices

    a = matrices.generate("random", 6, "float64", seed=3, stop=4) * 1e308
    info = np.array([1, 0, 1, 0], np.int32)
    blk = Block("inv", a, {"inv": np.full_like(a, np.nan), "info": info})
    (claim,) = [rule for rule in rules_for("inv") if rule.name == "singular-claim"]
    assert (claim.check(blk)[info == 1] > 30).all()


@pytest.fixture(scope="module")
def empty_outputs(client, tmp_path_factory):
    """Every op on 5 matrices of size 0 x 0 (det 1, empty inverses and solutions)."""
    root = tmp_path_factory.mktemp("empty")
    a = zarr.create_array(str(root / "a.zarr"), shape=(5, 0, 0), dtype="float64", chunks=(2, 1, 1))
    b = zarr.create_array(str(root / "b.zarr"), shape=(5, 0), dtype="float64", chunks=(2, 1))
    a[...], b[...] = np.empty((5, 0, 0)), np.empty((5, 0))
    made = {}
    for op in pipeline.DENSE_OPS:
        made[op] = str(root / f"{op}.zarr")
        pipeline.run(str(root / "a.zarr"), made[op], op=op, rhs=str(root / "b.zarr") if op == "solve" else None,
                     client=client, progress=False, config={"chunk": 2})
    return str(root / "a.zarr"), made


@pytest.mark.parametrize("op", pipeline.DENSE_OPS)
def test_verify_n0(empty_outputs, invoke, tmp_path, op):
    a, outs = empty_outputs
    result = pipeline.verify(a, outs[op])
    assert result.ok and result.checked == 5 and result.ratios == 5, result.summary()
    assert invoke("verify", a, outs[op]).exit_code == 0
    if op == "slogdet":  # and a wrong determinant of the empty matrix is caught
        _fails(a, _tamper(outs[op], tmp_path / "bad.zarr", 2, logabsdet=1.0), "logabsdet", 2)


def test_resume_n0(empty_outputs, client):
    """An empty output stores no chunk files (zarr writes none for 0 x 0 matrices), and resume's
    check of the stored chunks knows it: the run resumes, and the output still verifies."""
    a, outs = empty_outputs
    pipeline.run(a, outs["inv"], op="inv", client=client, progress=False, resume=True, config={"chunk": 2})
    result = pipeline.verify(a, outs["inv"])
    assert result.ok and result.checked == 5, result.summary()


def test_verify_reports_incomplete(outputs, stores, tmp_path, invoke):
    out = _copy(outputs["inv"], tmp_path / "part.zarr")
    zarr.open_array(store=out, path="_complete", mode="r+")[2:4] = False
    group = zarr.open_group(out, mode="r+")
    group.attrs["batchlu"] = {**group.attrs["batchlu"], "status": "running"}
    result = pipeline.verify(stores["a"], out)
    assert not result.ok and not result.complete and result.checked == 33
    assert not result.failures and result.over_threshold == 0  # what was computed is right
    summary = result.summary()
    assert "INCOMPLETE" in summary and "4 of 6 chunks" in summary and "chunks 2-3 (matrices 20-39)" in summary
    cli = invoke("verify", stores["a"], out)
    assert cli.exit_code == 1
    error = cli.output.split("Error:")[-1]
    assert "incomplete: 20 matrices in 2 of 6 chunks not computed (chunks 2-3 (matrices 20-39))" in error
    assert "status 'running'" in error and "ratio" not in error


def test_verify_reports_an_unfinished_run(outputs, stores, tmp_path, invoke):
    """Every chunk recorded, but the run never wrote its final status."""
    out = _copy(outputs["lu"], tmp_path / "part.zarr")
    group = zarr.open_group(out, mode="r+")
    group.attrs["batchlu"] = {**group.attrs["batchlu"], "status": "running"}
    result = pipeline.verify(stores["a"], out)
    assert not result.ok and not result.failures
    assert result.problems() == ["its run did not finish (status 'running')"]
    assert invoke("verify", stores["a"], out).exit_code == 1


def test_verify_refuses_other_things(outputs, stores, tmp_path):
    with pytest.raises(errors.InputError, match="batchlu output"):
        pipeline.verify(stores["a"], stores["b"])
    other = pipeline.generate(tmp_path / "o.zarr", count=20, size=6)
    with pytest.raises(errors.InputError, match="as recorded"):
        pipeline.verify(other, outputs["inv"])


def test_inspect_output(outputs):
    text = pipeline.inspect(outputs["lu"])
    for part in ("status: complete", "op lu", "float64", "N 53", "chunks: 6/6 complete",
                 "lu: shape (53, 6, 6) float64, chunks (10, 6, 6)", "piv: shape (53, 6) int32",
                 "info: ok", "singular", "non-finite"):
        assert part in text, part
    info = np.asarray(zarr.open_array(store=outputs["lu"], path="info")[...])
    assert f"ok {int((info == 0).sum())}" in text


def test_inspect_incomplete(outputs, tmp_path):
    out = _copy(outputs["slogdet"], tmp_path / "part.zarr")
    zarr.open_array(store=out, path="_complete", mode="r+")[0] = False
    group = zarr.open_group(out, mode="r+")
    group.attrs["batchlu"] = {**group.attrs["batchlu"], "status": "running"}
    text = pipeline.inspect(out)
    assert "status: running" in text and "5/6 complete" in text and "INCOMPLETE" in text
    assert "of 43 computed" in text


def test_inspect_inputs(stores, tmp_path):
    text = pipeline.inspect(stores["a"])
    assert "shape (53, 6, 6) float64" in text and "chunks (10, 6, 6)" in text
    assert "singular-mix" in text
    group = zarr.open_group(tmp_path / "g.zarr", mode="w")
    group.create_array("m", shape=(4, 2, 2), dtype="f4")
    assert "m: shape (4, 2, 2) float32" in pipeline.inspect(str(tmp_path / "g.zarr"))
    assert "shape (4, 2, 2)" in pipeline.inspect(f"{tmp_path / 'g.zarr'}:m")
    with pytest.raises(errors.InputNotFoundError):
        pipeline.inspect(str(tmp_path / "missing.zarr"))


@pytest.mark.parametrize("which", ["output", "input"])
def test_verify_names_an_unreadable_chunk(outputs, stores, tmp_path, which):
    """A truncated chunk file (of the output, or of the input): one error naming the file, not the
    codec's traceback."""
    import os
    import shutil

    out = _copy(outputs["inv"], tmp_path / "o.zarr")
    a = stores["a"]
    if which == "input":
        a = str(tmp_path / "a.zarr")
        shutil.copytree(stores["a"], a)
    folder = os.path.join(out, "inv") if which == "output" else a
    victim = sorted(os.path.join(d, f) for d, _, files in os.walk(os.path.join(folder, "c")) for f in files)[1]
    with open(victim, "r+b") as f:
        f.truncate(7)
    kind = errors.OutputError if which == "output" else errors.CorruptInputError
    with pytest.raises(kind, match=f"unreadable chunk file {victim} "):
        pipeline.verify(a, out)


def test_verify_names_an_output_chunk_with_a_flipped_byte(client, stores, tmp_path, invoke):
    """Bit rot in an output chunk: the low byte of one stored value flipped passed every rule, and
    verify said OK. Every output chunk carries its CRC-32C now: verify names the chunk file, in one
    line, and exits 1."""
    out = tmp_path / "o.zarr"
    pipeline.run(stores["a"], out, op="inv", client=client, progress=False,
                 config={"chunk": 10, "output-codec": "none"})
    assert pipeline.verify(stores["a"], str(out)).ok
    victim = out / "inv" / "c" / "2" / "0" / "0"
    data = bytearray(victim.read_bytes())
    data[0] ^= 0x01   # the least significant byte of inv[20, 0, 0]
    victim.write_bytes(bytes(data))
    with pytest.raises(errors.OutputError, match=f"unreadable chunk file {victim} \\(matrices 20:30\\) .*checksum"):
        pipeline.verify(stores["a"], str(out))
    cli = invoke("verify", stores["a"], out)
    lines = [line for line in cli.output.splitlines() if line.strip()]
    assert cli.exit_code == 1 and len(lines) == 1 and str(victim) in lines[0], cli.output


@pytest.mark.parametrize("edit,expected", [
    (lambda r: {**r, "op": "lu"}, "outputs .* lack \\['lu', 'piv'\\] of op lu"),
    (lambda r: {"status": "complete"}, "op None, not one of"),
    (lambda r: {k: v for k, v in r.items() if k != "plan"}, "without 'plan'"),
])
def test_an_edited_provenance_is_one_error_for_verify_and_readable_for_inspect(outputs, stores, tmp_path,
                                                                                edit, expected):
    """verify reads op, n, N, plan, input and outputs from the record: an edited one is named, not a
    KeyError traceback; inspect still describes the group."""
    out = _copy(outputs["inv"], tmp_path / "o.zarr")
    group = zarr.open_group(out, mode="r+")
    group.attrs["batchlu"] = edit(dict(group.attrs["batchlu"]))
    with pytest.raises(errors.InputError, match=f"provenance of .*{expected}.*was it edited"):
        pipeline.verify(stores["a"], out)
    text = pipeline.inspect(out)
    assert text.startswith("batchlu output") and "info: ok" in text


def _edit_record(out: str, field: str, value) -> None:
    """Set the provenance's ``field`` (``key`` or ``key.sub``) of output ``out`` to ``value``."""
    group = zarr.open_group(out, mode="r+")
    record = dict(group.attrs["batchlu"])
    key, _, sub = field.partition(".")
    record[key] = {**record[key], sub: value} if sub else value
    group.attrs["batchlu"] = record


@pytest.mark.parametrize("op,field,value,says", [
    ("inv", "N", 30, "N = 30 recorded, but the output array inv holds 53 matrices"),
    ("inv", "N", 0, "N = 0 recorded, but the output array inv holds 53 matrices"),
    ("inv", "N", -5, "N = -5 recorded, not a whole number"),
    ("inv", "N", 10**7, "N = 10000000 recorded, but the output array inv holds 53 matrices"),
    ("inv", "N", "53", "N = '53' recorded, not a whole number"),
    ("inv", "n", 5, "n = 5 recorded, but the output array inv has shape \\(53, 6, 6\\)"),
    # 9 makes as many chunks of 53 as 10 does: the ledger's length alone would not tell
    ("inv", "plan.chunk", 9, "plan.chunk = 9 recorded, but the output array inv is stored in chunks of 10 "),
    ("inv", "input", "A.ZARR", "input = '.*' recorded, not a mapping"),
    ("inv", "input.shape", [53, 6, 7], "Expected an input of shape \\(53, 6, 7\\) .* as recorded .*input.shape"),
    ("inv", "input.dtype", "float32", "Expected an input of shape \\(53, 6, 6\\) and dtype float32, as recorded"),
    ("inv", "dtype", "float32", "dtype = 'float32' recorded, but the input .* is float64"),
    ("inv", "outputs", ["inv", "info", "lu"], "outputs = \\['inv', 'info', 'lu'\\] recorded, but op inv writes"),
    ("lu", "op", "slogdet", "outputs \\['lu', 'piv', 'info'\\] lack \\['logabsdet', 'sign'\\] of op slogdet"),
    ("solve", "rhs", "B.ZARR", "rhs = 'B.ZARR' recorded, not a mapping"),
    ("solve", "rhs.shape", [53, 7], "Expected a right-hand side of shape \\(53, 7\\) .* as recorded"),
])
def test_verify_checks_the_record_against_the_stored_arrays(outputs, stores, tmp_path, invoke, op, field,
                                                           value, says):
    """Each provenance field verify reads (N, n, plan.chunk, op, outputs, dtype, input, rhs) edited to
    a value the stored arrays contradict, over an output whose matrices 30: were zeroed: verify
    refuses it in one line naming the field, the value recorded and the one stored. N = 30 or 0 gave
    "OK - all 30 of 30 matrices" (-5: "all 0 of -5"), N = 10**7 a reshape error and input given as
    a string a traceback."""
    out = _copy(outputs[op], tmp_path / "o.zarr")
    result = zarr.open_array(out, path=RESULT[op], mode="r+")
    result[30:] = np.zeros(result[30:].shape, result.dtype)
    _edit_record(out, field, value)
    with pytest.raises(errors.InputError, match=says):
        pipeline.verify(stores["a"], out)
    cli = invoke("verify", stores["a"], out)
    lines = [line for line in cli.stderr.splitlines() if line.strip()]
    assert cli.exit_code == 1 and len(lines) == 1 and lines[0].startswith("Error: "), cli.output
    assert "OK" not in cli.stdout and "Traceback" not in cli.output


@pytest.mark.parametrize("field,value,says", [
    ("input", "A.ZARR", "input = 'A.ZARR' recorded, not a mapping"),
    ("plan.chunk", 9, "plan.chunk = 9 recorded, but the output array inv is stored in chunks of 10 "),
    ("N", 30, "N = 30 recorded, but the output array inv holds 53 matrices"),
    ("outputs", 3, "outputs 3 lack"),
])
def test_inspect_names_a_record_that_disagrees_with_the_stored_arrays(outputs, tmp_path, invoke, field, value,
                                                                     says):
    """inspect describes an output whose record was edited (input given as a string: a traceback; a
    plausible but wrong plan.chunk: info counts from a misread ledger, or an IndexError) with one
    line naming the field, and counts info over the stored matrices."""
    out = _copy(outputs["inv"], tmp_path / "o.zarr")
    zarr.open_array(out, path="_complete", mode="r+")[5] = False   # the last chunk (50:53) not computed
    _edit_record(out, field, value)
    cli = invoke("inspect", out)
    assert cli.exit_code == 0 and "Traceback" not in cli.output, cli.output
    edited = [line for line in cli.stdout.splitlines() if "RECORD EDITED?" in line]
    assert len(edited) == 1 and says in edited[0], cli.stdout
    info = np.asarray(zarr.open_array(store=out, path="info")[...])
    if field == "plan.chunk":   # the ledger cannot be read by a wrong chunk: every matrix is counted
        assert "of 53 computed" in cli.stdout and "every matrix" in edited[0]
    else:
        assert f"ok {int((info[:50] == 0).sum())} " in cli.stdout and "of 50 computed" in cli.stdout


def test_verify_of_a_run_killed_while_it_created_its_arrays(outputs, stores, tmp_path):
    """A run killed before it made all its arrays (status running, no inv, no ledger): one line that
    says to resume it, not that the record was edited; with status complete, the record is named."""
    import shutil

    out = _copy(outputs["inv"], tmp_path / "o.zarr")
    shutil.rmtree(f"{out}/inv")
    shutil.rmtree(f"{out}/_complete")
    _edit_record(out, "status", "running")
    with pytest.raises(errors.OutputError, match="to hold inv, _complete. .*status 'running'.*--resume"):
        pipeline.verify(stores["a"], out)
    _edit_record(out, "status", "complete")
    with pytest.raises(errors.InputError, match="op = 'inv' recorded, but the output holds no array 'inv'"):
        pipeline.verify(stores["a"], out)
