"""bench_sparse.py's report, without a GPU: from a records file, the table's speeds, the bar line and
the plot, with the last record of a point and implementation winning."""

from __future__ import annotations

import json
import math
import random
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def _records(rng: random.Random) -> list[dict]:
    """Two kinds, two batches, a failed cuDSS point, and a repeated record whose later copy wins."""
    def record(impl, kind, n, batch, check="ok"):
        ms = rng.uniform(0.05, 5.0) if check == "ok" else None
        berr = rng.uniform(1e-17, 1e-15) if check == "ok" else float("nan")
        return {"impl": impl, "kind": kind, "dim": 2, "n": n, "nnz": 3 * n, "batch": batch, "dtype": "float64",
                "seconds": None if ms is None else ms * batch / 1e3, "per_matrix_ms": ms,
                "max_backward_error": berr, "refine_steps": rng.randint(0, 2), "check": check,
                "device": "test device", "date": "2026-01-01"}

    failed = "failed: backward error nan > 30 n eps = 1e-12"
    return [record("batchlu-gpu", "fem-poisson", 100, 256), record("cudss-uniform", "fem-poisson", 100, 256),
            record("cudss", "fem-poisson", 100, 256, failed), record("dense-gpu", "fem-poisson", 100, 256),
            record("batchlu-gpu", "fem-poisson", 400, 256), record("cudss-uniform", "fem-poisson", 400, 256),
            record("batchlu-gpu", "saddle", 100, 256), record("cudss-uniform", "saddle", 100, 256, failed),
            record("batchlu-gpu", "saddle", 400, 256), record("cudss-uniform", "saddle", 400, 256),
            {**record("cudss", "saddle", 400, 256), "per_matrix_ms": 0.01},   # faster than any uniform
            record("batchlu-gpu", "saddle", 100, 64), record("cudss", "saddle", 100, 64),
            record("batchlu-gpu", "saddle", 400, 64), record("cudss-uniform", "saddle", 400, 64),
            record("cudss-uniform", "fem-poisson", 400, 256)]   # measured again: this one counts


def test_report_table_bar_and_plot(tmp_path):
    records = _records(random.Random(20261124))
    path = tmp_path / "sparse.json"
    path.write_text(json.dumps(records))
    done = subprocess.run([sys.executable, str(BENCH / "bench_sparse.py"), "--report", str(path),
                           "--plot", str(tmp_path / "sparse.png")],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]

    last = {(r["kind"], r["n"], r["batch"], r["impl"]): r for r in records}   # later records replace earlier
    points = sorted({key[:3] for key in last})
    def best(p):                                    # cuDSS's faster mode that passed, both measured
        keys = [(*p, impl) for impl in ("cudss-uniform", "cudss")]
        if any(key not in last for key in keys):
            return None
        return min((last[key]["per_matrix_ms"] for key in keys if last[key]["check"] == "ok"), default=None)

    speeds = {p: best(p) / last[(*p, "batchlu-gpu")]["per_matrix_ms"] for p in points if best(p) is not None}
    assert ("fem-poisson", 100, 256) in speeds and ("fem-poisson", 400, 256) not in speeds and len(speeds) == 2
    assert speeds["saddle", 400, 256] == last["saddle", 400, 256, "cudss"]["per_matrix_ms"] / last[
        "saddle", 400, 256, "batchlu-gpu"]["per_matrix_ms"]                   # DirectSolver the faster there

    lines = done.stdout.splitlines()
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        if not line.startswith("| "):
            break
        cells = dict(zip(head, (c.strip() for c in line.strip("|").split("|"))))
        rows[cells["kind"], int(cells["n"].replace(",", "")), int(cells["batch"])] = cells
    assert sorted(rows) == points
    for point, cells in rows.items():
        expected = f"{speeds[point]:.2f}x" if point in speeds else "-"
        assert cells["batchlu / cuDSS best"] == expected, point
        ours = last[(*point, "batchlu-gpu")]
        assert cells["batchlu-gpu ms/matrix (refinement steps)"] == (
            f"{ours['per_matrix_ms']:.3f} ({ours['refine_steps']})")
    assert rows["fem-poisson", 100, 256]["cuDSS DirectSolver ms/matrix"] == "failed (berr nan)"
    assert rows["saddle", 100, 256]["cuDSS uniform ms/matrix"] == "failed (berr nan)"
    assert rows["fem-poisson", 400, 256]["dense-gpu ms/matrix"] == "-"

    bar = {p: s for p, s in speeds.items() if p[2] >= 256}
    geo = math.exp(sum(map(math.log, bar.values())) / len(bar))
    low = min(bar, key=bar.get)
    line = next(line for line in lines if line.startswith("Bar "))
    assert (f"geometric mean {geo:.2f}x over {len(bar)} points; minimum {bar[low]:.2f}x at "
            f"{low[0]} n={low[1]} B={low[2]} float64.") in line
    at_bar = sum(1 for p in points if p[2] >= 256)
    assert f"cuDSS failed its check at 1 of {at_bar} points (uniform batch), 1 (DirectSolver)." in line

    assert (tmp_path / "sparse.md").read_text() == done.stdout
    png = (tmp_path / "sparse.png").read_bytes()
    assert png.startswith(b"\x89PNG") and len(png) > 1000


def test_measures_and_checks_the_cpu_implementations(tmp_path):
    """A small run of the CPU implementations end to end: every record passed its check (a backward
    error at most 30 n eps, recomputed by the benchmark from the same matrices) and carries a time."""
    out = tmp_path / "cpu.json"
    done = subprocess.run([sys.executable, str(BENCH / "bench_sparse.py"), "--kinds", "saddle,fem-poisson",
                           "--sizes", "150", "--batch", "3", "--impls", "batchlu,scipy-splu", "--repeat", "1",
                           "--out", str(out)], capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    records = json.loads(out.read_text())
    assert [(r["impl"], r["kind"]) for r in records] == [("batchlu", "saddle"), ("scipy-splu", "saddle"),
                                                         ("batchlu", "fem-poisson"), ("scipy-splu", "fem-poisson")]
    for r in records:
        eps = 2.0 ** -52
        assert r["check"] == "ok" and r["seconds"] > 0 and r["max_backward_error"] <= 30 * r["n"] * eps, r
