"""`run_whatif`: every (policy, scenario) cell over replicate worlds and ensemble members, paired."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import REWARD_COLUMN
from edgetwin.twin.intervals import action_sketch
from edgetwin.twin.parallel import run_tasks
from edgetwin.twin.whatif.effects import replayed_effects
from edgetwin.twin.whatif.engine import EpisodeOutcome, run_episode
from edgetwin.twin.whatif.kpis import KpiDef, default_kpis
from edgetwin.twin.whatif.policies import PolicySpec
from edgetwin.twin.whatif.replay import (
    LoggedEpisode,
    logged_episode_kpis,
    logged_episodes,
    logged_support_share,
)
from edgetwin.twin.whatif.results import Cell, WhatIfResult
from edgetwin.twin.whatif.scenarios import NOMINAL, Scenario

__all__ = ["PolicyCells", "episode_seeds", "run_policy_cells", "run_whatif"]


def episode_seeds(seed: int, n: int) -> list[int]:
    """Independent, reproducible world seeds."""
    return [int(s.generate_state(1)[0]) for s in np.random.SeedSequence(int(seed)).spawn(n)]


def _cells_task(
    twin: Any,
    kpis: list[KpiDef],
    members: list[int],
    reps: list[tuple[int, LoggedEpisode | None]],
    opts: dict[str, Any],
    job: list[tuple[PolicySpec, Scenario]],
) -> list[list[EpisodeOutcome]]:
    """Each cell's episodes, member by member and replicate by replicate (the serial order)."""
    return [
        [
            run_episode(twin, pol, scen, kpis, seed=wseed, member=m, logged=ep, **opts)
            for m in members
            for wseed, ep in reps
        ]
        for pol, scen in job
    ]


def _check_counts(episodes: int, seeds: int, steps: int | None, oos_tolerance: float) -> None:
    """`run_whatif`'s counts and share, each a one-line `InputError` naming its flag."""
    if episodes < 1:
        raise InputError(f"expected >= 1, got {episodes}", "--episodes")
    if seeds < 1:
        raise InputError(f"expected >= 1, got {seeds}", "--seeds")
    if steps is not None and steps < 1:
        raise InputError(f"expected >= 1, got {steps}", "--steps")
    if not 0.0 <= oos_tolerance <= 1.0:
        raise InputError(f"expected a share in [0, 1], got {oos_tolerance}", "--oos-tolerance")


def _baseline_and_candidate(names: list[str], baseline: str | None) -> tuple[str | None, str | None]:
    """The policy the others are compared with (default: the first of two) and the first other one."""
    if not names:
        raise InputError("give at least one policy", "--policy")
    if len(set(names)) != len(names):
        raise InputError(f"policy names must be unique, got {names}", "--policy")
    if baseline is None and len(names) == 2:
        baseline = names[0]
    if baseline is not None and baseline not in names:
        raise InputError(f"baseline {baseline!r} is not among the policies {names}", "--baseline")
    return baseline, (next((n for n in names if n != baseline), None) if baseline is not None else None)


def _check_sites(scenario: Scenario, known_sites: list[str] | None, replay: bool) -> None:
    """Every site a perturbation names must be one the worlds have: the log's (replay), the twin's
    logged site units (generated), or ``site0, site1, ...`` for a twin saved without site names."""
    for p in scenario.perturbations:
        if p.sites is None:
            continue
        if known_sites is not None:
            unknown = sorted(set(p.sites) - set(known_sites))
            if unknown:
                where = "the log has" if replay else "the twin's logged sites are"
                raise InputError(f"key 'sites': unknown site(s) {unknown}; {where} {known_sites}", p.where)
        elif not all(x.startswith("site") and x[4:].isdigit() for x in p.sites):
            raise InputError(
                f"key 'sites': this twin was saved without site names, so its generated worlds name "
                f"their sites site0, site1, ...; got {list(p.sites)} (refit it, or replay a log with --log)",
                p.where,
            )


