"""The canary's twin replays, made cheaper (issue 48: the demo's time), answer exactly as before:
`twin_group_series` without the support check, and with `shared_replays` reusing a replay, gives the
frames the straightforward computation (every replay run, support measured, pandas means) gives."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch

from edgetwin.emulator.cluster import ClusterConfig
from edgetwin.emulator.logs import generate_logs
from edgetwin.loop.ppi import CanaryAssignment, twin_group_predictions, twin_group_series
from edgetwin.loop.twin_series import shared_replays
from edgetwin.twin.twin import Twin
from edgetwin.twin.whatif import NOMINAL, builtin_policy, fixed_policy
from edgetwin.twin.whatif.engine import run_episode
from edgetwin.twin.whatif.kpis import KpiDef
from edgetwin.twin.whatif.replay import logged_episodes

torch.set_num_threads(1)
CLUSTER = ClusterConfig(n_agents=24, steps=12)
KPIS = ["kpi.slo_violation", "reward", "action.edge_share"]


@pytest.fixture(scope="module")
def world() -> dict[str, Any]:
    log, spec = generate_logs(CLUSTER, 3, "random", seed=0)
    twin = Twin.fit(log, spec, seed=0, members=2, progress=False, rounds=0, bc_epochs=1,
                    population_model="empirical")  # fmt: skip
    return {"spec": spec, "twin": twin, "log": log}


def reference_series(twin: Any, policies: dict[str, Any], log: pd.DataFrame, kpis: Sequence[str], *,
                     episodes: int = 1, seed: int = 0, members: Sequence[int] | None = None) -> dict:  # fmt: skip
    """The computation before issue 48's change (commit e0d1bbd), verbatim: every replay run with
    the support check, per-replay pandas means, then their mean."""
    eps = logged_episodes(log, twin, max_episodes=episodes)
    kdefs = [KpiDef(k, k, "mean") for k in kpis]
    mem = list(members) if members is not None else list(range(twin.n_members))
    parts: dict[tuple[str, str], list[pd.DataFrame]] = {}
    for e_i, ep in enumerate(eps):
        ep_pols = {name: pol.spec_for(ep.agents, name) if isinstance(pol, CanaryAssignment) else pol
                   for name, pol in policies.items()}  # fmt: skip
        for m in mem:
            wseed = int(np.random.default_rng([seed, e_i, m]).integers(2**31))
            for name, pol in ep_pols.items():
                out = run_episode(twin, pol, NOMINAL, kdefs, seed=wseed, member=m, logged=ep)
                src = out.source if out.source is not None else np.arange(len(ep.agents))
                agents = np.asarray(ep.agents).astype(str)[src]
                for k in kpis:
                    frame = pd.DataFrame(out.series[k].T, index=agents)
                    parts.setdefault((name, k), []).append(frame.groupby(level=0).mean())
    return {key: pd.concat(fs).groupby(level=0).mean().sort_index() for key, fs in parts.items()}


def _same(a: dict, b: dict) -> None:
    assert list(a) == list(b)
    for key in a:
        pd.testing.assert_frame_equal(a[key], b[key], check_exact=True)


def _policies(world: dict[str, Any]) -> dict[str, Any]:
    twin = world["twin"]
    agents = sorted(world["log"]["agent"].astype(str).unique())
    cand, base = builtin_policy("random", twin), builtin_policy("logging", twin)
    return {"candidate": cand, "baseline": base, "canary": CanaryAssignment(cand, base, frozenset(agents[::3]))}


@pytest.mark.parametrize("episodes", [1, 3])
def test_series_without_the_support_check_are_the_reference(world: dict[str, Any], episodes: int) -> None:
    pols = _policies(world)
    _same(twin_group_series(world["twin"], pols, world["log"], KPIS, episodes=episodes, seed=5),
          reference_series(world["twin"], pols, world["log"], KPIS, episodes=episodes, seed=5))


@pytest.mark.parametrize("scenario", ["nominal", "link-degradation"])
def test_without_support_only_the_support_shares_change(world: dict[str, Any], scenario: str) -> None:
    """`run_episode(support=False)` draws the support rows all the same: every other number is equal,
    also under a scenario whose jitter draws from the same stream after them each tick."""
    from importlib.resources import files

    from edgetwin.twin.whatif import load_scenarios

    twin = world["twin"]
    shipped = load_scenarios(Path(str(files("edgetwin") / "data" / "whatif" / "emulated_cluster.toml")))
    scen = NOMINAL if scenario == "nominal" else next(s for s in shipped if s.name == scenario)
    ep = logged_episodes(world["log"], twin, max_episodes=1)[0]
    kdefs = [KpiDef(k, k, "mean") for k in [*KPIS, "state.rtt_edge_ms"]]
    pol = builtin_policy("logging", twin)
    a = run_episode(twin, pol, scen, kdefs, seed=11, member=1, logged=ep)
    b = run_episode(twin, pol, scen, kdefs, seed=11, member=1, logged=ep, support=False)
    assert a.kpis == b.kpis and np.isnan(b.oos) and np.isnan(b.oos_t).all() and not np.isnan(a.oos)
    for c in [*KPIS, "state.rtt_edge_ms"]:
        np.testing.assert_array_equal(a.series[c], b.series[c])
    for c in a.timeline:
        np.testing.assert_array_equal(a.timeline[c], b.timeline[c])
    np.testing.assert_array_equal(a.actions, b.actions)


def test_shared_replays_run_each_replay_once_and_answer_as_before(world: dict[str, Any]) -> None:
    """The demo's canary pattern: the plan's full-switch predictions (both members), then the
    verdict's per member with the canary's assignment, then fewer columns, then another seed."""
    twin, log = world["twin"], world["log"]
    pols = _policies(world)
    full = {k: pols[k] for k in ("candidate", "baseline")}
    calls: list[tuple[dict, dict]] = [(full, {"seed": 2}), *[(pols, {"seed": 2, "members": [m]}) for m in (0, 1)],
                                      (full, {"seed": 2, "members": [1]}), (full, {"seed": 3})]  # fmt: skip
    with shared_replays(pols["candidate"], pols["baseline"]) as memo:
        got = [twin_group_series(twin, p, log, KPIS if i != 3 else KPIS[:1], **kw) for i, (p, kw) in enumerate(calls)]
    want = [reference_series(twin, p, log, KPIS if i != 3 else KPIS[:1], **kw) for i, (p, kw) in enumerate(calls)]
    for g, w in zip(got, want, strict=True):
        _same(g, w)
    # replays: 4 (plan) + 2 canary + 2 (members 0, 1 again: reused) ... counted exactly:
    # plan 2 pol x 2 members = 4 run; verdict m0, m1: candidate & baseline reused (4), canary run (2, not named);
    # members=[1] again: reused (2); seed 3: 4 run
    assert (memo.runs, memo.reused) == (8, 6)


def test_shared_replays_reuse_only_the_named_specs(world: dict[str, Any]) -> None:
    """A shared policy object not named is replayed every time, as outside the scope: one that
    samples from its own stream answers a second replay differently (`replay_spec`'s defect), and
    that is what a reuse must not hide."""
    from edgetwin.contract.policy import RandomPolicy

    twin, log = world["twin"], world["log"]
    shared = fixed_policy("noisy", RandomPolicy(world["spec"], seed=4))
    with shared_replays(builtin_policy("logging", twin)) as memo:
        a = twin_group_series(twin, {"noisy": shared}, log, KPIS[:1], seed=1)
        b = twin_group_series(twin, {"noisy": shared}, log, KPIS[:1], seed=1)
    assert memo.runs == memo.reused == 0
    assert not a[("noisy", KPIS[0])].equals(b[("noisy", KPIS[0])])


def test_predictions_are_the_reference_means(world: dict[str, Any]) -> None:
    pols = _policies(world)
    got = twin_group_predictions(world["twin"], pols, world["log"], KPIS, seed=4, window=(2, 9))
    ref = reference_series(world["twin"], pols, world["log"], KPIS, seed=4)
    for key, f in ref.items():
        pd.testing.assert_series_equal(got[key], f.iloc[:, 2:9].mean(axis=1), check_exact=True, check_names=False)
