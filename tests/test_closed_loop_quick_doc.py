"""The closed-loop page's quick section under today's reward and a loss budget on one-signed KPIs only: the
hand-written "What the numbers say" and the at-a-glance lines quote results_<logging>.json's quick runs."""

from __future__ import annotations

import collections
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from scipy.stats import beta

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs/benchmarks/closed_loop"


def _res(logging: str = "production") -> dict[str, Any]:
    return json.loads((DOCS / f"results_{logging}.json").read_text())


def _said() -> str:
    page = (DOCS / "README.md").read_text()
    start = page.index("### What the numbers say")
    return " ".join(page[start:page.index("\n## ", start)].split())


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def _cp(k: int, n: int) -> str:
    """Clopper-Pearson 95 % interval of k of n, as the page writes it."""
    lo = 0.0 if k == 0 else float(beta.ppf(0.025, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(0.975, k + 1, n - k))
    return f"[{_pct(lo)}, {_pct(hi)}]"


def _lines(field: str) -> list[str]:
    readme = (ROOT / "docs/benchmarks/README.md").read_text().splitlines()
    return [line for line in readme if f"closed_loop/results_production.json:{field}`" in line and "--quick" in line]


def _decided(res: dict[str, Any]) -> list[dict[str, Any]]:
    return [p for p in res["pairs"] if p["twin_canary"] in ("ok", "regress")]


def _right(p: dict[str, Any]) -> bool:
    return (p["twin_canary"] == "regress") == bool(p["truth_regress"])


def test_the_budget_caps_only_one_signed_kpis_and_the_loop_runs_canaries() -> None:
    for logging in ("production", "random"):
        res = _res(logging)
        assert set(res["config"]["max_loss"]) == {"kpi.slo_violation", "response.offload_ratio"}, logging
        assert res["twin_canary"]["canary_rounds"] > 0 and all(c["rounds"] for c in res["per_candidate"]), logging
    page = " ".join((DOCS / "README.md").read_text().split())
    assert "the loss budget caps kpi.slo_violation, response.offload_ratio (relative to the fleet's level): only KPIs " \
           "of one positive sign" in page
    diag = _res()["loss_budget_diagnosis"]  # the run before, under the four caps, kept
    assert {"reward", "return"} <= set(diag["caps"])
    text = _said()
    assert f"fleet mean {diag['levels']['reward']:.3f} per group-tick, the groups' day means spread by " \
           f"{diag['group_sd']['reward']:.2f}" in text
    share = [c["kpis"]["reward"]["share"] for c in diag["candidates"].values()]
    assert f"{min(share):.1f}× to {max(share):.1f}× its cap for all {len(share)} candidates" in text


def _stops(res: dict[str, Any]) -> collections.Counter[str]:
    return collections.Counter(r["stop"] for c in res["per_candidate"] for r in c["rounds"])


def test_what_the_numbers_say_quotes_the_production_run() -> None:
    res, text = _res(), _said()
    tc, ca = res["twin_canary"], res["canary_alone"]
    dec = _decided(res)
    right = sum(_right(p) for p in dec)
    assert len(dec) == tc["decided"] and right / len(dec) == pytest.approx(tc["confident_agreement"])
    assert (f"{_pct(tc['verdict_rate'])} verdict rate ({tc['decided']} of {tc['pairs']} pairs, Clopper-Pearson 95 % "
            f"{_cp(tc['decided'], tc['pairs'])}; target ≥ 90 %: missed)") in text  # fmt: skip
    assert f"{_pct(tc['confident_agreement'])} of them right ({right} of {len(dec)}, {_cp(right, len(dec))}" in text
    assert tc["verdict_rate"] < 0.90
    n_cand = len(res["per_candidate"])
    assert f"{tc['canary_rounds']} rounds over the {n_cand} candidates, {tc['canary_agent_steps']:,} canary" in text
    assert f"{tc['rounds_over_budget']} rounds over the loss budget (target 0: met)" in text
    stops = _stops(res)
    assert f"loss-budget stop ending {stops['budget']} of them early and the guard {stops['guard']}" in text
    assert tc["rounds_over_budget"] == 0
    alone = collections.Counter(p["twin_alone"] for p in res["pairs"])
    assert f"({alone['unsupported']} *unsupported*, {alone['straddle']} *straddle*, {alone['below_level']} below" in text
    (one,) = dec  # the guard's refusal; its other KPIs judged on the completed round before the stopped one
    cand = next(c for c in res["per_candidate"] if c["policy"] == one["policy"])
    assert [r["stop"] for r in cand["rounds"]] == ["completed", "budget", "guard"]
    assert "every other KPI judged on the 1 completed day(s) before the one the guard stopped after 40 tick(s)" in cand["reason"]
    assert f"{one['policy']}'s revenue *regress* ({100 * one['truth_change']:+.1f} % on the cluster)" in text.replace("−", "-")
    assert f"The other {tc['pairs'] - tc['decided']} pairs stay open" in text
    assert f"decides {_pct(ca['verdict_rate'])} of the pairs, {_pct(ca['confident_agreement'])} of them right" in text
    reach = res["canary_steps_reach"]
    assert reach["steps"] is None and res["quick_canary_steps_ratio"] is None
    assert (f"≥ {reach['lower_bound']:.1f}× (the sweep's largest point, {reach['max_steps']:,.0f} agent-steps, over the "
            f"loop's {tc['canary_agent_steps']:,})") in text
    sweep = [p["confident_agreement"] for p in res["canary_alone_sweep"]]
    assert f"({_pct(min(sweep))[:-2]}-{_pct(max(sweep))} right at every point" in text


def test_the_stopped_day_bullet_quotes_both_runs() -> None:
    """"What the stopped-day rule does here" against the rerun and the run before it (kept)."""
    res, rnd, text = _res(), _res("random"), _said()
    cut = sum(v for k, v in _stops(res).items() if k != "completed")
    cut_r = sum(v for k, v in _stops(rnd).items() if k != "completed")
    assert f"Ten of the {res['twin_canary']['canary_rounds']} production rounds and {cut_r} of the" in text and cut == 10
    cloud = next(c for c in res["per_candidate"] if c["policy"] == "cloud-only, no capacity")
    assert {r["stop"] for r in cloud["rounds"]} == {"budget"} and "judged on no day" in cloud["reason"]
    before, before_r = res["before_stopped_day_quick"], rnd["before_stopped_day_quick"]
    dec = [p for p in before["pairs"] if p["twin_canary"] in ("ok", "regress")]
    assert f"The run before decided {len(dec)} production pairs ({sum(_right(p) for p in dec)} right)" in text
    (wrong,) = [p for p in dec if not _right(p)]
    assert wrong["policy"] == "constant (0.9, 1.2, 0.2)" and f"{100 * wrong['truth_change']:+.1f} % on the cluster" in text
    dec_r = [p for p in before_r["pairs"] if p["twin_canary"] in ("ok", "regress")]
    assert f"On random logs it decided {len(dec_r)} (both right)" in text and all(_right(p) for p in dec_r)
    stopped = next(c for c in before_r["per_candidate"] if c["policy"] == "cloud-only, no capacity")
    assert (stopped["rounds"][-1]["stop"], stopped["rounds"][-1]["verdict"]) == ("budget", "refuse")


def test_what_the_numbers_say_quotes_the_random_run() -> None:
    res, text = _res("random"), _said()
    tc, ca = res["twin_canary"], res["canary_alone"]
    assert not _decided(res) and tc["decided"] == 0 and tc["confident_agreement"] is None
    assert f"Twin + canary decides none of the {tc['pairs']} pairs (Clopper-Pearson 95 % {_cp(0, tc['pairs'])})" in text
    alone = collections.Counter(p["twin_alone"] for p in res["pairs"])
    assert f"({alone['straddle']} *straddle*, {alone['below_level']} below the asked level)" in text
    assert f"{tc['canary_rounds']} rounds, {tc['canary_agent_steps']:,} canary agent-steps, 0 over the" in text
    assert f"the loss-budget stop ending {_stops(res)['budget']} early" in text
    assert tc["rounds_over_budget"] == 0
    assert f"decides {_pct(ca['verdict_rate'])} at {_pct(ca['confident_agreement'])}" in text


def test_what_the_numbers_say_quotes_the_run_before_the_reward_change() -> None:
    """The old run's numbers, as git holds them at 44bf262."""
    shown = subprocess.run(["git", "-C", str(ROOT), "show", "44bf262:docs/benchmarks/closed_loop/results_production.json"],
                           capture_output=True, text=True, check=False)  # fmt: skip
    if shown.returncode != 0:
        pytest.skip("git history with 44bf262 unavailable")
    old, text = json.loads(shown.stdout)["twin_canary"], _said()
    assert f"decided {_pct(old['verdict_rate'])} at {_pct(old['confident_agreement'])} agreement" in text
    assert f"0 of {old['canary_rounds']} rounds over budget" in text and old["rounds_over_budget"] == 0


def test_the_at_a_glance_lines_say_what_the_quick_run_did() -> None:
    res = _res()
    tc, ca = res["twin_canary"], res["canary_alone"]
    (rate,) = _lines("twin_canary.verdict_rate × 100")
    alone = collections.Counter(p["twin_alone"] for p in res["pairs"])
    assert f"= {tc['pairs']} pairs" in rate and f"| {_pct(tc['verdict_rate'])} | missed |" in rate
    assert f"{alone['unsupported']} unsupported, {alone['straddle']} straddle, {alone['below_level']} below" in rate
    assert f"{tc['canary_rounds']} canary rounds decide {tc['decided']} pair{'s' * (tc['decided'] != 1)}, Clopper-Pearson 95 % " \
           f"{_cp(tc['decided'], tc['pairs'])}" in rate
    (agree,) = _lines("twin_canary.confident_agreement × 100")
    right = sum(_right(p) for p in _decided(res))
    assert f"{right} of {tc['decided']}, Clopper-Pearson 95 % {_cp(right, tc['decided'])}" in agree
    assert f"| {_pct(tc['confident_agreement'])} | unverified: {tc['decided']} verdict cannot show ≥ 97 %" in agree
    assert f"decides {_pct(ca['verdict_rate'])} at {_pct(ca['confident_agreement'])}" in agree
    (steps,) = _lines("canary_steps_reach.lower_bound")
    reach = res["canary_steps_reach"]
    assert f"| ≥ {reach['lower_bound']:.1f}× | unverified: not reached" in steps and f"loop's {tc['canary_agent_steps']:,}" in steps
    assert f"largest point's {reach['max_steps']:,.0f} agent-steps" in steps
    (budget,) = _lines("twin_canary.rounds_over_budget")
    stops = sum(r["stop"] == "budget" for c in res["per_candidate"] for r in c["rounds"])
    sweep = res["canary_alone_sweep"]
    over = sum(p["rounds_over_budget"] for p in sweep)
    assert f"{tc['rounds_over_budget']} of {tc['canary_rounds']} rounds, the edge's loss-budget stop ending {stops}" in budget
    assert f"went over on {over} of its {len(sweep) * len(res['per_candidate'])} canaries" in budget
    assert f"| {tc['rounds_over_budget']} | met |" in budget and tc["rounds_over_budget"] == 0