def _cell(
    policy: str,
    scenario: str,
    episodes_out: Sequence[Any],
    shape: tuple[int, int],
    kpis: Sequence[KpiDef],
    outputs: Sequence[str],
    run_steps: int,
    action_columns: Sequence[str] = (),
) -> Cell:
    """One (policy, scenario) cell from its episodes' `EpisodeOutcome` s, in (member, replicate)
    order: KPI values (members, replicates), timelines and out-of-support shares per tick
    (members, replicates, run_steps; NaN past a shorter episode's end)."""
    vals = {k.name: np.full(shape, np.nan) for k in kpis}
    tl = {c: np.full((*shape, run_steps), np.nan) for c in outputs}
    oos = np.zeros(shape)
    oos_t = np.full((*shape, run_steps), np.nan)
    taken = [res.actions.reshape(-1, res.actions.shape[-1]) for res in episodes_out if res.actions is not None]
    sketch = action_sketch(np.concatenate(taken), action_columns) if taken else {}
    for (mi, ri), res in zip(np.ndindex(*shape), episodes_out, strict=True):
        for name, value in res.kpis.items():
            vals[name][mi, ri] = value
        for c, series in res.timeline.items():
            tl[c][mi, ri, : len(series)] = series
        oos[mi, ri] = res.oos
        oos_t[mi, ri, : len(res.oos_t)] = res.oos_t
    return Cell(policy, scenario, vals, tl, oos, oos_t, sketch)


def _cells_and_effects(
    jobs: list[list[tuple[PolicySpec, Scenario]]],
    outcomes: list[Any],
    shape: tuple[int, int],
    reps: list[tuple[int, LoggedEpisode | None]],
    kpis: Sequence[KpiDef],
    outputs: Sequence[str],
    run_steps: int,
    action_columns: Sequence[str],
    replay: bool,
    seed: int = 0,
) -> tuple[dict[tuple[str, str], Cell], Any]:
    """Every job's cells (`_cell`) and, in replay, the effect-size scores of the log's own actions
    under the nominal scenario (`edgetwin.twin.whatif.effects.replayed_effects`, its agent bootstrap
    seeded by the what-if's ``seed``; None otherwise)."""
    cells: dict[tuple[str, str], Cell] = {}
    effects = None
    for job, job_out in zip(jobs, outcomes, strict=True):
        for (pol, scen), episodes_out in zip(job, job_out, strict=True):
            cells[(pol.name, scen.name)] = _cell(pol.name, scen.name, episodes_out, shape, kpis, outputs, run_steps,
                                                 action_columns)  # fmt: skip
            if effects is None and replay and pol.factory is None and scen.name == NOMINAL.name:
                effects = replayed_effects(episodes_out, reps, kpis, action_columns, seed=seed)
    return cells, effects


def _replicates(
    seed: int, seeds: int, episodes: int, recorded: list[LoggedEpisode] | None
) -> list[tuple[int, LoggedEpisode | None]]:
    """The replicate worlds, (world seed, recorded episode or None): ``episodes`` generated worlds
    per seed, or every recorded episode per seed in replay."""
    reps: list[tuple[int, LoggedEpisode | None]] = []
    for base_seed in episode_seeds(seed, seeds):
        if recorded is None:
            reps += [(w, None) for w in episode_seeds(base_seed, episodes)]
        else:
            reps += [(w, ep) for w, ep in zip(episode_seeds(base_seed, len(recorded)), recorded, strict=True)]
    return reps


def _settings(
    twin: Any,
    seed: int,
    seeds: int,
    episodes: int,
    reps: list[tuple[int, LoggedEpisode | None]],
    members: list[int],
    run_steps: int,
    n_agents: int | None,
    stochastic: bool,
    exogenous: Sequence[str],
    recorded: list[LoggedEpisode] | None,
    logged_oos: Any,
) -> dict[str, Any]:
    """`WhatIfResult.settings`: how the what-if ran, enough to rerun it and to read its numbers."""
    spec = twin.spec
    return {
        "mode": "replay" if recorded is not None else "generated",
        "seed": int(seed),
        "seeds": int(seeds),
        "episodes": int(episodes) if recorded is None else len(recorded),
        "replicates": len(reps),
        "members": members,
        "twin_members": int(twin.n_members),
        "steps": int(run_steps),
        "n_agents": None if recorded is not None else int(n_agents or 0),
        "stochastic": bool(stochastic),
        "exogenous": list(exogenous),
        "recorded_episodes": None if recorded is None else [ep.name for ep in recorded],
        "step_seconds": float(spec.step_seconds),
        "spec": spec.name,
        "spec_hash": spec.hash(),
        "twin_data_sha256": twin.meta.get("data_sha256"),
        # replay: the share of the recorded traffic's own agent-steps outside the training logs'
        # support, the reference for the shares of the simulated numbers
        "recorded_out_of_support": logged_oos,
    }


