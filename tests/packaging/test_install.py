"""Packaging: only ``batchlu`` lands in site-packages, so distributions that ship their own top-level
``kernels``, ``pipeline`` or ``workflows`` live next to it untouched (issue 17)."""

from __future__ import annotations

import os
import subprocess
import sysconfig
import textwrap
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STAND_IN_NAMES = ("kernels", "pipeline", "workflows")


def _fresh_venv(path: Path) -> Path:
    """A venv without batchlu, whose imports of batchlu's dependencies come from this environment.

    A ``.pth`` line appends this environment's site-packages (a plain path: the ``.pth`` files in it,
    such as an editable install of batchlu, are not run), so nothing is downloaded but the build backend.
    """
    venv.EnvBuilder(with_pip=True).create(path)
    python = path / "bin" / "python"
    site = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    Path(site, "outer-env.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def _stand_in(path: Path) -> Path:
    """A distribution that owns the top-level names batchlu used to install."""
    for name in STAND_IN_NAMES:
        Path(path, name).mkdir(parents=True)
        Path(path, name, "__init__.py").write_text(f"OWNER = 'stand-in {name}'\n")
    Path(path, "pyproject.toml").write_text(textwrap.dedent("""
        [build-system]
        requires = ["setuptools>=68"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "stand-in-collider"
        version = "1.0"
        [tool.setuptools]
        packages = ["kernels", "pipeline", "workflows"]
    """))
    return path


def _pip(python: Path, *args: str) -> None:
    out = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", *args],
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The python of a fresh venv with batchlu installed the regular way (``pip install .``, not editable)."""
    python = _fresh_venv(tmp_path_factory.mktemp("venv"))
    _pip(python, str(ROOT))
    return python


@pytest.mark.slow
def test_regular_install_owns_only_batchlu_and_leaves_other_top_levels_alone(installed, tmp_path):
    python = installed
    _pip(python, str(_stand_in(tmp_path / "collider")))

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = subprocess.run(
        [python, "-c", "import json, kernels, pipeline, workflows, batchlu, batchlu.kernels; "
                       "print(json.dumps([kernels.OWNER, pipeline.OWNER, workflows.OWNER, batchlu.__file__, "
                       "batchlu.kernels.__file__]))"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert probe.returncode == 0, probe.stderr
    owners = probe.stdout.strip()
    for name in STAND_IN_NAMES:
        assert f"stand-in {name}" in owners, owners
    assert str(python.parents[1]) in owners and str(ROOT) not in owners, owners  # the installed copy

    site = Path(subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    (dist_info,) = site.glob("batchlu-*.dist-info")
    assert (dist_info / "top_level.txt").read_text().split() == ["batchlu"]
    installed = {line.split(",")[0].split("/")[0] for line in (dist_info / "RECORD").read_text().splitlines()}
    assert not installed & set(STAND_IN_NAMES), installed

    demo = subprocess.run([python.parent / "batchlu", "demo", "--count", "300", "--size", "8"], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "Traceback" not in demo.stderr and "3/3 verify" in demo.stdout, demo.stdout + demo.stderr


@pytest.mark.slow
def test_plain_install_runs_from_the_repository_root(installed, tmp_path):
    """A plain ``pip install .`` (not editable), then ``batchlu generate`` / ``run`` / ``verify`` started
    from the repository root, with an I/O process per worker (``python -m batchlu.pipeline.worker._io_child``,
    whose ``sys.path`` starts with the working directory): every process imports the installed
    package, not a folder of the checkout (a ``batchlu/`` folder at the root shadowed it: every I/O process died with
    ``ModuleNotFoundError: batchlu.pipeline``)."""
    python = installed
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    cli = str(python.parent / "batchlu")
    source, out = str(tmp_path / "a.zarr"), str(tmp_path / "o.zarr")
    for args in (["generate", source, "--count", "600", "--size", "8", "--chunk", "100"],
                 ["run", source, out, "--op", "inv", "--config", "io-processes=1"],   # GPU workers' default
                 ["verify", source, out]):
        done = subprocess.run([cli, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                              stdin=subprocess.DEVNULL)
        assert done.returncode == 0, (args, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr and "ModuleNotFoundError" not in done.stderr, done.stderr
    assert not (ROOT / "batchlu").exists(), "a folder named batchlu at the root shadows the installed package"
