"""The planner's designs (issue 48, "power from the design"): matched pairs by the twin's predicted
effect and the pre-period, randomized within pairs through the edge's keyed-hash router, analysed
as pairs by the verdict; the planner picks the design whose expected interval is narrower."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from edgetwin.contract.errors import InputError
from edgetwin.edge.canary_slice import CanarySlice, SliceRouter
from edgetwin.loop.plan import MAX_PAIRS, matched_pairs, pair_split_seed
from edgetwin.loop.ppi import pair_order, ppi_mean_difference


def test_matched_pairs_pair_neighbours_by_effect_and_pre_period() -> None:
    agents = [f"g{i}" for i in range(8)]
    effect = {a: float(i // 2) for i, a in enumerate(agents)}  # g0,g1 alike; g2,g3 alike; ...
    pre = {a: 10.0 * (i // 2) for i, a in enumerate(agents)}
    pairs = matched_pairs(list(reversed(agents)), effect, pre)
    assert sorted(tuple(sorted(p)) for p in pairs) == [("g0", "g1"), ("g2", "g3"), ("g4", "g5"), ("g6", "g7")]
    # every group once; an odd group out is left unpaired
    odd = matched_pairs(agents[:7], effect, pre)
    assert len(odd) == 3 and len({a for p in odd for a in p}) == 6
    # the pre-period alone pairs when the twin predicts no difference between groups
    flat = matched_pairs(agents, dict.fromkeys(agents, 0.0), {a: float(i % 4) for i, a in enumerate(agents)})
    assert all(int(a[1:]) % 4 == int(b[1:]) % 4 for a, b in flat)


def test_pair_split_seed_splits_every_pair_and_randomizes_within_pairs() -> None:
    pairs = [(f"a{i}", f"b{i}") for i in range(5)]
    agents = tuple(a for p in pairs for a in p)
    firsts = []
    for base in range(0, 4000, 20):
        s = pair_split_seed(pairs, base)
        assert s is not None and s >= base
        router = SliceRouter(CanarySlice(agents, (), 0.5, s), "candidate", "current")
        arms = {a: router.arm(a) for a in agents}
        assert all((arms[a] == "candidate") != (arms[b] == "candidate") for a, b in pairs)
        firsts.append(arms["a0"] == "candidate")
    # within a pair, either group is the candidate about half the time (200 draws: 0.5 ± 0.12)
    assert 0.38 < float(np.mean(firsts)) < 0.62
    assert pair_split_seed([(f"x{i}", f"y{i}") for i in range(30)], 0, tries=50) is None


def _paired_world(rng: np.random.Generator, k: int) -> tuple[np.ndarray, np.ndarray]:
    """``k`` pairs of groups whose levels differ a lot between pairs and little within them."""
    level = np.repeat(rng.normal(10.0, 3.0, k), 2) + rng.normal(0.0, 0.3, 2 * k)
    return level, level.copy()


def test_paired_analysis_is_narrower_than_welch_on_the_same_pairs() -> None:
    rng = np.random.default_rng(3)
    k, effect, reps = 6, 0.5, 300
    width_p, width_u = [], []
    fleet = rng.normal(10.0, 3.0, 200)
    for _ in range(reps):
        y0, _ = _paired_world(rng, k)
        flip = rng.random(k) < 0.5  # which member of each pair gets the candidate
        ic = np.arange(k) * 2 + flip
        ib = np.arange(k) * 2 + (~flip)
        yc, yb = y0[ic] + effect, y0[ib]
        f = np.full(2 * k, 10.0)  # a twin that knows nothing about the groups
        args = (fleet, fleet, yc, f[ic], yb, f[ib])
        p = ppi_mean_difference(*args, paired=True)
        u = ppi_mean_difference(*args)
        width_p.append(p["rel_hi"] - p["rel_lo"])
        width_u.append(u["rel_hi"] - u["rel_lo"])
    assert np.median(width_p) < 0.7 * np.median(width_u)  # pairing removes the between-pair spread
    assert p["paired"] == 1.0 and u["paired"] == 0.0
    with pytest.raises(ValueError, match="as many"):
        ppi_mean_difference(fleet, fleet, yc, f[ic], yb[:-1], f[ib][:-1], paired=True)


def test_paired_interval_holds_its_level() -> None:
    """Coverage of the paired 90 % interval of the difference over pair randomizations (the
    fleet term made negligible so that the rectifier's term is what is checked)."""
    rng = np.random.default_rng(11)
    k, effect, reps, hits = 6, 0.4, 2000, 0
    fleet = np.full(5000, 10.0) + rng.normal(0, 1e-6, 5000)
    for _ in range(reps):
        y0, _ = _paired_world(rng, k)
        flip = rng.random(k) < 0.5
        ic, ib = np.arange(k) * 2 + flip, np.arange(k) * 2 + (~flip)
        f = np.full(2 * k, 10.0)
        e = ppi_mean_difference(fleet, fleet, y0[ic] + effect, f[ic], y0[ib], f[ib], paired=True)
        from edgetwin.loop.ppi import t_quantile

        q = t_quantile(0.90, e["df"])
        hits += e["diff"] - q * e["diff_se"] <= effect <= e["diff"] + q * e["diff_se"]
    assert 0.87 <= hits / reps <= 0.94


def test_pair_order_only_when_every_pair_was_split() -> None:
    import pandas as pd

    m = pd.DataFrame({"arm": ["candidate", "control", "control", "candidate"]}, index=["a", "b", "c", "d"])
    is_c = (m["arm"] == "candidate").to_numpy()
    ic, ib = pair_order(m, is_c, [("a", "b"), ("c", "d")])
    assert list(m.index[ic]) == ["a", "d"] and list(m.index[ib]) == ["b", "c"]
    assert pair_order(m, is_c, [("a", "d"), ("b", "c")]) is None  # a pair on one arm: unpaired analysis
    assert pair_order(m, is_c, [("a", "b")]) is None  # groups outside the pairs were measured
    assert pair_order(m, is_c, None) is None
    assert MAX_PAIRS >= 5


def test_plan_canary_rejects_an_unknown_design() -> None:
    from edgetwin.loop.plan import plan_canary

    with pytest.raises(InputError, match="unknown canary design"):
        plan_canary(None, None, None, None, None, design="stratified")  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def gated(canary_world_dir: Path):  # type: ignore[no-untyped-def]
    """The canary loop's small twin (tests/conftest.py's `canary_world_dir`: 2 random episodes of a
    40-agent, 24-step cluster, seed 0; 2 members, no adversarial round, 2 BC epochs; fitted once per
    run), another day's log (seed 7), the always-edge candidate and the gate's decision."""
    import torch

    from edgetwin.emulator.cluster import ClusterConfig
    from edgetwin.emulator.logs import generate_logs
    from edgetwin.policies.gate import resolve_policy, run_gate
    from edgetwin.twin.twin import Twin
    from edgetwin.twin.whatif import fixed_policy

    torch.set_num_threads(1)
    cluster = ClusterConfig(n_agents=40, steps=24)
    twin = Twin.load(canary_world_dir / "twin")
    log, _ = generate_logs(cluster, 1, "random", seed=7)

    class Edge:
        def act(self, obs: np.ndarray) -> np.ndarray:
            return np.tile([1.0, 0.3, 0.2], (len(obs), 1))

    cand = fixed_policy("always-edge", Edge())
    base = resolve_policy("logging", twin, name="current")
    return {"twin": twin, "log": log, "cand": cand, "base": base,
            "decision": run_gate(twin, cand, base, log=log, episodes=1, seed=0)}  # fmt: skip


def test_planner_matched_pairs_feed_the_edge_router_and_auto_weighs_both(gated) -> None:  # type: ignore[no-untyped-def]
    from edgetwin.edge.canary import CanaryConfig
    from edgetwin.loop.plan import CanaryPlan, PlanBudget, plan_canary
    from edgetwin.loop.rounds import balanced

    args = (gated["decision"], gated["twin"], gated["log"], gated["cand"], gated["base"], PlanBudget(max_share=0.25))
    mp = plan_canary(*args, seed=2, design="matched_pairs")
    assert mp.slice.design == "matched_pairs" and 2 * len(mp.slice.pairs) == mp.n_groups
    assert {a for p in mp.slice.pairs for a in p} == set(mp.slice.agents)
    assert balanced(mp).slice.seed == mp.slice.seed  # a pair-splitting seed is already balanced
    cfg = CanaryConfig.from_plan(mp, "candidate")
    router = SliceRouter(cfg.slice, "candidate", "current")
    assert all((router.arm(a) == "candidate") != (router.arm(b) == "candidate") for a, b in mp.slice.pairs)
    assert CanaryPlan.from_dict(mp.to_dict()).slice == mp.slice  # the pairs survive the plan file
    rnd = plan_canary(*args, seed=2, design="random")
    assert rnd.slice.design == "random" and rnd.slice.pairs == () and set(rnd.expected_width) == {"random"}
    auto = plan_canary(*args, seed=2)
    # auto weighed both designs at the chosen size and kept the narrower expected interval
    assert set(auto.expected_width) == {"random", "matched_pairs"}
    assert auto.expected_width[auto.slice.design] == min(auto.expected_width.values())
