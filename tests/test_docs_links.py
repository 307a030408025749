"""The docs cannot point at nothing: every relative link of README.md and docs/*.md names a file that
exists and, after ``#``, one of its headings; every ``docs/<page>.md#anchor`` that the code names (comments,
docstrings, dispatch tables) is a heading of that page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SOURCES = [p for top in ("batchlu", "kernels", "pipeline", "workflows", "benchmarks")
           for p in (ROOT / top).rglob("*") if p.suffix in (".py", ".cu", ".cuh")]


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a Markdown page's headings (outside code blocks)."""
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    anchors, seen = set(), {}
    for line in text.splitlines():
        match = re.match(r"#{1,6} (.+)", line)
        if not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return [target for target in re.findall(r"\]\(([^)\s]+)\)", text)
            if not re.match(r"[a-z]+:", target)]


def test_the_anchors_are_read():
    design = _anchors(ROOT / "docs" / "design.md")
    assert {"getrf-dispatch", "large-n-cusolver", "sparse-ldlt", "what-was-tried-and-did-not-pay"} <= design


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    broken = []
    for target in _links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(target)
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: links to nothing: {broken}"


def test_every_docs_anchor_named_in_the_code_exists():
    broken = []
    for path in SOURCES:
        for page, anchor in re.findall(r"docs/(\w+)\.md#([\w\-]+)", path.read_text(errors="replace")):
            if anchor not in _anchors(ROOT / "docs" / f"{page}.md"):
                broken.append(f"{path.relative_to(ROOT)}: docs/{page}.md#{anchor}")
    assert not broken, broken
