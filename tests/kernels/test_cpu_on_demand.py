"""``batchlu.kernels._cpu.numba_on_demand`` (the pipeline's CPU tasks compute in it): ``inv`` and
``solve`` in the compiled engine's LAPACK range give the compiled engine's results bit for bit, in
every dtype, ordinary and awkward matrices alike (subnormal and huge entries, a subnormal scale,
zero columns, NaN and Inf in the matrix or the right-hand side, near singular); a batch of ordinary
matrices loads no numba, an awkward one does; and a CPU run of ``inv`` at such an n loads none and
writes the compiled engine's inverses. Each check runs in a fresh interpreter: numba must not be
loaded before it starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytest.importorskip("batchlu.kernels._cpu_numba", reason="numba is not importable")

# make the batches, compute them on demand, then (numba loaded, BATCHLU_CPU_ENGINE=compiled) again on
# the compiled engine; print which differ and whether numba was loaded by the on-demand calls
_SCRIPT = textwrap.dedent("""
    import json, os, sys
    import numpy as np
    from batchlu import kernels
    from batchlu.kernels import _cpu

    awkward, seed = sys.argv[1] == "awkward", int(sys.argv[2])
    rng = np.random.default_rng(seed)
    cases = []
    for dtype in ("float32", "float64", "complex64", "complex128"):
        for op in ("inv", "solve"):
            n = max(_cpu.COMPILED_LAPACK_MIN_N[op][_cpu._DTYPE_INDEX[np.dtype(dtype).char]], 10)
            for n in (n, n + 23, 200):   # 200: OpenBLAS threads its getrf/getri there (rounds otherwise)
                a = rng.standard_normal((24, n, n))
                b = rng.standard_normal((24, n, 3))
                if dtype.startswith("complex"):
                    a, b = a + 1j * rng.standard_normal(a.shape), b + 1j * rng.standard_normal(b.shape)
                a, b = a.astype(dtype), b.astype(dtype)
                if awkward:
                    real = a.view(np.finfo(a.dtype).dtype)
                    fi = np.finfo(real.dtype)
                    real[1, 2, 3] = fi.tiny * 1e-3            # a subnormal entry
                    a[2] *= fi.tiny * 8                       # a matrix at the bottom of the range
                    a[3] *= fi.max / 8                        # ... and at the top
                    a[4, :, 5] = 0                            # a zero column: info > 0
                    a[5, 1, 1] = np.nan
                    a[6, 0, 2] = np.inf
                    a[7] = a[8]
                    a[7, -1] = a[7, 0] * (1 + fi.eps)          # near singular
                    b[9, 0, 0] = np.nan
                    with np.errstate(over="ignore"):
                        a[10] *= fi.max / 2                   # overflows on the way
                cases.append((op, a, b))
    with _cpu.numba_on_demand():
        got = [kernels.inv(a) if op == "inv" else kernels.solve(a, b) for op, a, b in cases]
    loaded = "numba" in sys.modules
    os.environ["BATCHLU_CPU_ENGINE"] = "compiled"
    differ = []
    for i, ((op, a, b), results) in enumerate(zip(cases, got)):
        ref = kernels.inv(a) if op == "inv" else kernels.solve(a, b)
        for x, y in zip(results, ref):
            if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
                differ.append(f"{op} {a.dtype} n={a.shape[-1]}")
    print(json.dumps({"loaded": loaded, "differ": differ, "cases": len(cases)}))
