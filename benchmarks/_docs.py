"""Writing a benchmark's result into its page: one page per benchmark, docs/benchmarks/<name>/README.md.

`PAGES` says which page a section heading is written to; a script that names the old single file
(docs/benchmarks.md, `DOC`) is routed to its page, so the scripts keep their ``SECTION`` and
``write_section`` calls. docs/benchmarks/README.md holds the at-a-glance table and links the pages.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

DOCS = Path(__file__).resolve().parents[1] / "docs"
#: the single file the benchmarks wrote before their pages (still what scripts name; routed by `PAGES`)
DOC = DOCS / "benchmarks.md"
#: the pages' folder: docs/benchmarks/<name>/README.md
PAGES_DIR = DOCS / "benchmarks"
#: a section heading -> its page's folder name (add a line for a new benchmark)
PAGES = {
    "## Log validation": "log_validation",
    "## Emulated cluster throughput": "emulated_cluster",
    "## Seed 004 Table 2: generalisation under drift": "table2_generalisation",
    "## Edge decision latency and rollback": "edge_runtime",
    "## Twin fidelity (MAIL-MMSG)": "twin_fidelity",
    "## Seed 001-style comparison: heuristics vs DRL": "heuristics_vs_rl",
    "## Seed 002-style energy and carbon": "energy_carbon",
    "## What-if replay vs the emulated cluster (promotion gate)": "whatif_gate",
    "## MA-FL: seed 003 Tables 1-3 on the emulated cluster": "mafl_tables",
    "## MA-FL: PFRL-DM personalised federated RL (seed 000)": "pfrl_dm",
    "## MA-FL: PFRL-DM on seed 000's own task-scheduling MDP": "pfrl_dm_vm",
    "## MA-FL: scalability over NATS and Byzantine clients (seed 003 Table 4)": "mafl_scale",
    "## Table 1 — population (GAN-SMMSG)": "table1",
    "## Twin site-level state (SiteStateModel)": "twin_site_state",
    "## ERLFC: DAG jobs to data centres (seed 002)": "erlfc",
    "## Training that stays where the twin is right (support-aware penalty, selection by lower bound)": "train_selection",
    "## Federated twin": "federated_twin",
    "## Scale": "scale",
    "## Twin update from a canary": "twin_update",
}
#: the first lines of every page, above its section (the way back to the table)
PAGE_HEAD = "[All benchmarks: the at-a-glance table](../README.md)\n\n"

_LINK = re.compile(r"(!?\[[^\]]*\]\()([^)\s]+)(\))")


def page_of(heading: str) -> Path:
    """``docs/benchmarks/<name>/README.md`` of a section heading (`PAGES`)."""
    return PAGES_DIR / PAGES[heading] / "README.md"


def relink(text: str, written_for: Path, page: Path) -> str:
    """Relative links (images, other docs) of Markdown written for a file in ``written_for``'s folder,
    rewritten for ``page``'s folder; absolute URLs and anchors are left alone."""

    def fix(m: re.Match[str]) -> str:
        target = m.group(2)
        if re.match(r"^[a-z]+:|^#|^/", target):
            return m.group(0)
        path, _, anchor = target.partition("#")
        new = os.path.relpath(written_for.parent / path, page.parent).replace(os.sep, "/")
        return m.group(1) + new + (f"#{anchor}" if anchor else "") + m.group(3)

    return _LINK.sub(fix, text)


def write_section(heading: str, text: str, doc: Path = DOC, keep: Sequence[str] = ()) -> None:
    """Replace the ``heading`` section (up to the next ``## ``) with ``text``, or append it; one write.

    Args:
        heading: the section's heading line, e.g. ``"## Emulated cluster throughput"``.
        text: the whole section, starting with that heading.
        doc: the Markdown file; docs/benchmarks.md (the default) means the heading's page
            (`PAGES`), with ``text``'s relative links rewritten for the page's folder.
        keep: starts of ``### `` headings of hand-written subsections (analyses, extra runs) that a
            rerun keeps: each found in the current section is appended, up to the next ``### ``.
    """
    if Path(doc).resolve() == DOC.resolve() and heading in PAGES:
        page = page_of(heading)
        text = relink(text, DOC, page)
        page.parent.mkdir(parents=True, exist_ok=True)
        doc = page
        default = PAGE_HEAD
    else:
        default = "# Benchmarks\n"
    current = doc.read_text() if doc.is_file() else default
    pattern = re.compile(rf"^{re.escape(heading)}\n.*?(?=^## |\Z)", re.S | re.M)
    section = pattern.search(current)
    kept = []
    for head in keep:
        m = re.search(rf"^{re.escape(head)}.*?(?=^### |\Z)", section.group(0), re.S | re.M) if section else None
        if m:
            kept.append(m.group(0).rstrip())
    block = "\n\n".join([text.rstrip(), *kept]) + "\n\n"
    new = pattern.sub(lambda _: block, current) if section else current.rstrip() + "\n\n" + block
    doc.write_text(new)
