"""The randomized-saturation simulation (benchmarks/_closed_loop_saturation.py, issue 48): the site slope's
OLS and its variance, the design comparison's bookkeeping on synthetic days, the `Twin.update` narrowing
read from stored extended loops, and the page section."""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def sat(monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))  # the module imports closed_loop when it runs
    return importlib.import_module("_closed_loop_saturation")


def test_site_slope_recovers_a_linear_spillover_and_says_how_sure_it_is(sat) -> None:  # type: ignore[no-untyped-def]
    site = np.repeat(np.array(["a", "b", "c", "d"]), 50)
    share = {"a": 0.0, "b": 0.05, "c": 0.10, "d": 0.15}
    r = 2.0 * np.array([share[s] for s in site])  # exactly linear: slope 2, no residual
    beta, var, df = sat.site_slope(r, site, share)
    assert beta == pytest.approx(2.0) and var == pytest.approx(0.0, abs=1e-20) and df == 2.0
    rng = np.random.default_rng(0)
    beta, var, df = sat.site_slope(r + rng.normal(0, 0.01, len(r)), site, share)
    assert abs(beta - 2.0) < 0.5 and var > 0 and df == 2.0
    # two sites leave no degree of freedom for the slope's variance: infinite, never a fake precision
    assert sat.site_slope(r[:100], site[:100], {"a": 0.0, "b": 0.05})[1] == float("inf")


def _days(n: int = 300, days: int = 8) -> list[dict[str, Any]]:
    rng = np.random.default_rng(1)
    site = np.array(["edge-a", "edge-b", "edge-c"])[rng.integers(0, 3, n)]
    out = []
    for _ in range(days):
        site_shock = {k: rng.normal(0, 0.02) for k in ("edge-a", "edge-b", "edge-c")}
        y = np.clip(0.2 + rng.normal(0, 0.05, n) + np.array([site_shock[s] for s in site]), 0.01, None)
        out.append({"y": y, "x": y + rng.normal(0, 0.02, n), "site": site})
    return out


def test_the_comparison_scores_both_designs_on_the_same_canaries(sat) -> None:  # type: ignore[no-untyped-def]
    res = sat.saturation_comparison(_days(), runs=30, seed=0, interference_sd=0.01)
    for design in ("twin", "saturation"):
        for t in ("aa", "regressing"):
            r = res[design][t]
            assert 0.0 <= r["coverage"] <= 1.0 and 0.0 <= r["decided"] <= 1.0 and r["median_width"] > 0
    assert res["twin"]["aa"]["truth"] == 0.0 and res["twin"]["regressing"]["truth"] > 0.05
    # three sites' means give the slope 1 degree of freedom: far wider than a 1 % members' term
    assert res["saturation"]["aa"]["median_width"] > res["twin"]["aa"]["median_width"]
    # a wider members' term widens only the twin design
    wide = sat.saturation_comparison(_days(), runs=30, seed=0, interference_sd=0.2)
    assert wide["twin"]["aa"]["median_width"] > res["twin"]["aa"]["median_width"]
    assert wide["saturation"]["aa"]["median_width"] == pytest.approx(res["saturation"]["aa"]["median_width"])
    text = sat.saturation_section(res, "python benchmarks/closed_loop.py --saturation")
    assert text.startswith(sat.SECTION) and "randomized saturation by site" in text


def _look(interference: float, base: float = 1.0) -> dict[str, Any]:
    return {"why": {"kpi.slo_violation": {"terms": {"interference": interference, "base": base}}}}


def test_update_narrowing_compares_each_pair_s_first_and_last_look(sat, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    cands = [{"rounds": [_look(0.01 ** 2), {"why": None}, _look(0.03 ** 2)]},   # wider after the updates
             {"rounds": [_look(0.02 ** 2), _look(0.01 ** 2)]},                 # narrower
             {"rounds": [_look(0.05 ** 2)]}]                                   # one look: not compared
    (tmp_path / "extended_seed0.json").write_text(json.dumps({"by_fleet_size": {"1000": {"per_candidate": cands}}}))
    got = sat.update_narrowing(tmp_path)
    assert got["slice"]["pairs"] == 2 and got["slice"]["narrower"] == 1 and got["slice"]["compared"] == 2
    assert got["slice"]["median_ratio"] == pytest.approx(np.median([3.0, 0.5]))
    assert got["fleet"]["pairs"] == 0


def test_the_members_term_is_read_from_the_stored_levers(sat, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    from scipy import stats

    lev = {"level": 0.98, "candidates": {"x": {"levers": {"fleet_control_per_arm": {"kpi.slo_violation": {"interference": 0.1, "df": 10.0}}}}}}
    (tmp_path / "levers_seed0.json").write_text(json.dumps(lev))
    assert sat.members_interference_sd(tmp_path) == pytest.approx(0.1 / stats.t.ppf(0.99, 10.0))
    with pytest.raises(SystemExit):
        sat.members_interference_sd(tmp_path / "none")


def test_the_site_share_of_the_residual_is_what_the_site_means_explain(sat) -> None:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(3)
    site = np.repeat(np.array(["a", "b"]), 200)
    x = rng.normal(0, 1, 400)
    flat = {"y": 2.0 * x + rng.normal(0, 1, 400), "x": x, "site": site}  # no site effect
    shifted = {"y": 2.0 * x + rng.normal(0, 1, 400) + np.where(site == "a", 3.0, -3.0), "x": x, "site": site}
    assert sat.site_share_of_residual([flat])["median"] < 0.05
    got = sat.site_share_of_residual([flat, shifted])
    assert got["max"] > 0.8 and got["min"] < 0.05 and got["days"] == 2


def test_a_fleet_control_rerun_is_kept_beside_the_stored_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    sc = importlib.import_module("_closed_loop_scale")
    key, name, heading, keep, design = sc.fc_variant("")
    assert (key, name, heading) == ("extended_fleet_control", "extended_fc_seed", sc.EXT_FC_SECTION)
    key, name, heading, keep, design = sc.fc_variant("reseeded")
    assert key == "extended_fleet_control_reseeded" and name == "extended_fc_reseeded_seed"
    assert heading != sc.EXT_FC_SECTION and heading.startswith(sc.EXT_FC_SECTION) and keep[0].endswith("(reseeded)")
    assert "`extended_fleet_control_reseeded`" in design and "`extended_fleet_control`" not in design


def test_the_page_quotes_the_stored_saturation_run() -> None:
    res = json.loads((ROOT / "docs/benchmarks/closed_loop/results_production.json").read_text())["saturation"]
    page = (ROOT / "docs/benchmarks/closed_loop/README.md").read_text()
    text = " ".join(page[page.index("### What the saturation simulation says"):].split())
    sat, twin = res["saturation"]["aa"], res["twin"]["aa"]
    assert f"A/A median width {100 * sat['median_width']:.1f} pp against {100 * twin['median_width']:.1f} pp" in text
    assert sat["median_width"] > 5 * twin["median_width"] and "about 7×" in text
    assert f"a median {100 * res['site_share']['median']:.1f} % of the groups' CUPED-adjusted" in text
    upd = res["update_narrowing"]
    assert f"{upd['slice']['median_ratio']:.2f}× (slice control; narrower on only {upd['slice']['narrower']} of " \
           f"{upd['slice']['compared']} pairs)" in text
