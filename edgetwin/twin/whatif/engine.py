"""One what-if episode: a policy run through a twin's `Simulation` with a scenario's perturbations
applied to each tick (`run_episode`), generated or replaying a recorded episode.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import REWARD_COLUMN, TwinSpec
from edgetwin.imitation.world import World
from edgetwin.twin.simulation import Simulation, step_columns
from edgetwin.twin.whatif.kpis import KpiDef
from edgetwin.twin.whatif.perturbations import EPISODE_KINDS, Perturbation
from edgetwin.twin.whatif.policies import PolicySpec
from edgetwin.twin.whatif.replay import LoggedEpisode
from edgetwin.twin.whatif.scenarios import Scenario

__all__ = ["DAY_HOURS", "OUTPUT_ROLES", "EpisodeOutcome", "run_episode"]

#: Roles whose columns a tick-level perturbation may act on (``reward`` counts as an output).
OUTPUT_ROLES = ("response", "kpi")


DAY_HOURS = 24.0


@dataclass
class EpisodeOutcome:
    """What one simulated episode gave: KPI values, per-step means, support shares."""

    kpis: dict[str, float]
    timeline: dict[str, np.ndarray]
    oos: float
    oos_t: np.ndarray
    #: KPI column -> ``(T, N)`` per-agent values of the episode (for per-group predictions, e.g.
    #: prediction-powered inference, `edgetwin.loop.ppi`); ``source``: ``(N,)`` row of the
    #: replayed logged episode each agent copies (None for a generated world)
    series: dict[str, np.ndarray] = field(default_factory=dict)
    source: np.ndarray | None = None
    #: ``(T, N, A)`` the legal actions the policy took (float32): how far it moves the actions from
    #: the logged ones (`edgetwin.twin.intervals.action_sketch`, the change interval's effect term)
    actions: np.ndarray | None = None


class _Masks:
    """Which agents each perturbation touches (site/scenario filters) in one world."""

    def __init__(
        self, scenario: np.ndarray, site: np.ndarray, site_names: Sequence[str], labels: Sequence[str]
    ) -> None:
        self.scenario, self.site = scenario, site
        self.site_names = list(site_names)
        self.labels = list(labels)

    def rows(self, p: Perturbation) -> np.ndarray:
        m = np.ones(len(self.scenario), dtype=bool)
        if p.sites is not None:
            # a generated world names its sites after the logged ones (``edge-ams``, ``edge-ams#2``)
            codes = [i for i, s in enumerate(self.site_names) if s.split("#")[0] in p.sites or s in p.sites]
            m &= np.isin(self.site, codes)
        if p.scenarios is not None:
            m &= np.isin(self.scenario, [self.labels.index(s) for s in p.scenarios])
        return m


class _Applier:
    """Applies the tick-level perturbations of one role to a ``(N, D)`` block of raw columns."""

    def __init__(
        self,
        perts: list[Perturbation],
        columns: Sequence[str],
        masks: _Masks,
        spec: TwinSpec,
        rng: np.random.Generator,
    ) -> None:
        self.items = [
            (p, list(columns).index(p.column)) for p in perts if p.column is not None and p.column in columns
        ]
        self.masks = masks
        self.spec = spec
        self.rng = rng
        # a shift_time's column is a clock: shifted by a share of its span, wrapping around
        self.clock = {
            id(p): _time_shift(p, spec, spec.step_seconds)[1:]
            for p, _ in self.items
            if p.kind == "shift_time"
        }

    def __bool__(self) -> bool:
        return bool(self.items)

    def apply(
        self, x: np.ndarray, t: int
    ) -> tuple[np.ndarray, list[tuple[Perturbation, int, np.ndarray, Any]]]:
        """Perturbed copy of ``x`` and what was done (for `undo`)."""
        x = x.copy()
        done = []
        for p, j in self.items:
            if not p.active(t):
                continue
            rows = self.masks.rows(p)
            if not rows.any():
                continue
            v = x[rows, j]
            aux: Any = None
            if p.kind in ("scale", "burst"):
                v = v * p.factor
            elif p.kind == "add":
                v = v + p.value
            elif p.kind in ("set", "failure"):
                v = np.full_like(v, 0.0 if p.value is None else p.value)
            elif p.kind == "clip":
                v = np.clip(v, -np.inf if p.low is None else p.low, np.inf if p.high is None else p.high)
            elif p.kind == "jitter":
                z = self.rng.standard_normal(len(v))
                if p.std is not None:
                    aux = z * p.std
                    v = v + aux
                else:
                    assert p.cv is not None  # _check_kind: a jitter has exactly one of std and cv
                    aux = 1.0 + p.cv * z
                    v = v * aux
            elif p.kind == "shift_time":
                delta, low, span = self.clock[id(p)]
                aux = (delta, low, span)
                v = low + np.mod(v - low + delta, span)
            x[rows, j] = v
            done.append((p, j, rows, aux))
        return x, done

    @staticmethod
    def undo(x: np.ndarray, done: list[tuple[Perturbation, int, np.ndarray, Any]]) -> np.ndarray:
        """Map a next state back to the unperturbed trajectory where the change is invertible."""
        x = x.copy()
        for p, j, rows, aux in reversed(done):
            if p.kind in ("scale", "burst") and p.factor and p.factor > 0:
                x[rows, j] = x[rows, j] / p.factor
            elif p.kind == "add":
                x[rows, j] = x[rows, j] - p.value
            elif p.kind == "shift_time":
                delta, low, span = aux
                x[rows, j] = low + np.mod(x[rows, j] - low - delta, span)
            elif p.kind == "jitter":
                if p.std is not None:
                    x[rows, j] = x[rows, j] - aux
                else:
                    safe = np.abs(aux) > 1e-6
                    sub = x[rows, j]
                    sub[safe] = sub[safe] / aux[safe]
                    x[rows, j] = sub
        return x


def _time_shift(p: Perturbation, spec: TwinSpec, step_seconds: float) -> tuple[int, float, float, float]:
    """``(ticks, column delta, low, span)`` of a shift_time."""
    hours = p.hours
    assert hours is not None  # _check_kind: a shift_time needs hours
    ticks = int(round(hours * 3600.0 / step_seconds)) if step_seconds > 0 else 0
    if p.column is None:
        return ticks, 0.0, 0.0, 1.0
    f = spec.feature(p.column)
    low = 0.0 if f.low is None else float(f.low)
    if p.period is not None:
        span = float(p.period)
    else:
        # Perturbation.check: without a period, the column has finite bounds
        assert f.low is not None and f.high is not None
        span = float(f.high) - float(f.low)
    return ticks, hours / DAY_HOURS * span, low, span


def _place_world(
    twin: Any,
    sim: Simulation,
    scenario: Scenario,
    rng: np.random.Generator,
    steps: int | None,
    logged: LoggedEpisode | None,
) -> tuple[int, np.ndarray, np.ndarray, list[str], np.ndarray]:
    """`run_episode`'s world: the logged episode's (replay) or the simulation's generated one,
    with the scenario's episode-level perturbations (population shifts, the clock) applied, placed
    in ``sim``. Draws from ``rng`` only for a reweighting population shift.

    Returns:
        (ticks to run, scenario index per agent (n,), site index per agent (n,), site names,
        the row of ``logged`` each agent copies (n,)).
    """
    lay = twin.layout
    spec = twin.spec
    site_names: list[str]
    source = np.arange(sim.n)  # row of ``logged`` each agent copies (population shifts duplicate rows)
    if logged is not None:
        steps = logged.steps if steps is None else min(int(steps), logged.steps)
        scen, site, profile, state = (
            logged.scenario,
            logged.site,
            logged.profile.copy(),
            logged.state[0].copy(),
        )
        site_names = list(logged.site_names)
        source = np.arange(len(scen))
    else:
        steps = lay.horizon if steps is None else int(steps)
        w = sim.world
        scen, site, profile, state = w.scenario, w.site, w.profile.copy(), w.state.copy()
        site_names = list(sim.site_names)

    # --- episode-level perturbations: population shifts and the clock ---------------------------
    shift_ticks = 0
    for p in scenario.episode_level():
        if p.kind == "population_shift":
            if p.scenario_weights is not None:
                scen, site, profile, state, source = _reweight(
                    twin, p, scen, site, profile, state, source, logged, rng
                )
            if p.factor is not None and p.column is not None:
                masks = _Masks(scen, site, site_names, lay.scenarios)
                rows = masks.rows(p)
                j = lay.profile.index(p.column)
                profile[rows, j] *= p.factor
        elif p.kind == "shift_time":  # the twin's clock here; its column, if any, at every tick
            shift_ticks += _time_shift(p, spec, spec.step_seconds)[0]
    profile = lay.scalers["profile"].legalise(profile)
    state = lay.scalers["state"].legalise(state)
    n_sites = int(site.max()) + 1 if len(site) else 0
    sim.place(
        World(
            lay,
            scen,
            site,
            profile,
            state,
            np.zeros((n_sites, lay.n_lag)),
            t=(logged.t0 if logged else 0) + shift_ticks,
        )
    )
    return steps, scen, site, site_names, source


def _appliers(scenario: Scenario, lay: Any, masks: _Masks, spec: Any, rng: np.random.Generator) -> dict[str, _Applier]:
    """`run_episode`'s tick-level perturbations, one `_Applier` per thing they act on: the
    profile and state the policy sees, its actions, the twin's outputs and (when the twin does not
    predict it) the reward."""
    return {
        "profile": _Applier(scenario.tick_level("profile"), lay.profile, masks, spec, rng),
        "state": _Applier(scenario.tick_level("state"), lay.state, masks, spec, rng),
        "action": _Applier(scenario.tick_level("action"), lay.action, masks, spec, rng),
        # the reward is an output when the twin predicts it; else it follows the (perturbed) outputs
        "output": _Applier(
            [
                p
                for p in scenario.perturbations
                if p.kind not in EPISODE_KINDS and p.role in (*OUTPUT_ROLES, "output")
            ],
            lay.outputs,
            masks,
            spec,
            rng,
        ),
        "reward": _Applier(
            [p for p in scenario.perturbations if p.role == "output" and not lay.predict_reward],
            [REWARD_COLUMN],
            masks,
            spec,
            rng,
        ),
    }


def _tick_columns(
    lay: Any, profile: np.ndarray, state: np.ndarray, action: np.ndarray, outputs: np.ndarray, reward: Any
) -> dict[str, np.ndarray]:
    """One tick's columns by name, each (n_agents,): profile and state as the policy saw them, the
    legal actions, the (perturbed) outputs, and the reward unless the twin predicts it as an output."""
    cols = step_columns(lay, profile, state, action, outputs)
    cols.setdefault(REWARD_COLUMN, np.asarray(reward, dtype=np.float64))
    return cols


def run_episode(
    twin: Any,
    policy: PolicySpec,
    scenario: Scenario,
    kpis: Sequence[KpiDef],
    *,
    seed: int,
    member: int,
    steps: int | None = None,
    n_agents: int | None = None,
    stochastic: bool = True,
    logged: LoggedEpisode | None = None,
    exogenous: Sequence[str] = (),
    support_rows: int = 16,
    support: bool = True,
) -> EpisodeOutcome:
    """Simulate one episode of ``policy`` under ``scenario`` and score it.

    Args:
        twin: the twin.
        policy: the policy (``"logged"`` needs ``logged``).
        scenario: the perturbations.
        kpis: what to compute.
        seed: world seed: population, initial states, response noise and jitter (shared by every
            policy and scenario given the same seed, so comparisons are paired).
        member: the ensemble member that answers.
        steps: ticks (default: the logged episode's length, else the twin's horizon).
        n_agents: agents of a generated world (default: one logged site unit's worth).
        stochastic: sample responses (else use their mean).
        logged: replay this recorded episode (its agents, sites, profiles, first states).
        exogenous: state columns that follow ``logged`` at every tick.
        support_rows: agent-steps per tick whose distance to the logs' support is measured.
        support: measure it (False: ``oos`` and ``oos_t`` are NaN; every other number is the same,
            as the rows are still drawn from the same stream). For callers that read only the
            per-agent ``series`` (`edgetwin.loop.twin_series`): the nearest-neighbour search over
            the logs' rows was a third of such a replay's time (py-spy, the demo's canary).
    """
    lay = twin.layout
    spec = twin.spec
    sim = Simulation(twin, n_agents=n_agents, seed=seed, stochastic=stochastic, member=member)
    rng = np.random.default_rng([seed, 7])  # perturbation noise and support sampling, apart from the twin's
    if policy.factory is None and logged is None:
        raise InputError("the policy 'logged' replays a log's actions: give a log (--log)", "--policy")
    steps, scen, site, site_names, source = _place_world(twin, sim, scenario, rng, steps, logged)
    n = len(scen)

    appliers = _appliers(scenario, lay, _Masks(scen, site, site_names, lay.scenarios), spec, rng)
    exo = [lay.state.index(c) for c in exogenous] if logged is not None else []
    pol = None if policy.factory is None else policy.factory(int(seed), int(member), scen)

    need = sorted({c for k in kpis for c in k.columns})
    series: dict[str, list[np.ndarray]] = {c: [] for c in need}
    timeline: dict[str, list[float]] = {
        c: [] for c in [*lay.outputs, *([] if lay.predict_reward else [REWARD_COLUMN])]
    }
    z_rows: list[np.ndarray] = []
    z_t: list[np.ndarray] = []
    taken: list[np.ndarray] = []
    base_profile = sim.world.profile.copy()
    last_logged_action = None
    for t in range(steps):
        w = sim.world
        # what the policy and the twin see this tick
        view_profile = base_profile
        if appliers["profile"]:
            view_profile, _ = appliers["profile"].apply(base_profile, t)
            view_profile = lay.scalers["profile"].legalise(view_profile)
        w.profile = view_profile
        done: list[Any] = []
        if appliers["state"]:
            view_state, done = appliers["state"].apply(w.state, t)
            w.state = lay.scalers["state"].legalise(view_state)
        obs = sim.obs()
        if pol is None:
            assert logged is not None
            act = logged.action[t][source]
            if last_logged_action is not None:  # an agent absent at t keeps its last logged action
                act = np.where(np.isnan(act), last_logged_action, act)
            act = np.nan_to_num(act, nan=0.0)
            last_logged_action = act
        else:
            act = np.asarray(pol.act(obs), dtype=np.float64).reshape(n, len(lay.action))
        if appliers["action"]:
            act, _ = appliers["action"].apply(sim.legal_action(act), t)
        rows = np.arange(n)
        outputs, reward, _ = sim.respond(rows, act, with_disagreement=False)
        legal = sim.pending_action
        taken.append(np.asarray(legal, dtype=np.float32))
        state_now = w.state.copy()
        if appliers["output"]:
            outputs, done = appliers["output"].apply(outputs, t)
            if done:  # only when a perturbation acts: the override's rescaling rounds the outputs
                outputs = lay.scalers["outputs"].legalise(outputs)
                # the next tick's site means (the client's lagged inputs) and the declared site
                # accounting see the perturbed outputs
                sim.override_outputs(rows, outputs)
                reward = sim.reward_of(rows, state_now, legal, outputs)
        if appliers["reward"]:
            reward = appliers["reward"].apply(np.asarray(reward, np.float64)[:, None], t)[0][:, 0]
        cols = _tick_columns(lay, view_profile, state_now, legal, outputs, reward)
        for c in need:
            if c not in cols:
                raise InputError(
                    f"KPI column {c!r} is not simulated by the twin; it has {sorted(cols)}", "kpi"
                )
            series[c].append(np.asarray(cols[c], dtype=np.float64))
        for c in timeline:
            timeline[c].append(float(np.mean(cols[c])))
        pick = rng.choice(n, size=min(support_rows, n), replace=False)  # drawn also without ``support``:
        if support:  # the stream's later draws (perturbation noise) stay the same
            z_rows.append(_support_rows(lay, view_profile[pick], state_now[pick], legal[pick]))
            z_t.append(np.full(len(pick), t))
        nxt = sim.end_tick()
        if done:
            nxt = _Applier.undo(nxt, done)
        if exo and logged is not None and t + 1 < logged.steps:
            forced = logged.state[t + 1][source][:, exo]
            keep = np.isnan(forced)
            nxt[:, exo] = np.where(keep, nxt[:, exo], forced)
        sim.world.state = lay.scalers["state"].legalise(nxt)
        sim.world.profile = base_profile
    values = {
        k.name: k.compute(
            np.stack(series[k.column]), None if k.weight is None else np.stack(series[k.weight])
        )
        for k in kpis
    }
    oos, oos_t = _support_shares(twin, z_rows, z_t, steps) if support else (float("nan"), np.full(steps, np.nan))
    return EpisodeOutcome(
        kpis=values,
        timeline={c: np.asarray(v) for c, v in timeline.items()},
        oos=oos,
        oos_t=oos_t,
        series={c: np.stack(v) for c, v in series.items()},
        source=None if logged is None else np.asarray(source),
        actions=np.stack(taken) if taken else None,
    )


def _support_rows(lay: Any, profile: np.ndarray, state: np.ndarray, legal: np.ndarray) -> np.ndarray:
    """``(n, D)`` rows ``[profile, state, action]`` as the support index measures them (standardised;
    the declared state columns as the models see them) for ``(n, ·)`` raw profile, state and legal actions."""
    return np.concatenate(
        [
            lay.scalers["profile"].transform(profile),
            lay.model_state(lay.scalers["state"].transform(state)),
            lay.scalers["action"].transform(legal),
        ],
        axis=1,
    )


def _support_shares(twin: Any, z_rows: list[np.ndarray], z_t: list[np.ndarray], steps: int) -> tuple[float, np.ndarray]:
    """The share of the sampled agent-steps outside the twin's logs' support, over the episode and
    ``(steps,)`` per tick (`edgetwin.twin.support.SupportIndex.outside`)."""
    z = np.concatenate(z_rows)
    out = twin.support.outside(z)
    tt = np.concatenate(z_t)
    oos_t = np.bincount(tt, weights=out.astype(float), minlength=steps) / np.maximum(
        np.bincount(tt, minlength=steps), 1
    )
    return (float(out.mean()) if len(out) else 0.0), oos_t


def _reweight(
    twin: Any,
    p: Perturbation,
    scen: np.ndarray,
    site: np.ndarray,
    profile: np.ndarray,
    state: np.ndarray,
    source: np.ndarray,
    logged: LoggedEpisode | None,
    rng: np.random.Generator,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Redraw each site's agents so that the scenario mix follows ``p.scenario_weights``.

    Sites keep their sizes. A generated world draws new agents from the population model (initial
    states from the logged first ticks); a replay copies logged agents of the scenario (any site).
    """
    lay = twin.layout
    labels = lay.scenarios
    mix = np.array([p.scenario_weights.get(s, 0.0) for s in labels], dtype=np.float64)  # type: ignore[union-attr]
    mix /= mix.sum()
    new_scen = np.empty_like(scen)
    for k in np.unique(site):
        rows = np.flatnonzero(site == k)
        new_scen[rows] = rng.choice(len(labels), size=len(rows), p=mix)
    new_profile = np.zeros_like(profile)
    new_state = np.zeros_like(state)
    new_source = np.zeros_like(source)
    for s in np.unique(new_scen):
        rows = np.flatnonzero(new_scen == s)
        same = np.flatnonzero(scen == s)
        if logged is None:
            pop = twin.population.sample(len(rows), scenario=labels[s], seed=int(rng.integers(2**31)))
            new_profile[rows] = lay.scalers["profile"].legalise(pop[lay.profile].to_numpy(np.float64))
            new_state[rows] = twin.initial.sample(lay, np.full(len(rows), s), new_profile[rows], rng)
            new_source[rows] = rows
        else:
            if len(same) == 0:
                raise InputError(
                    f"scenario_weights asks for {labels[s]!r} agents but episode {logged.name!r} has none to replay",
                    p.where,
                )
            pick = same[rng.integers(len(same), size=len(rows))]
            new_profile[rows], new_state[rows], new_source[rows] = profile[pick], state[pick], source[pick]
    return new_scen, site, new_profile, new_state, new_source
