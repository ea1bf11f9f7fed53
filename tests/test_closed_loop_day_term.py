"""The closed-loop page's day-term section (benchmarks/_closed_loop_dayterm.py, issue 48): its numbers are
the JSONs' (regenerated and compared), the loop scores count what they say, and the day-varying coverage
simulation shows the twin's day term alone under-covering where the rounds' own term does not."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks" / "closed_loop"


@pytest.fixture(scope="module")
def dt() -> Iterator[Any]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import _closed_loop_dayterm

    yield _closed_loop_dayterm
    sys.path.remove(str(ROOT / "benchmarks"))


def _page_section(heading: str) -> str:
    text = (OUT / "README.md").read_text()
    start = text.index(heading)
    nxt = text.find("\n## ", start + 1)
    return text[start: nxt + 1 if nxt != -1 else len(text)]


def test_the_page_section_is_the_jsons(dt: Any) -> None:
    """Every number of the section comes from the JSONs: regenerating it gives the page's text."""
    from _docs import relink

    seeds = [0, 1, 2]
    diag = [json.loads((OUT / "scale" / f"day_term_seed{s}.json").read_text()) for s in seeds
            if (OUT / "scale" / f"day_term_seed{s}.json").is_file()]  # fmt: skip
    assert diag, "no diagnosis JSON"
    cur = json.loads((OUT / "results_production.json").read_text())
    want = relink(dt.section(diag, cur.get("day_term_coverage"), cur.get("day_term_loop", {}), cur.get("day_term_bound"),
                             cur.get("day_term_same_code")), OUT / "README.md")
    assert _page_section(dt.SECTION).strip() == want.strip()


def test_the_diagnosis_shows_the_replay_missing_the_days(dt: Any) -> None:
    """The diagnosis' reading, tested on its JSONs: the twin's replay (one seed or one a day) spreads
    the change far less than the emulator's days, its level far less than the logs, and the
    calibrated term is larger than the replay's on every KPI."""
    for s in (0, 1, 2):
        path = OUT / "scale" / f"day_term_seed{s}.json"
        if not path.is_file():
            continue
        d = json.loads(path.read_text())
        for c in d["columns"]:
            twin_lvl = np.median([r["per_day_seed"]["level_sd"][c] for r in d["candidates"].values()])
            assert twin_lvl < d["observed_level_sd"][c] / 2
            for r in d["candidates"].values():
                assert r["product"][c]["effect_sd"] >= r["per_day_seed"]["effect_sd"][c] * (1 - 1e-9)


def _doc(pairs: list[dict[str, Any]], rounds: list[dict[str, Any]]) -> dict[str, Any]:
    return {"by_fleet_size": {"1000": {"complete": True, "pairs": pairs, "per_candidate": [
        {"policy": "a", "rounds": rounds, "twin_canary_agent_steps": 10}]}}}


def test_loop_scores_count_decisions_agreement_and_coverage(dt: Any) -> None:
    pairs = [
        {"policy": "a", "kpi": "k1", "column": "k1", "twin_alone": "straddle", "twin_canary": "ok", "truth_change": 0.01,
         "truth_regress": False},
        {"policy": "a", "kpi": "k2", "column": "k2", "twin_alone": "straddle", "twin_canary": "ok", "truth_change": 0.2,
         "truth_regress": True},
        {"policy": "a", "kpi": "k3", "column": "k3", "twin_alone": "straddle", "twin_canary": "abstain", "truth_change": 0.0,
         "truth_regress": False},
        {"policy": "a", "kpi": "k4", "column": "k4", "twin_alone": "ok", "twin_canary": "ok", "truth_change": 0.0,
         "truth_regress": False},
    ]  # fmt: skip
    why = {"k1": {"interval": [-0.1, 0.1]}, "k2": {"interval": [-0.1, 0.1]}, "k3": {"interval": [-0.5, 0.5]}}
    got = dt.loop_scores(_doc(pairs, [{"why": why}]))
    assert (got["decided"]["k"], got["decided"]["n"]) == (2, 3)  # the twin alone decided k4
    assert (got["agreement"]["k"], got["agreement"]["n"]) == (1, 2)
    assert got["wrong"] == ["a k2 ok (truth +20.0 %)"]
    assert (got["coverage"]["k"], got["coverage"]["n"]) == (2, 3)