def _self_calibration(
    policies: Sequence[PolicySpec],
    scen_list: Sequence[Scenario],
    cells: dict[tuple[str, str], Cell],
    kpis: Sequence[KpiDef],
    logged_kpis: dict[str, Any],
    n_recorded: int,
    n_members: int,
) -> Any:
    """Replay's default calibration: the twin's replay of the log's own actions (built-in
    ``"logged"``) under the nominal scenario against the KPIs the log recorded; None when the
    logged policy or the nominal scenario is not run."""
    logged_names = [p.name for p in policies if p.factory is None]
    if not logged_names or not any(s.name == NOMINAL.name for s in scen_list):
        return None
    from edgetwin.twin.intervals import calibration_from_arrays

    cell = cells[(logged_names[0], NOMINAL.name)]
    return calibration_from_arrays(
        {k.name: cell.values[k.name] for k in kpis}, logged_kpis, source=(
            f"the replayed log's own actions ({n_recorded} episode(s) x {n_members} member(s))")
    )  # fmt: skip


@dataclass(frozen=True)
class _Plan:
    """What every cell of a what-if runs with (`_plan`), and ``key``: the same for the same arguments."""

    kpis: list[KpiDef]
    members: list[int]
    scenarios: list[Scenario]
    recorded: list[LoggedEpisode] | None
    reps: list[tuple[int, LoggedEpisode | None]]
    run_steps: int
    n_agents: int | None
    outputs: list[str]
    opts: dict[str, Any]
    key: tuple[Any, ...]


def _plan(
    twin: Any, scenarios: Iterable[Scenario], *, kpis: Sequence[KpiDef] | None, episodes: int, seeds: int, seed: int,
    members: Sequence[int] | None, steps: int | None, n_agents: int | None, stochastic: bool, log: pd.DataFrame | None,
    exogenous: Sequence[str], include_nominal: bool, oos_tolerance: float,
) -> _Plan:
    """`run_whatif`'s checks and its cells' arguments (KPIs, members, scenarios, replicate worlds).

    Raises:
        InputError: as `run_whatif`.
    """
    lay = twin.layout
    spec = twin.spec
    _check_counts(episodes, seeds, steps, oos_tolerance)
    members = list(range(twin.n_members)) if members is None else [int(m) for m in members]
    bad = [m for m in members if not 0 <= m < twin.n_members]
    if bad or not members:
        raise InputError(f"members must be in 0..{twin.n_members - 1}, got {members}", "--members")

    outputs = lay.outputs + ([] if lay.predict_reward else [REWARD_COLUMN])
    kpis = list(kpis) if kpis is not None else default_kpis(spec, outputs)
    columns = [*lay.profile, *lay.state, *lay.action, *outputs]
    for k in kpis:
        for c in k.columns:
            if c not in columns:
                raise InputError(
                    f"KPI {k.name!r} reads column {c!r}, which the twin does not simulate", "kpi"
                )
    for c in exogenous:
        if c not in lay.state:
            raise InputError(f"{c!r} is not a state column of the twin ({lay.state})", "--exogenous")
    if exogenous and log is None:
        raise InputError("exogenous columns follow a log: give one (--log)", "--exogenous")

    scen_list = list(scenarios)
    if include_nominal and not any(s.name == NOMINAL.name for s in scen_list):
        scen_list = [NOMINAL, *scen_list]
    if not scen_list:
        raise InputError("nothing to run: no scenario and include_nominal=False", "--scenario")
    if len({s.name for s in scen_list}) != len(scen_list):
        raise InputError(f"scenario names must be unique, got {[s.name for s in scen_list]}", "--scenario")

    recorded: list[LoggedEpisode] | None = None
    known_sites: list[str] | None
    if log is not None:
        recorded = logged_episodes(log, twin, max_episodes=episodes, steps=steps)
        lengths = [ep.steps for ep in recorded]
        known_sites = sorted({s for ep in recorded for s in ep.site_names})
        run_steps = max(lengths)
    else:
        if n_agents is None:
            n_ep = max(int(twin.meta.get("n_episodes", 1)), 1)
            n_agents = max(1, int(round(twin.composition.units.sum() / n_ep)))
        run_steps = lay.horizon if steps is None else int(steps)
        lengths = [run_steps]
        comp = twin.composition
        # generated worlds are built of logged site units and carry their names
        known_sites = sorted({str(x) for x in comp.unit_sites}) if len(comp.unit_sites) == len(comp.units) else None
    for s in scen_list:
        s.check(spec, columns, min(lengths), lay.scenarios)
        _check_sites(s, known_sites, replay=recorded is not None)

    # replicate worlds: (seed index, episode) in generated mode, (seed index, recorded episode) in replay
    reps = _replicates(seed, seeds, episodes, recorded)
    opts = {"steps": steps, "n_agents": n_agents, "stochastic": stochastic, "exogenous": tuple(exogenous)}
    # what a cell's episodes depend on besides its policy and scenario
    key = (twin.meta.get("data_sha256"), tuple(members), tuple((int(w), None if ep is None else ep.name) for w, ep in reps),
           tuple(k.name for k in kpis), tuple(sorted(opts.items())))  # fmt: skip
    return _Plan(kpis, members, scen_list, recorded, reps, run_steps, n_agents, outputs, opts, key)


