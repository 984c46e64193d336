"""Every place README.md and docs/*.md send a reader exists: a relative link's file, and the
section its `#anchor` names (as GitHub makes anchors of headings); and a section cited by name
("the README's *Running it*") is a heading of that page. Issue 36: docs/high-availability.md
cited a README section that was not there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CITED = re.compile(r"(README|[a-z-]+\.md)'s \*([^*]+)\*")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def headings(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text())
    return [line.lstrip("#").strip() for line in text.splitlines() if line.startswith("#")]


def test_anchors_are_made_as_github_makes_them() -> None:
    assert anchor("Running highly available") == "running-highly-available"
    assert anchor("Queues: `/ui/queues`") == "queues-uiqueues"
    assert anchor("Connections: idle, slow and silent clients") == (
        "connections-idle-slow-and-silent-clients"
    )


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_relative_link_and_cited_section_exists(page: Path) -> None:
    text = FENCE.sub("", page.read_text())
    broken = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # http://, mailto:: not ours to check here
        path, _, fragment = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(target)
            continue
        known = {anchor(h) for h in headings(linked)} if linked.suffix == ".md" else set()
        if fragment and linked.suffix == ".md" and fragment not in known:
            broken.append(target)
    for name, section in CITED.findall(text):
        cited = ROOT / "README.md" if name == "README" else page.parent / name
        if anchor(section) not in {anchor(heading) for heading in headings(cited)}:
            broken.append(f"{name}'s *{section}*")
    assert broken == []