def test_day_varying_truth_the_rounds_term_restores_coverage(dt: Any) -> None:
    """Synthetic days (no emulator): 2,000 groups, the effect moving 8 % from day to day, canaries on
    4 days. Pooling with the twin's day term alone covers the multi-day truth far below 90 % (the
    twin's replay does not carry the effect's day shock); with the rounds' own between-day term it
    is near the level, at a wider interval."""
    rng = np.random.default_rng(1)
    days = [{"y": rng.gamma(4.0, 0.05, 2000) * (1 + rng.normal(0, 0.05)), "x": rng.gamma(4.0, 0.05, 2000)}
            for _ in range(16)]  # fmt: skip
    res = dt.day_coverage(days, 150, 0, 0.08, 4)
    assert np.mean([r["coverage_twin_only"] for r in res.values()]) < 0.75
    for r in res.values():
        assert r["coverage"] >= 0.85
        assert r["coverage_twin_only"] <= r["coverage"] - 0.1
        assert r["median_width"] > r["median_width_twin_only"]


def test_the_readme_quotes_the_day_terms_loop_reruns() -> None:
    """README's day-term sentences: the term before (the stored bound's twin day sd against the emulator's), and
    the 1,000-group loops rerun with the new term, fleet and slice control, before and after (day_term_pooled)."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    bound = json.loads((OUT / "results_production.json").read_text())["verdict_bound"]["runs"]
    twin = [v["twin_day_sd"] for r in bound.values() for k, v in r["by_kpi"].items() if k != "reward"]
    emu = [v["day_sd"] for k, v in bound["extended_reseeded"]["by_kpi"].items() if k != "reward"]
    assert (f"the twin's replay of other days ({100 * min(twin):.1f}-{100 * max(twin):.1f} % per KPI), understated how "
            f"a decision varies from day to day: the emulator's own 20 days spread the fleet-wide effect by "
            f"{100 * min(emu):.1f}-{100 * max(emu):.1f} % per KPI") in readme
    pooled = json.loads((OUT / "results_production.json").read_text())["day_term_pooled"]
    fc, sl = pooled["fc"], pooled["sl"]
    assert fc["seeds"] == sl["seeds"] == [0, 1, 2]

    def ci(x: dict[str, Any]) -> str:
        return f"{100 * x['rate']:.1f} % [{100 * x['ci'][0]:.1f} %, {100 * x['ci'][1]:.1f} %]"

    fa, fb, sa, sb = fc["after"], fc["before"], sl["after"], sl["before"]
    assert fa["decided"]["n"] == 84 and fa["agreement"]["k"] == fa["agreement"]["n"] == fa["decided"]["k"]
    assert (f"the fleet-as-control loop decides {fa['decided']['k']} of 84 open pairs ({ci(fa['decided'])}, was "
            f"{fb['decided']['k']}), all {fa['decided']['k']} right (was {fb['agreement']['k']} of "
            f"{fb['agreement']['n']}), and its last look's interval covers the 20-day truth for {fa['coverage']['k']} of "
            f"the 84 (was {fb['coverage']['k']})") in readme
    assert sa["agreement"]["k"] == sa["agreement"]["n"] == sa["decided"]["k"]
    assert (f"the default loop decides {sa['decided']['k']} ({ci(sa['decided'])}, was {sb['decided']['k']}), all "
            f"{sa['decided']['k']} right (was {sb['agreement']['k']} of {sb['agreement']['n']}), covering "
            f"{sa['coverage']['k']} of 84 (was {sb['coverage']['k']})") in readme