""")


# OpenBLAS as a user's process has it: threaded (this test session keeps it to one thread, see
# tests/conftest.py). Its threaded getrf/getri round otherwise than its one-thread code, which the
# compiled engine runs; two threads force that code even on one core.
_THREADED = {**os.environ, "OPENBLAS_NUM_THREADS": "2", "OMP_NUM_THREADS": "2"}


def _run(kind: str, seed: int) -> dict:
    done = subprocess.run([sys.executable, "-c", _SCRIPT, kind, str(seed)], capture_output=True, text=True,
                          timeout=600, env=_THREADED)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_ordinary_matrices_are_the_compiled_engines_bit_for_bit_and_load_no_numba():
    found = _run("ordinary", 61)
    assert found["cases"] == 24
    assert found["differ"] == []
    assert found["loaded"] is False


def test_awkward_matrices_are_the_compiled_engines_bit_for_bit_numba_loaded_for_them():
    found = _run("awkward", 67)
    assert found["cases"] == 24
    assert found["differ"] == []
    assert found["loaded"] is True


def test_a_cpu_run_of_inv_loads_no_numba_and_writes_the_compiled_engines_inverses(tmp_path):
    script = textwrap.dedent(f"""
        import json, os, sys
        import numpy as np, zarr
        import batchlu
        from batchlu.testing import matrices
        a = matrices.generate("random", 200, "float64", seed=71, start=0, stop=90)
        zarr.create_array({str(tmp_path / "in.zarr")!r}, shape=a.shape, dtype=a.dtype, chunks=(20, 200, 200))[...] = a
        batchlu.run({str(tmp_path / "in.zarr")!r}, {str(tmp_path / "out.zarr")!r}, op="inv", backend="cpu",
                    progress=False)
        loaded = "numba" in sys.modules
        got = zarr.open_array({str(tmp_path / "out.zarr")!r}, path="inv", mode="r")[...]
        info = zarr.open_array({str(tmp_path / "out.zarr")!r}, path="info", mode="r")[...]
        os.environ["BATCHLU_CPU_ENGINE"] = "compiled"
        ref, ref_info = batchlu.kernels.inv(a)
        print(json.dumps({{"loaded": loaded, "same": got.tobytes() == ref.tobytes(),
                          "info": info.tolist() == ref_info.tolist() == [0] * 90}}))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600,
                          cwd=tmp_path, env=_THREADED)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"loaded": False, "same": True, "info": True}


def test_outside_the_block_and_below_the_crossover_the_engines_run_as_always():
    from batchlu.kernels import _cpu

    a = np.ones((2, 64, 64))
    assert not _cpu._deferred("inv", a)                       # not inside numba_on_demand
    with _cpu.numba_on_demand():
        small = np.ones((2, 8, 8))
        assert not _cpu._deferred("inv", small)               # the compiled engine's own LU there
        assert _cpu._deferred("inv", a) == (_cpu._COMPILED is None)


def test_only_a_small_cpu_run_computes_on_demand():
    from batchlu.kernels import _cpu
    from batchlu.pipeline.worker import _engines

    cpu, gpu = _engines.HostEngine(), type("G", (), {"name": "gpu"})()
    limit = _engines.ON_DEMAND_BYTES
    for engine, size, want in ((cpu, limit, True), (cpu, 1, True), (cpu, limit + 1, False), (cpu, 0, False),
                               (gpu, 1, False)):
        with _engines.computing(engine, size):
            assert getattr(_cpu._ON_DEMAND, "on", False) is want, (engine.name, size)
    assert getattr(_cpu._ON_DEMAND, "on", False) is False



_ENGINE_SCRIPT = r"""
import hashlib, json, sys
import numpy as np
from batchlu import kernels
rng = np.random.default_rng(int(sys.argv[1]))
out = {}
for dtype in ("float32", "float64", "complex128"):
    for n in (96, 160):
        a = rng.standard_normal((3, n, n)) + (1j * rng.standard_normal((3, n, n)) if dtype == "complex128" else 0)
        b = rng.standard_normal((3, n, 2)) + (1j * rng.standard_normal((3, n, 2)) if dtype == "complex128" else 0)
        a, b = a.astype(dtype), b.astype(dtype)
        out[f"{dtype} {n} inv"] = hashlib.sha1(kernels.inv(a)[0].tobytes()).hexdigest()
        out[f"{dtype} {n} solve"] = hashlib.sha1(kernels.solve(a, b)[0].tobytes()).hexdigest()
print(json.dumps(out))
"""


def test_the_numpy_engine_under_threaded_openblas_gives_the_compiled_engines_bits():
    """BATCHLU_CPU_ENGINE=numpy (and numba not importable) with OpenBLAS given two threads: its LAPACK
    loops run OpenBLAS at one thread too, so inv and solve are the compiled engine's bits (threaded,
    11 of 18 cases differed at n = 96-200)."""
    seed = str(np.random.default_rng().integers(1 << 30))

    def digests(env):
        done = subprocess.run([sys.executable, "-c", _ENGINE_SCRIPT, seed], capture_output=True, text=True,
                              timeout=600, env=env)
        assert done.returncode == 0, done.stderr[-2000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    compiled = digests({**os.environ, "OPENBLAS_NUM_THREADS": "1", "BATCHLU_CPU_ENGINE": "compiled"})
    numpy_threaded = digests({**_THREADED, "BATCHLU_CPU_ENGINE": "numpy"})
    assert numpy_threaded == compiled, sorted(k for k in compiled if compiled[k] != numpy_threaded[k])
