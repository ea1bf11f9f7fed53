"""The training-selection page and its at-a-glance line say what its JSON files say.

The page's section is `benchmarks/train_selection.py`'s `section` of the committed
``results_<logging>.json`` files (its "Why" sentences included), and the at-a-glance line cites the
weakest production seed against that run's best simple candidate, with the verdict the numbers give.
Static checks on committed files: fast.
"""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from test_benchmark_docs import code, table_lines

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks" / "train_selection"


@pytest.fixture
def script(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """benchmarks/train_selection.py as a module (its sibling helpers importable while the test runs)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    return importlib.import_module("train_selection")


def results() -> dict[str, dict[str, Any]]:
    return {p.stem.removeprefix("results_"): json.loads(p.read_text()) for p in sorted(OUT.glob("results_*.json"))}


def test_the_page_is_the_section_of_its_json_files(script: ModuleType) -> None:
    docs = {name: results()[name] for name in script.LOGGING_TEXT if name in results()}
    page = " ".join((OUT / "README.md").read_text().split())
    assert " ".join(script.section(docs).split()) in page, "rerun the section: the page differs from its JSON files"


def test_the_why_names_the_reason_the_record_gives(script: ModuleType) -> None:
    """Each seed's reason is the selection's: the support rule only when the trained network broke it."""
    for doc in results().values():
        text = script.why(doc)
        for r in doc["runs"]:
            sel = r["selection"]
            trained = next(s for s in sel["scores"] if s["trained"])
            clause = re.search(rf"seed {r['seed']} ([^;]*);", text)
            assert clause, text
            if sel["exported_trained_network"]:
                assert clause.group(1) == "exported the trained network"
            elif trained["out_of_support"] > sel["max_out_of_support"]:
                assert clause.group(1).startswith("set aside the trained network"), clause.group(1)
            else:
                assert clause.group(1).startswith(f"preferred {sel['chosen']}"), clause.group(1)


def test_the_line_cites_the_weakest_production_seed_and_its_verdict() -> None:
    doc = results()["production"]
    rows = [r for r in table_lines() if code(r[6]).startswith("train_selection/results_production.json:")]
    assert len(rows) == 1
    row = rows[0]
    m = re.fullmatch(r"train_selection/results_production\.json:runs\[(\d+)\]\.default\.exported_real", code(row[6]))
    assert m, row[6]
    cited = doc["runs"][int(m.group(1))]
    weakest = min(doc["runs"], key=lambda r: r["default"]["exported_real"])
    assert cited is weakest, f"the line cites seed {cited['seed']}, the weakest is seed {weakest['seed']}"
    assert f"seed {weakest['seed']})" in row[0], row[0]
    assert f"({weakest['best_simple_real']:.4f})" in row[2], f"the target should quote this run's best simple: {row[2]}"
    met = weakest["default"]["exported_real"] >= weakest["best_simple_real"]
    assert row[4].startswith("met" if met else "missed"), row[4]
