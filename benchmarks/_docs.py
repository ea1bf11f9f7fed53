"""Writing a benchmark's result into docs/benchmarks.md: one section per script, replaced in place."""

from __future__ import annotations

import re
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.md"


def write_section(heading: str, text: str, doc: Path = DOC) -> None:
    """Replace the ``heading`` section (up to the next ``## ``) with ``text``, or append it; one write.

    Args:
        heading: the section's heading line, e.g. ``"## Emulated cluster throughput"``.
        text: the whole section, starting with that heading.
        doc: the Markdown file (default docs/benchmarks.md).
    """
    current = doc.read_text() if doc.is_file() else "# Benchmarks\n"
    pattern = re.compile(rf"^{re.escape(heading)}\n.*?(?=^## |\Z)", re.S | re.M)
    block = text.rstrip() + "\n\n"
    new = pattern.sub(lambda _: block, current) if pattern.search(current) else current.rstrip() + "\n\n" + block
    doc.write_text(new)
