"""Writing a benchmark's result into its page, docs/benchmarks/<name>/README.md: one section per script.

Each script owns one ``## `` section of one page (the MA-FL page holds the sections of four scripts);
a rerun replaces that section in place. The at-a-glance table in docs/benchmarks/README.md is not
written here: its lines name a JSON file and field, and tests/test_benchmark_docs.py checks them.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH_DOCS = ROOT / "docs" / "benchmarks"

#: section heading -> page directory under docs/benchmarks/
PAGES: dict[str, str] = {
    "## Log validation": "validate",
    "## Emulated cluster throughput": "emulated_cluster",
    "## Seed 004 Table 2: generalisation under drift": "table2_generalisation",
    "## Edge decision latency and rollback": "edge_runtime",
    "## Twin fidelity (MAIL-MMSG)": "twin_fidelity",
    "## Seed 001-style comparison: heuristics vs DRL": "heuristics_vs_rl",
    "## Seed 002-style energy and carbon": "energy_carbon",
    "## What-if replay vs the emulated cluster (promotion gate)": "whatif_gate",
    "## MA-FL: seed 003 Tables 1-3 on the emulated cluster": "mafl",
    "## MA-FL: PFRL-DM personalised federated RL (seed 000)": "mafl",
    "## MA-FL: PFRL-DM on seed 000's own task-scheduling MDP": "mafl",
    "## MA-FL: scalability over NATS and Byzantine clients (seed 003 Table 4)": "mafl",
    "## Table 1 — population (GAN-SMMSG)": "table1",
    "## Twin site-level state (SiteStateModel)": "twin_site_state",
    "## ERLFC: DAG jobs to data centres (seed 002)": "erlfc",
    "## Training that stays where the twin is right (support-aware penalty, selection by lower bound)":
        "train_selection",
    "## Federated twin": "federated_twin",
    "## Scale": "scale",
    "## Twin update from a canary": "twin_update",
    "## Prometheus import": "prometheus_import",
    "## Closed loop: twin alone vs canary alone vs twin + canary": "closed_loop",
    "## Second system: admission control behind a hidden load": "causal_twin",
    "## The main job: edgetwin demo": "demo",
}

#: page directory -> its title (the page's ``# `` line)
TITLES: dict[str, str] = {
    "validate": "Log validation",
    "emulated_cluster": "Emulated cluster throughput",
    "table2_generalisation": "Generalisation under drift (seed 004 Table 2)",
    "edge_runtime": "Edge decision latency and rollback",
    "twin_fidelity": "Twin fidelity",
    "heuristics_vs_rl": "Heuristics vs DRL (seed 001)",
    "energy_carbon": "Energy and carbon (seed 002)",
    "whatif_gate": "What-if replay vs the emulated cluster (promotion gate)",
    "mafl": "MA-FL: federated scheduling (seeds 000 and 003)",
    "table1": "Population model (seed 004 Table 1)",
    "twin_site_state": "Twin site-level state",
    "erlfc": "ERLFC: DAG jobs to data centres (seed 002)",
    "train_selection": "Training that stays where the twin is right",
    "federated_twin": "Federated twin",
    "scale": "Scale",
    "twin_update": "Twin update from a canary",
    "closed_loop": "Closed loop: when the twin cannot tell, ask the edge",
    "demo": "The main job: edgetwin demo",
}
#: the single file the pages replaced; a write aimed at it goes to the section's page
OLD_DOC = ROOT / "docs" / "benchmarks.md"


def page(heading: str) -> Path:
    """The page that holds the section ``heading``: its `PAGES` entry, else a directory named after
    the heading (``## Causal twin`` -> docs/benchmarks/causal_twin/README.md), so that a new
    benchmark gets its own page without an entry here."""
    name = PAGES.get(heading) or re.sub(r"[^a-z0-9]+", "_", heading.lstrip("#").strip().lower()).strip("_")
    return BENCH_DOCS / name / "README.md"


def relink(text: str, doc: Path) -> str:
    """Rewrite Markdown links written relative to docs/ (``](benchmarks/x.png)``) relative to ``doc``.

    The scripts' section texts were written for docs/benchmarks.md; a page sits two folders deeper.
    Absolute URLs, anchors and links already starting with ``./`` or ``../`` are left alone.
    """
    base = doc.parent

    def fix(m: re.Match[str]) -> str:
        target = m.group(2)
        if re.match(r"[a-z]+:|#|\.\.?/|/", target):
            return m.group(0)
        path, _, frag = target.partition("#")
        new = os.path.relpath(ROOT / "docs" / path, base).replace(os.sep, "/")
        new = new if new.startswith("../") else "./" + new  # idempotent: a second pass leaves it
        return f"{m.group(1)}{new}{'#' + frag if frag else ''})"

    return re.sub(r"(\]\()([^)\s]+)\)", fix, text)


def write_section(heading: str, text: str, doc: Path | None = None, keep: Sequence[str] = ()) -> None:
    """Replace the ``heading`` section (up to the next ``## ``) of its page with ``text``, or append it.

    Args:
        heading: the section's heading line, e.g. ``"## Emulated cluster throughput"``.
        text: the whole section, starting with that heading; links relative to docs/ are rewritten
            relative to the page (`relink`).
        doc: the Markdown file (default, and instead of the former docs/benchmarks.md: the
            section's page, `page`).
        keep: starts of ``### `` headings of hand-written subsections (analyses of where edgetwin
            loses) that a rerun keeps: each found in the current section is appended, up to the
            next ``### ``.
    """
    if doc is None or doc.resolve() == OLD_DOC.resolve():
        doc = page(heading)
    name = doc.parent.name
    header = f"# {TITLES.get(name, name)}\n\n[All benchmarks](../README.md)\n"
    current = doc.read_text() if doc.is_file() else header
    text = relink(text, doc)
    pattern = re.compile(rf"^{re.escape(heading)}\n.*?(?=^## |\Z)", re.S | re.M)
    section = pattern.search(current)
    kept = []
    for head in keep:
        m = re.search(rf"^{re.escape(head)}.*?(?=^### |\Z)", section.group(0), re.S | re.M) if section else None
        if m:
            kept.append(m.group(0).rstrip())
    block = "\n\n".join([text.rstrip(), *kept]) + "\n\n"
    new = pattern.sub(lambda _: block, current) if section else current.rstrip() + "\n\n" + block
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(new)
