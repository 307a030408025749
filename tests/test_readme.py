"""The README cannot drift from the product: every shipped setting is in its configuration table, every
command-line flag in its synopsis, every op's outputs as the op table gives them, and its Python
example runs as a script."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
import yaml

from batchlu.pipeline._ops import OP_TABLE
from batchlu.workflows.cli import cli

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _section(title: str) -> str:
    start = README.index(f"\n## {title}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end if end > 0 else None]


def _leaf_keys(mapping, prefix="batchlu") -> list[str]:
    keys = []
    for name, value in mapping.items():
        keys += _leaf_keys(value, f"{prefix}.{name}") if isinstance(value, dict) else [f"{prefix}.{name}"]
    return keys


def test_every_shipped_setting_is_in_the_configuration_table():
    shipped = yaml.safe_load((ROOT / "pipeline" / "config" / "batchlu.yaml").read_text())["batchlu"]
    rows = [line for line in _section("Configuration").splitlines() if line.startswith("| `batchlu.")]
    documented = {re.match(r"\| `([^`]+)`", row).group(1) for row in rows}
    keys = _leaf_keys(shipped)
    assert len(keys) > 20
    missing = sorted(set(keys) - documented)
    assert not missing, f"settings missing from the README's configuration table: {missing}"
    stale = sorted(documented - set(keys))
    assert not stale, f"README documents settings that batchlu.yaml does not ship: {stale}"


def _leaf_values(mapping, prefix="batchlu") -> dict:
    values = {}
    for name, value in mapping.items():
        if isinstance(value, dict):
            values.update(_leaf_values(value, f"{prefix}.{name}"))
        else:
            values[f"{prefix}.{name}"] = value
    return values


@pytest.mark.parametrize("op", sorted(OP_TABLE))
def test_the_outputs_table_quotes_the_op_table(op):
    """The README's table of outputs, and ``batchlu run --help``, say what each op writes as the op
    table declares it (:meth:`batchlu.pipeline._ops.Op.describe_outputs`)."""
    rows = {m.group(1): m.group(2) for m in re.finditer(r"^\| `([\w-]+)` \| `([^`]+)` \|", _section("Outputs"), re.M)}
    assert rows.get(op) == OP_TABLE[op].describe_outputs(), f"README's outputs of {op}: {rows.get(op)!r}"
    assert f"{op} -> {OP_TABLE[op].describe_outputs()}" in " ".join(cli.commands["run"].help.split())


def test_the_configuration_table_gives_the_shipped_defaults():
    shipped = _leaf_values(yaml.safe_load((ROOT / "pipeline" / "config" / "batchlu.yaml").read_text())["batchlu"])
    rows = [line for line in _section("Configuration").splitlines() if line.startswith("| `batchlu.")]
    documented = dict(re.match(r"\| `([^`]+)` \| `([^`]*)` \|", row).groups() for row in rows)
    for key, value in shipped.items():
        text = "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
        assert documented.get(key) == text, f"README: {key} defaults to {documented.get(key)!r}, " \
                                            f"batchlu.yaml ships {text!r}"


def _synopsis(command: str) -> str:
    """The lines of the README's synopsis block that belong to ``batchlu COMMAND``."""
    block = re.search(r"## The `batchlu` command line\n\n```text\n(.*?)```", README, re.S).group(1)
    lines, inside = [], False
    for line in block.splitlines():
        if line.startswith("batchlu "):
            inside = line.startswith(f"batchlu {command} ")
        if inside:
            lines.append(line)
    return "\n".join(lines)


@pytest.mark.parametrize("command", sorted(cli.commands))
def test_every_flag_is_in_the_synopsis(command):
    synopsis = _synopsis(command)
    assert synopsis, f"no synopsis line for batchlu {command}"
    flags = [flag for param in cli.commands[command].params if isinstance(param, click.Option) and not param.hidden
             for flag in param.opts + param.secondary_opts if flag.startswith("--") and flag != "--help"]
    missing = [flag for flag in flags if not re.search(re.escape(flag) + r"(?![\w-])", synopsis)]
    assert not missing, f"batchlu {command} flags missing from the README's synopsis: {missing}"


def _python_example() -> str:
    """The README's first Python example: the one with the ``__main__`` guard."""
    block = re.search(r"```python\n(.*?)```", _section("Python API"), re.S).group(1)
    assert 'if __name__ == "__main__":' in block
    return block


def test_the_python_example_runs_as_a_script(tmp_path):
    # Smaller than the README's, same calls: 100,000 matrices of 64x64 are 3 GiB.
    code = _python_example().replace("count=100_000", "count=2_000").replace("sample=10_000", "sample=500")
    assert code != _python_example()
    script = tmp_path / "example.py"
    script.write_text(code)
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "batchlu inv: complete, 2,000 matrices" in proc.stdout
    assert "batchlu output" in proc.stdout and "status: complete" in proc.stdout  # inspect


def test_the_names_the_readme_uses_resolve_after_import_batchlu():
    code = ("import batchlu\n"
            "names = [batchlu.testing.ratios.get01, batchlu.testing.ratios.get02, batchlu.testing.ratios.get03,\n"
            "         batchlu.testing.matrices.generate, batchlu.pipeline.errors.BatchluError,\n"
            "         batchlu.kernels.lu_factor, batchlu.run, batchlu.generate, batchlu.verify, batchlu.inspect]\n"
            "print(len(names))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "10", proc.stderr
