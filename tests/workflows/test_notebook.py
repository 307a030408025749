"""The example notebook (workflows/example.ipynb) runs top to bottom on the CPU backend."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "workflows" / "example.ipynb"


def test_example_notebook_runs_on_cpu(monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    pytest.importorskip("ipykernel")
    pytest.importorskip("matplotlib")

    monkeypatch.setenv("BATCHLU_NOTEBOOK_BACKEND", "cpu")
    monkeypatch.setenv("BATCHLU_NOTEBOOK_COUNT", "600")
    monkeypatch.setenv("BATCHLU_NOTEBOOK_SIZE", "12")
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(notebook, timeout=300, kernel_name="python3",
                                     resources={"metadata": {"path": str(ROOT)}})
    client.execute()

    outputs = [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.get("outputs", [])]
    assert not [o for o in outputs if o.get("output_type") == "error"]
    text = "".join(o.get("text", "") for o in outputs if o.get("output_type") == "stream")
    text += "".join(o.get("data", {}).get("text/plain", "") for o in outputs)
    assert "batchlu inv: complete, 600 matrices" in text
    assert "backend cpu -> cpu" in text
    assert "dget03" in text or "ratio" in text  # the verify summary
    assert "info equal to the run's: True" in text  # the lazy inverse on a dask array
    images = [o for o in outputs if "image/png" in o.get("data", {})]
    assert len(images) == 1  # the throughput plot
