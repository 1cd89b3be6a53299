"""The one writer of the benchmarks' tables into the docs: the text between a block's two
markers, ``<!-- NAME: begin generated block -->`` and ``<!-- NAME: end generated block -->``."""

from __future__ import annotations

from pathlib import Path

PERFORMANCE = Path(__file__).resolve().parents[1] / "docs" / "performance.md"


def markers(name: str) -> tuple[str, str]:
    return (f"<!-- {name}: begin generated block -->", f"<!-- {name}: end generated block -->")


def update_block(name: str, text: str, page: Path = PERFORMANCE, heading: str | None = None) -> None:
    """Put ``text`` between the markers of block ``name`` in ``page``. A page without the block
    gets it at its end under ``## heading`` where a heading is given; without one it is an
    error that names the two markers to add."""
    begin, end = markers(name)
    doc = page.read_text()
    block = f"{begin}\n{text.rstrip(chr(10))}\n{end}"
    if begin in doc and end in doc:
        head, rest = doc.split(begin, 1)
        doc = head + block + rest.split(end, 1)[1]
    elif heading is not None:
        doc = doc.rstrip("\n") + f"\n\n## {heading}\n\n{block}\n"
    else:
        raise SystemExit(f"{page} has no block between {begin!r} and {end!r}; add the two "
                         "markers where the table belongs.")
    page.write_text(doc)