@dataclass(frozen=True)
class PolicyCells:
    """One policy's what-if cells run ahead of the rest (`run_policy_cells`): by scenario name, its
    episodes' `EpisodeOutcome` s in (member, replicate) order; ``key``: what they were run with
    (the twin's data, members, replicate worlds, KPIs, options: a what-if that uses them must have
    the same)."""

    policy: str
    key: tuple[Any, ...]
    outcomes: dict[str, list[EpisodeOutcome]]

    def merged(self, other: PolicyCells) -> PolicyCells:
        """These cells and ``other``'s (the same policy and key; other scenarios)."""
        if other.policy != self.policy or other.key != self.key:
            raise ValueError("only cells of one policy run with the same arguments merge")
        return PolicyCells(self.policy, self.key, {**self.outcomes, **other.outcomes})


def run_policy_cells(
    twin: Any, policy: PolicySpec, scenarios: Iterable[Scenario] = (), *, kpis: Sequence[KpiDef] | None = None,
    episodes: int = 2, seeds: int = 1, seed: int = 0, members: Sequence[int] | None = None, steps: int | None = None,
    n_agents: int | None = None, stochastic: bool = True, log: pd.DataFrame | None = None,
    exogenous: Sequence[str] = (), include_nominal: bool = True,
) -> PolicyCells:
    """``policy``'s cells of the `run_whatif` call with these arguments, for its ``ahead``: a policy
    whose cells need nothing else (the logging policy) runs before the others exist.

    A cell's episodes depend on the twin, the policy and the plan only (seeded worlds, fresh policy
    objects per episode unless ``shared``), not on the other policies, so `run_whatif` with ``ahead``
    gives the numbers it gives without it."""
    plan = _plan(twin, scenarios, kpis=kpis, episodes=episodes, seeds=seeds, seed=seed, members=members, steps=steps,
                 n_agents=n_agents, stochastic=stochastic, log=log, exogenous=exogenous,
                 include_nominal=include_nominal, oos_tolerance=0.05)  # fmt: skip
    job = [(policy, scen) for scen in plan.scenarios]
    outcomes = _cells_task(twin, plan.kpis, plan.members, plan.reps, plan.opts, job)
    return PolicyCells(policy.name, plan.key, {scen.name: out for scen, out in zip(plan.scenarios, outcomes, strict=True)})


