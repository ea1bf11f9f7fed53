"""The twin-fidelity page's subsection "The offset diagnosed (issue 44)" is docs/benchmarks/twin_fidelity/offset.json
(`python benchmarks/_twin_offset.py --json ...`): every number it states is read back from the run here."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TASK = "kpi.task_time_ms"
HEADING = "### The offset diagnosed (issue 44)"


def _page() -> str:
    text = (ROOT / "docs/benchmarks/twin_fidelity/README.md").read_text()
    start = text.index(HEADING)
    end = text.find("\n### ", start + len(HEADING))
    return " ".join(text[start:end if end > 0 else None].split())


def _offset() -> dict:  # type: ignore[type-arg]
    return json.loads((ROOT / "docs/benchmarks/twin_fidelity/offset.json").read_text())


def _run(members: int, days: int) -> dict:  # type: ignore[type-arg]
    return next(r for r in _offset()["runs"] if r["members"] == members and r["days"] == days)


def test_the_cause_the_page_names_is_the_run() -> None:
    page, d, r = _page(), _offset(), _run(3, 6)
    days = r["train_day_task_time_ms"]
    others = [v for i, v in enumerate(days) if i not in (2, 4)]
    assert max(others) < days[2] < days[4]  # day 4 the overload day, day 2 the other heavy one
    assert f"mean task time is {days[4]:,.0f} ms (day 4; day 2: {days[2]:,.0f} ms; the four others " \
           f"{min(others):,.0f}-{max(others):,.0f} ms)" in page
    draws = r["draws"]
    assert 2 not in draws[0] and 4 not in draws[0] and 4 not in draws[2] and 4 in draws[1]
    assert f"0's draw (days {', '.join(map(str, draws[0]))}) left out days 2 and 4" in page
    assert f"member 2's (days {', '.join(map(str, draws[2]))}) left out day 4" in page
    ho = r["sources"]["held-out"]
    assert ho["noise_source"] == ["held-out episodes"] * 3
    k = ho["one_step_task_time_ratio"]
    assert k[0] > 2 and k[2] > 2 and k[1] < 1  # the two members read on the overload days, and the one not
    assert f"their task time is {k[0]:.2f} and {k[2]:.2f} times the logged mean" in page
    assert f"on days 0 and 2: {k[1]:.2f})" in page
    assert [i for i in range(6) if i not in draws[1]] == [0, 2]
    # "the task-time term carries the offset; the other terms move by a few hundredths"
    a, b = ho["all_members"], r["sources"]["training"]["all_members"]
    moved = {c: a[c] - b[c] for c in a}
    assert all(abs(v) < 0.05 for c, v in moved.items() if c not in ("reward", TASK))
    assert f"of the {-moved['reward']:.3f} the fix moves, the task-time term is {-moved[TASK]:.3f}" in page
    assert f"`python benchmarks/_twin_offset.py --json docs/benchmarks/twin_fidelity/offset.json`, {d['minutes']:.0f} min" \
        in page
    assert f"GAN-SMMSG {d['pop_steps']} steps as the full run, {d['rounds']} GAIL rounds" in page
    assert f"on {d['eval_days']} cluster days" in page


def test_the_bisection_table_is_the_run() -> None:
    page = _page()

    def f3(x: float) -> str:
        return f"{x:+.3f}"

    for members, days in ((1, 3), (3, 3), (1, 6), (3, 6)):
        r = _run(members, days)
        a, b, c = r["sources"]["held-out"]["all_members"], r["sources"]["training"]["all_members"], r["cluster"]
        row = (f"| {members} | {days} | {f3(c['reward'])} ({f3(c[TASK])}) | {f3(a['reward'])} ({f3(a[TASK])}) | "
               f"{f3(b['reward'])} ({f3(b[TASK])}) |")
        assert row in page, row
    one = _run(1, 3)["sources"]
    assert one["held-out"]["noise_source"] == ["training episodes"]  # one member: nothing left out
    r = _run(3, 3)
    assert all(2 in dr for dr in r["draws"])  # "no draw leaves out the third"
    assert "the three training days' mean task times are " + ", ".join(
        f"{v:,.0f}" for v in r["train_day_task_time_ms"][:2]) + f" and {r['train_day_task_time_ms'][2]:,.0f} ms" in page
    above = r["sources"]["held-out"]["all_members"]["reward"] - r["cluster"]["reward"]
    assert above > 0 and f"{above:+.3f} above the cluster, and the member's own days give " \
        f"{r['sources']['training']['all_members']['reward']:+.3f}" in page


def test_the_full_configuration_reproduces_the_full_runs_offset_and_the_fix_removes_most_of_it() -> None:
    page, r = _page(), _run(3, 6)
    c = r["cluster"]["reward"]
    ho, tn = r["sources"]["held-out"], r["sources"]["training"]
    gap = c - ho["all_members"]["reward"]
    assert f"{ho['all_members']['reward']:+.3f} against the cluster's {c:+.3f}, {gap:.2f} below" in page
    assert "per member " + ", ".join(f"{x['reward']:+.3f}" for x in ho["member"]) in page
    # the full run's random policy was 0.88 below (the rerun at 869c062, results_reward_rerun.json)
    full = json.loads((ROOT / "docs/benchmarks/twin_fidelity/results_reward_rerun.json").read_text())
    random = next(x for x in full["ranking"] if x["policy"] == "random")
    assert f"(the full run's random policy: {random['real'] - random['twin']:.2f} below)" in page
    assert abs(gap - (random["real"] - random["twin"])) < 0.1
    after = c - tn["all_members"]["reward"]
    assert after < gap / 4
    assert tn["noise_source"] == ["training episodes"] * 3
    k = tn["one_step_task_time_ratio"]
    assert max(k) < 1.0
    assert f"task time is now {', '.join(f'{x:.2f}' for x in k)} times the logged mean" in page
    assert f"mean reward {tn['all_members']['reward']:+.3f}, {after:.3f} below the cluster's (per member " + \
        ", ".join(f"{x['reward']:+.3f}" for x in tn["member"]) + ")" in page


def test_what_remains_is_the_single_member_six_day_twins_gap() -> None:
    page, r = _page(), _run(1, 6)
    tn = r["sources"]["training"]["all_members"]
    assert np.isclose(r["sources"]["held-out"]["all_members"]["reward"], tn["reward"], atol=0.02)  # the same model
    assert f"is still {r['cluster']['reward'] - tn['reward']:.2f} below the cluster, by task time too " \
           f"({tn[TASK]:+.3f} against {r['cluster'][TASK]:+.3f})" in page


def _full() -> dict:  # type: ignore[type-arg]
    return json.loads((ROOT / "docs/benchmarks/twin_fidelity/results.json").read_text())


REPLAY = "twin, replaying the evaluation days' populations"


def test_the_full_run_after_the_fix_is_results_json() -> None:
    """The paragraph "The full run after the fix" against results.json (this run) and results_reward_rerun.json
    (the rerun at 869c062, before the fix)."""
    page, d = _page(), _full()
    old = json.loads((ROOT / "docs/benchmarks/twin_fidelity/results_reward_rerun.json").read_text())
    g = [x["twin"] - x["real"] for x in d["ranking"]]
    r = [x[REPLAY] - x["real"] for x in d["ranking"]]
    g0 = [x["twin"] - x["real"] for x in old["ranking"]]
    r0 = [x[REPLAY] - x["real"] for x in old["ranking"]]
    tw, rp = d["scores"]["twin"], d["scores"][REPLAY]
    assert f"twin minus real lies within {min(r):+.3f} to {max(r):+.3f} per policy (before: {min(r0):+.2f} to " \
           f"{max(r0):+.2f}), normalised absolute error {rp['norm_abs_error']:.2f} (before " \
           f"{old['scores'][REPLAY]['norm_abs_error']:.2f})" in page
    below = sum(1 for x in g if x < 0)
    assert f"still below the cluster on {below} of the {len(g)} policies: twin minus real lies within {min(g):+.3f} to " \
           f"{max(g):+.3f} (before {min(g0):+.2f} to {max(g0):+.2f}); normalised absolute error " \
           f"{tw['norm_abs_error']:.2f} (before {old['scores']['twin']['norm_abs_error']:.2f})" in page
    assert tw["norm_abs_error"] < old["scores"]["twin"]["norm_abs_error"] / 3  # the offset is gone, mostly
    assert max(abs(x) for x in r) < max(abs(x) for x in r0) / 3
    rand = next(x for x in d["ranking"] if x["policy"] == "random")
    diag = _run(3, 6)
    assert f"the random policy {rand['twin']:+.3f} against {rand['real']:+.3f} (the diagnostic's three members on six " \
           f"days: {diag['sources']['training']['all_members']['reward']:+.3f} against {diag['cluster']['reward']:+.3f})" \
        in page
    lo, hi = tw["spearman_ci90"]
    plo, phi = rp["spearman_ci90"]
    assert f"rho {tw['spearman']:.2f} [{lo:.2f}, {hi:.2f}] with generated populations, {rp['spearman']:.2f} " \
           f"[{plo:.2f}, {phi:.2f}] replaying (before {old['scores']['twin']['spearman']:.2f} / " \
           f"{old['scores'][REPLAY]['spearman']:.2f}" in page
    reals = sorted(x["real"] for x in d["ranking"])
    se = float(np.mean([x["real_se"] for x in d["ranking"]]))
    span = reals[-1] - reals[1]
    assert f"11 of the 12 policies' real values lie within a span of {span:.3f}, {span / se:.1f} times the standard " \
           f"error of a policy's 10-day mean ({se:.3f})" in page
    # "what remains": the replay column within the same range, the generated twin's gap larger
    assert f"the twin is within {min(r):+.3f} to {max(r):+.3f} of every policy" in page
    assert min(g) < min(r)


def test_seed_1_without_an_overload_day_reads_both_ways_alike() -> None:
    page = _page()
    d = json.loads((ROOT / "docs/benchmarks/twin_fidelity/offset_seed1.json").read_text())
    (r,) = d["runs"]
    assert (r["members"], r["days"], d["seed"]) == (3, 6, 1)
    days = r["train_day_task_time_ms"]
    assert f"no training day is overloaded (day means {min(days):,.0f}-{max(days):,.0f} ms)" in page
    ho, tn = r["sources"]["held-out"]["all_members"]["reward"], r["sources"]["training"]["all_members"]["reward"]
    assert abs(ho - tn) < 0.02
    c = r["cluster"]["reward"]
    assert f"({ho:+.3f} with the former, {tn:+.3f} with the member's own days), and the twin is {tn - c:.2f} *above* " \
           f"the cluster's {c:+.3f}" in page
    assert f"--seed 1 --configs 3x6 --json docs/benchmarks/twin_fidelity/offset_seed1.json`, {d['minutes']:.0f} min" in page
