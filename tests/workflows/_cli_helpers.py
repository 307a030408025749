"""Helpers shared by the command-line tests (imported as a plain module: tests/ has no packages)."""

from __future__ import annotations


def one_line_error(result, *words):
    """``result`` (click's runner) exited 1 with exactly one line on stderr, ``Error: ...`` holding each
    of ``words``, and no traceback; returns that line."""
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    for word in words:
        assert word in lines[0], lines[0]
    return lines[0]
