"""The generalisation-under-drift page and its at-a-glance line say what results.json says.

The page's section is `benchmarks/table2_generalisation.py`'s `section_text` of the committed
results.json (the offload tables, the reward and KPI tables, the targets' yes / no), and the line's
verdict is the one the numbers give against its target ("above the paper's row at every horizon").
Static checks on committed files: fast.
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path
from types import ModuleType

import pytest
from test_benchmark_docs import code, table_lines

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "benchmarks" / "table2_generalisation" / "README.md"
RESULTS = ROOT / "docs" / "benchmarks" / "table2_generalisation" / "results.json"


@pytest.fixture
def script(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """benchmarks/table2_generalisation.py as a module (its sibling helpers importable while the test runs)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module("table2_generalisation")


def test_the_page_is_the_section_of_its_json(script: ModuleType) -> None:
    page = PAGE.read_text()
    m = re.search(r"^Command: .*? Machine: (.*)\.$", page, re.M)
    assert m, "no Command / Machine line on the page"
    doc = json.loads(RESULTS.read_text())
    import _docs

    expected = _docs.relink(script.section_text(doc, m.group(1)), PAGE)
    assert " ".join(expected.split()) in " ".join(page.split()), "rerun the section: the page differs from results.json"


def test_the_reward_table_reports_what_ppo_maximised() -> None:
    """Every policy and horizon carries the paired reward difference and both KPI means."""
    doc = json.loads(RESULTS.read_text())
    for setting, rows in doc["results"].items():
        for kind, cells in rows.items():
            for h in cells:
                k = doc["kpis"][setting][kind][h]
                assert {"return", "offload_ratio", "revenue"} <= set(k["policy"]) & set(k["random"]), (setting, kind, h)
                delta, half = k["reward_per_step_delta"]
                assert half >= 0
                assert abs(delta - (k["policy"]["return"] - k["random"]["return"]) / 96) < 1e-9 * max(1.0, abs(delta))


def test_the_line_gives_the_verdict_the_numbers_give() -> None:
    doc = json.loads(RESULTS.read_text())
    rows = [r for r in table_lines() if code(r[6]).startswith("table2_generalisation/results.json:")]
    assert len(rows) == 1
    ours = doc["results"]["random"]["MAIL-MMSG"]
    above = all(100 * ours[h][0] > paper for h, paper in zip(("0d", "1d", "1w", "1m"), doc["paper"]["MAIL-MMSG"],
                                                                strict=True))
    assert rows[0][4].startswith("met" if above else "missed"), rows[0][4]