def run_whatif(
    twin: Any,
    policies: Sequence[PolicySpec],
    scenarios: Iterable[Scenario] = (),
    *,
    baseline: str | None = None,
    kpis: Sequence[KpiDef] | None = None,
    episodes: int = 2,
    seeds: int = 1,
    seed: int = 0,
    members: Sequence[int] | None = None,
    steps: int | None = None,
    n_agents: int | None = None,
    stochastic: bool = True,
    log: pd.DataFrame | None = None,
    exogenous: Sequence[str] = (),
    include_nominal: bool = True,
    oos_tolerance: float = 0.05,
    progress: bool = True,
    calibration: Any = None,
    workers: int | None = 1,
    ray_address: str | None = None,
    ahead: Sequence[PolicyCells] = (),
) -> WhatIfResult:
    """Run ``policies`` through ``twin`` under every scenario, over seeds, episodes and members.

    Args:
        twin: a `Twin`.
        policies: the policies (`builtin_policy`, `fixed_policy`, or
            `edgetwin.policies.gate.resolve_policy`); names must be unique.
        scenarios: the what-ifs; the unperturbed ``"nominal"`` scenario is added first.
        baseline: name of the policy the others are compared with (default: the first of two).
        kpis: the KPIs (default: `default_kpis`).
        episodes: generated mode: episodes per seed; replay mode: the number of recorded
            episodes replayed (the last ones of the log).
        seeds: independent seeds (``seed``, and ``seeds - 1`` derived ones) of the worlds and noise.
        seed: the base seed; the same seed gives the same result.
        members: ensemble members that answer (default: all); every replicate runs with each.
        steps: ticks per episode (default: the twin's horizon, or the recorded episode's length).
        n_agents: agents per generated world (default: as many as a logged episode had on average).
        stochastic: sample the twin's responses (else their means).
        log: replay its episodes (counterfactual replay) instead of generating worlds.
        exogenous: replay mode: state columns taken from the log at every tick.
        include_nominal: run the unperturbed scenario too.
        oos_tolerance: flag a number when more than this share of its agent-steps is out of support.
        progress: tqdm bar.
        calibration: an `edgetwin.twin.intervals.Calibration` that widens every 90 % interval.
            Default: in replay mode, when the log's own actions are among the policies (built-in
            ``"logged"``), calibrated on them (the recorded episodes are held out from the twin's
            fit unless the log is its training log); else plain bootstrap intervals.
        workers, ray_address: run the cells on a local process pool or a Ray cluster
            (`edgetwin.twin.parallel.run_tasks`; default: serially); the result does not depend on it.
        ahead: cells of some of ``policies`` run before (`run_policy_cells`, with this call's
            arguments: checked), used instead of running them again (those of its scenarios it
            has); the same result. The demo runs the logging policy's cells on its spare core while
            the candidate is trained.

    Raises:
        InputError: bad scenarios (naming file, entry and key), unknown KPI columns, bad options.
    """
    names = [p.name for p in policies]
    baseline, candidate = _baseline_and_candidate(names, baseline)
    plan = _plan(twin, scenarios, kpis=kpis, episodes=episodes, seeds=seeds, seed=seed, members=members, steps=steps,
                 n_agents=n_agents, stochastic=stochastic, log=log, exogenous=exogenous,
                 include_nominal=include_nominal, oos_tolerance=oos_tolerance)  # fmt: skip
    lay, spec, kpis, members, scen_list, recorded, reps = (
        twin.layout, twin.spec, plan.kpis, plan.members, plan.scenarios, plan.recorded, plan.reps)  # fmt: skip
    done = {a.policy: a.outcomes for a in ahead}
    for a in ahead:
        if a.policy not in names or a.key != plan.key:
            raise InputError(f"the cells run ahead for {a.policy!r} are not this what-if's (its policies, seed, "
                             "episodes, members, KPIs and options must be the same)", "ahead")  # fmt: skip
    total = len(policies) * len(scen_list) * len(members) * len(reps)
    bar = tqdm(total=total, desc="what-if episodes", disable=not progress)
    # the (policy, scenario) cells as tasks (serially, on a process pool or on Ray: same numbers).
    # A policy used as one object in every episode (`fixed_policy`) may carry state from one
    # episode into the next, so all its cells are one task, run in the serial order.
    jobs: list[list[tuple[PolicySpec, Scenario]]] = []
    for pol in policies:
        cells_of = [(pol, scen) for scen in scen_list]
        jobs += [cells_of] if pol.shared else [[c] for c in cells_of]
    # a job whose every cell ran ahead is not run again (a shared policy's cells only all together)
    todo = [i for i, job in enumerate(jobs) if not all(sc.name in done.get(p.name, {}) for p, sc in job)]
    outcomes: list[Any] = [[done[p.name][sc.name] for p, sc in job] if i not in todo else None
                           for i, job in enumerate(jobs)]  # fmt: skip
    bar.update(sum(len(jobs[i]) for i in range(len(jobs)) if i not in todo) * len(members) * len(reps))
    ran = run_tasks(
        _cells_task, [(jobs[i],) for i in todo], workers=workers, ray_address=ray_address,
        shared=(twin, list(kpis), members, reps, plan.opts), on_result=lambda i, r: bar.update(sum(map(len, r))),
    )  # fmt: skip
    for i, r in zip(todo, ran, strict=True):
        outcomes[i] = r
    cells, effects = _cells_and_effects(jobs, outcomes, (len(members), len(reps)), reps, kpis, plan.outputs,
                                        plan.run_steps, lay.action, recorded is not None, seed)  # fmt: skip
    bar.close()
    logged_kpis = logged_episode_kpis(recorded, kpis, spec) if recorded is not None else {}
    logged_oos = None if recorded is None else logged_support_share(twin, recorded, seed=seed)
    order = names if baseline is None else [baseline, *[n for n in names if n != baseline]]
    settings = _settings(twin, seed, seeds, episodes, reps, members, plan.run_steps, plan.n_agents, stochastic,
                         exogenous, recorded, logged_oos)  # fmt: skip
    if calibration is None and recorded is not None:
        calibration = _self_calibration(policies, scen_list, cells, kpis, logged_kpis, len(recorded), len(members))
        if calibration is not None and effects is not None:
            effects.apply(calibration)
    return WhatIfResult(
        cells=cells,
        policies=order,
        baseline=baseline,
        candidate=candidate,
        scenarios=scen_list,
        kpis=list(kpis),
        settings=settings,
        logged_kpis=logged_kpis,
        oos_tolerance=oos_tolerance,
        calibration=calibration,
        replayed_effects=effects,
    )
