"""The documentation's links resolve: every relative link or image in README.md and docs/*.md
names a file or folder of the repository, and every ``#anchor`` a heading of the page it points
at (GitHub's heading ids). The README stays a front door: short, the architecture first."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
COMMENT = re.compile(r"<!--.*?-->", re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*$", re.M)
README_MAX_LINES = 250


def prose(text: str) -> str:
    """The text a reader sees as Markdown: code blocks and comments left out."""
    return COMMENT.sub("", FENCE.sub("", text))


def heading_ids(text: str) -> set[str]:
    """The ids GitHub gives a page's headings: lower case, punctuation dropped, spaces as
    hyphens, ``-1``, ``-2`` ... after repeats."""
    ids, seen = set(), {}
    for title in HEADING.findall(prose(text)):
        slug = re.sub(r"[^\w\- ]", "", title.lower().replace("`", "")).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        ids.add(slug if n == 0 else f"{slug}-{n}")
    return ids


def local_links(page: Path) -> list[str]:
    return [t for t in LINK.findall(INLINE_CODE.sub("", prose(page.read_text())))
            if not re.match(r"[a-z]+:", t)]


def test_heading_ids_follow_githubs_rule():
    text = "# The wafer\n## Input throughput and the coordinator's cost (`x/y.py`)\n## The wafer\n"
    assert heading_ids(text) == {"the-wafer", "the-wafer-1",
                                 "input-throughput-and-the-coordinators-cost-xypy"}


def test_links_in_code_and_urls_are_not_checked():
    page = REPO / "README.md"
    links = local_links(page)
    assert links, "README.md has no relative links to check"
    assert not any(link.startswith("http") for link in links)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    broken = []
    for target in local_links(page):
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no file {dest.relative_to(REPO)}")
        elif anchor and dest.suffix == ".md" and anchor not in heading_ids(dest.read_text()):
            broken.append(f"{target}: {dest.relative_to(REPO)} has no heading #{anchor}")
    assert not broken, f"{page.relative_to(REPO)}: " + "; ".join(broken)


def test_the_readme_is_a_front_door_with_the_architecture_near_the_top():
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines; keep it at most {README_MAX_LINES} and move "
        "details to a page under docs/")
    picture = FENCE.search("\n".join(lines)).group(0)
    missing = [part for part in ("client", "wafer driver", "coordinator", "InputWorker")
               if part not in picture]
    assert not missing, (f"README.md: the first fenced block should draw the architecture; "
                         f"it does not name {missing}")
