"""Logging the emulated cluster: its logging policies (uniform random, or the SLO-aware heuristic
`SLOAwarePolicy`), `generate_logs` (a log in the contract and its spec, one episode a day), the
same log as OpenMetrics with the mapping that imports it back (`write_openmetrics_logs`: what a
Prometheus would hold of the cluster) and a plot of a log's daily shape (`plot_overview`).

Every row says who decided (``policy``) and, where the deciding policy samples, how likely its
action was (``propensity``). `Regime` lets one log hold what a real operator's logs hold: several
schedulers one after the other (v1 for four days, then v2 for two), and randomized trials (each
day, a random share of the service groups assigned at random to one of K arms, as a canary does).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from edgetwin.contract.errors import InputError
from edgetwin.contract.policy import NoisyPolicy, PlatformPolicy, RandomPolicy, RegimePolicy, act_logged
from edgetwin.contract.spec import POLICY_COLUMN, PROPENSITY_COLUMN, TwinSpec
from edgetwin.emulator.cluster import (
    ClusterConfig,
    EdgeCluster,
    check_actions,
)
from edgetwin.emulator.population import (
    SCENARIOS,
)
from edgetwin.policies.heuristics import HEURISTICS, SchedulingView, Target

__all__ = [
    "Regime",
    "SLOAwarePolicy",
    "cluster_view",
    "LoggedSystem",
    "check_regimes",
    "episode_seed",
    "generate_logs",
    "log_system",
    "make_policy",
    "parse_regime",
    "parse_trial",
    "plot_overview",
    "policy_names",
    "write_openmetrics_logs",
]


class SLOAwarePolicy:
    """Heuristic logging policy: SLO-aware, least-loaded placement.

    Tight-SLO groups (SLO below ~3 cloud RTTs) go to the edge; the others are split between edge and
    cloud in proportion to their free capacity. The reservation follows the last latency against
    the SLO, backed off when the site is overcommitted; price is lowered for price-sensitive groups.
    Works on any spec that has the cluster's column names.
    """

    def __init__(self, spec: TwinSpec) -> None:
        cols = spec.observation_columns
        need = ["profile.latency_slo_ms", "profile.price_sensitivity", "state.latency_ms", "state.site_util",
                "state.cloud_util", "state.rtt_cloud_ms", "state.site_reserved"]
        missing = [c for c in need if c not in cols]
        if missing:
            raise InputError(f"the heuristic policy needs observation columns {missing}", "spec")
        self._i = {c: cols.index(c) for c in need}
        self.spec = spec

    def act(self, obs: np.ndarray) -> np.ndarray:
        o = np.asarray(obs, dtype=np.float64)
        g = {c: o[:, j] for c, j in self._i.items()}
        slo = g["profile.latency_slo_ms"]
        tight = np.clip(2.0 - slo / (3.0 * np.maximum(g["state.rtt_cloud_ms"], 1.0)), 0.0, 1.0)
        free_e = 1.0 - g["state.site_util"]
        free_c = 1.0 - g["state.cloud_util"]
        least_loaded = free_e / np.maximum(free_e + free_c, 1e-6)
        edge_share = tight + (1.0 - tight) * least_loaded
        late = g["state.latency_ms"] / slo
        capacity = np.clip(0.6 + 0.6 * late, 0.3, 1.6) / np.maximum(1.0, g["state.site_reserved"])
        price = np.clip(0.6 - 0.12 * g["profile.price_sensitivity"], 0.05, 0.6)
        return np.stack([edge_share, capacity, price], axis=1)


def cluster_view(cloud_carbon: float = 250.0) -> SchedulingView:
    """The emulated cluster as the heuristics of `edgetwin.policies.heuristics` see it.

    Placement is ``action.edge_share`` (1 = the home edge site, loaded by ``state.site_util``; 0 = its
    cloud region, loaded by ``state.cloud_util``); a job's size is ``profile.mean_task_s`` and its
    demand ``state.site_reserved`` (for SJF / LJF / best fit); ``action.capacity`` is the allocation
    SJF / LJF share under a budget of 1 per group. The cloud's carbon intensity is not observed per
    agent; ``cloud_carbon`` (gCO2/kWh) stands in for it.
    """
    return SchedulingView(
        placement="action.edge_share",
        targets=(Target(1.0, "state.site_util", "state.carbon_g_per_kwh"), Target(0.0, "state.cloud_util", cloud_carbon)),
        size="profile.mean_task_s",
        demand="state.site_reserved",
        demand_scale=0.05,
        allocation="action.capacity",
        allocation_budget=1.0,
        defaults={"action.capacity": 1.0, "action.price": 0.5},
    )


#: the logging-policy names `make_policy` knows besides `HEURISTICS`'s
BUILTIN_POLICIES: tuple[str, ...] = ("random", "heuristic", "regime_switching")


def policy_names() -> list[str]:
    """Every name `make_policy` accepts: ``random``, ``heuristic`` (`SLOAwarePolicy`),
    ``regime_switching`` (`RegimePolicy`) and the heuristics registry's (`HEURISTICS`)."""
    return [*BUILTIN_POLICIES, *(n for n in HEURISTICS if n not in BUILTIN_POLICIES)]


def make_policy(policy: str | PlatformPolicy, spec: TwinSpec, seed: int = 0, where: str = "--policy") -> PlatformPolicy:
    """A logging policy by name (`policy_names`; ``-`` and ``_`` alike) or a policy as given.

    ``"random"`` is uniform in the action bounds, ``"heuristic"`` the SLO-aware `SLOAwarePolicy`,
    ``"regime_switching"`` a `RegimePolicy` (the action box redrawn every 8 ticks), and the names of
    `HEURISTICS` (``least_loaded``, ``round_robin``, ...) those heuristics on `cluster_view`.
    ``where`` names the flag in the error for an unknown name.
    """
    if isinstance(policy, str):
        name = policy.strip().replace("-", "_")
        if name == "random":
            return RandomPolicy(spec, seed=seed)
        if name == "heuristic":
            return SLOAwarePolicy(spec)
        if name == "regime_switching":
            return RegimePolicy(spec, seed=seed)
        if name in HEURISTICS:
            return HEURISTICS[name](spec, cluster_view())
        raise InputError(f"unknown policy {policy!r}; expected one of {', '.join(policy_names())}", where)
    if not isinstance(policy, PlatformPolicy):
        raise InputError(f"policy {type(policy).__name__} has no act(obs) method", "policy")
    return policy


@dataclass(frozen=True)
class Regime:
    """A stretch of ``days`` episodes logged under one policy, optionally with a randomized trial.

    Attributes:
        policy: ``"random"``, ``"heuristic"`` or any `PlatformPolicy` (a `LoggingPolicy` also says
            its propensities; any other is taken as deterministic).
        days: episodes (days) of this regime.
        noise: Gaussian exploration noise, a share of each action's bound width (`NoisyPolicy`):
            ``0.1`` is "heuristic + 10 % noise"; 0: none.
        name: the id written in the ``policy`` column (default: ``policy`` if a string, else the
            class name, with ``+noise0.1`` when noisy).
        arms: a randomized trial on each of these days: arm id -> policy. Each day, every service
            group independently joins the trial with probability ``arm_share`` and then one arm
            uniformly at random; the others stay on the regime's policy.
        arm_share: the share of service groups in the trial (e.g. 0.1).
    """

    policy: str | PlatformPolicy
    days: int
    noise: float = 0.0
    name: str | None = None
    arms: Mapping[str, str | PlatformPolicy] = field(default_factory=dict)
    arm_share: float = 0.1

    def policy_id(self) -> str:
        if self.name:
            return self.name
        base = self.policy if isinstance(self.policy, str) else type(self.policy).__name__
        return f"{base}+noise{self.noise:g}" if self.noise > 0 else base


def _number(text: str, what: str, flag: str, value: str, integer: bool = False) -> float:
    try:
        x = float(text.strip().rstrip("%")) / (100.0 if text.strip().endswith("%") else 1.0)
    except ValueError:
        raise InputError(f"{what} must be a number, got {text!r} in {value!r}", flag) from None
    if not np.isfinite(x) or (integer and x != int(x)):
        raise InputError(f"{what} must be a {'whole ' if integer else ''}number, got {text!r} in {value!r}", flag)
    return x


def parse_regime(value: str, flag: str = "--regime") -> Regime:
    """``POLICY:DAYS[:NOISE]`` -> a `Regime` (e.g. ``heuristic:4:0.1``: the SLO-aware heuristic with
    10 % exploration noise for 4 days). POLICY is one of `policy_names`; DAYS >= 1; NOISE >= 0, a
    share of each action's bound width (``10%`` is 0.1). Raises `InputError` naming ``flag``."""
    parts = value.split(":")
    if len(parts) not in (2, 3) or not parts[0].strip():
        raise InputError(f"expected POLICY:DAYS[:NOISE] (e.g. heuristic:4:0.1), got {value!r}", flag)
    name = parts[0].strip().replace("-", "_")
    if name not in policy_names():
        raise InputError(f"unknown policy {parts[0]!r} in {value!r}; expected one of {', '.join(policy_names())}", flag)
    days = _number(parts[1], "DAYS", flag, value, integer=True)
    if days < 1:
        raise InputError(f"DAYS must be >= 1, got {parts[1]!r} in {value!r}", flag)
    noise = _number(parts[2], "NOISE", flag, value) if len(parts) == 3 else 0.0
    if not 0.0 <= noise <= 1.0:
        raise InputError(f"NOISE must be in [0, 1] (a share of each action's range), got {parts[2]!r} in {value!r}", flag)
    return Regime(name, int(days), noise=noise)


def parse_trial(value: str, base: Regime, flag: str = "--trial") -> Regime:
    """``SHARE:DAYS:ARM[,ARM...]`` -> a `Regime` of ``base``'s policy (and noise) for DAYS days on
    which each service group joins a randomized trial with probability SHARE (``0.1`` or ``10%``)
    and then one of the ARMs (policy names, `policy_names`) uniformly at random; arm rows are
    logged as ``arm-<ARM>``. Raises `InputError` naming ``flag``."""
    parts = value.split(":")
    if len(parts) != 3:
        raise InputError(f"expected SHARE:DAYS:ARM[,ARM...] (e.g. 0.1:1:random,least_loaded), got {value!r}", flag)
    share = _number(parts[0], "SHARE", flag, value)
    if not 0.0 < share <= 1.0:
        raise InputError(f"SHARE must be in (0, 1], got {parts[0]!r} in {value!r}", flag)
    days = _number(parts[1], "DAYS", flag, value, integer=True)
    if days < 1:
        raise InputError(f"DAYS must be >= 1, got {parts[1]!r} in {value!r}", flag)
    arms = [a.strip().replace("-", "_") for a in parts[2].split(",")]
    if not all(arms):
        raise InputError(f"an empty ARM in {value!r}", flag)
    unknown = [a for a in arms if a not in policy_names()]
    if unknown:
        raise InputError(f"unknown arm {unknown[0]!r} in {value!r}; expected policies among {', '.join(policy_names())}", flag)
    if len(set(arms)) != len(arms):
        raise InputError(f"an arm is named twice in {value!r}", flag)
    return Regime(base.policy, int(days), noise=base.noise, name=base.policy_id(),
                  arms={f"arm-{a}": a for a in arms}, arm_share=share)


def episode_seed(seed: int, episode: int) -> int:
    """Independent, reproducible seed of one episode of a run."""
    return int(np.random.SeedSequence([int(seed), int(episode)]).generate_state(1, dtype=np.uint64)[0] >> 1)


class LoggedSystem(Protocol):
    """What `log_system` needs of a system to log it in the contract: ``n`` agents, ``steps`` ticks an
    episode, a ``spec``; ``reset(seed, episode) -> obs (n, O)`` starts an episode (a fresh
    population), ``keys() -> (agent, scenario, site)`` are its agents' ``(n,)`` ids after the reset,
    and ``step(actions (n, A)) -> (actions as applied (n, A), next obs (n, O), reward (n,),
    responses (n, R), kpis (n, K))``, all in ``spec`` order."""

    spec: TwinSpec
    n: int
    steps: int

    def reset(self, seed: int, episode: int) -> np.ndarray: ...

    def keys(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]: ...


class _LoggedCluster:
    """`EdgeCluster` as a `LoggedSystem` (episode ``e`` is day ``start_day + drift_days + e``)."""

    def __init__(self, config: ClusterConfig) -> None:
        self.config = config
        self.cluster = EdgeCluster(config)
        self.spec, self.n, self.steps = self.cluster.spec, self.cluster.n, self.cluster.steps
        self._scen = np.array(SCENARIOS, dtype=object)
        self._sites = np.array(self.cluster.site_names, dtype=object)

    def reset(self, seed: int, episode: int) -> np.ndarray:
        return self.cluster.reset(seed=seed, day=self.config.start_day + self.config.drift_days + episode)

    def keys(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        c = self.cluster
        return c.agent_ids, self._scen[c.scenario], self._sites[c.home]

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        act = check_actions(actions, self.n)
        obs, reward, _, info = self.cluster.step(act)
        return act, obs, reward, info["responses"], info["kpis"]


def check_regimes(
    regimes: Sequence[Regime] | None, episodes: int | None = None, policy: str | PlatformPolicy = "random"
) -> list[Regime]:
    """``regimes``, or one `Regime` of ``policy`` for ``episodes`` days; raises `InputError` on bad ones."""
    if regimes is None:
        if episodes is None or int(episodes) < 1:
            raise InputError(f"episodes must be >= 1, got {episodes}", "--episodes")
        regimes = [Regime(policy, int(episodes))]
    if not regimes:
        raise InputError("regimes must name at least one regime", "regimes")
    for reg in regimes:
        if int(reg.days) < 1:
            raise InputError(f"regime {reg.policy_id()!r}: days must be >= 1, got {reg.days}", "regimes")
        if not reg.noise >= 0:
            raise InputError(f"regime {reg.policy_id()!r}: noise must be >= 0, got {reg.noise}", "regimes")
        if reg.arms and not 0.0 < reg.arm_share <= 1.0:
            raise InputError(f"regime {reg.policy_id()!r}: arm_share must be in (0, 1], got {reg.arm_share}", "regimes")
    return list(regimes)


def generate_logs(
    config: ClusterConfig,
    episodes: int | None = None,
    policy: str | PlatformPolicy = "random",
    seed: int = 0,
    progress: bool = False,
    regimes: Sequence[Regime] | None = None,
) -> tuple[pd.DataFrame, TwinSpec]:
    """Run the cluster under logging policies and return its log (the contract) and spec.

    Args:
        config: the emulated system.
        episodes: episodes (days, by default) to log under ``policy``; each samples a fresh
            population. Ignored (may be None) when ``regimes`` is given.
        policy: ``"random"``, ``"heuristic"`` or any `PlatformPolicy` on ``[profile.*, state.*]``.
        seed: the same seed gives the same log.
        progress: show a tqdm bar over ticks.
        regimes: instead of one policy, these `Regime` one after the other (episodes numbered on
            across them), each with its optional randomized trial.

    Returns:
        ``(log, spec)``: one row per (episode, t, agent) with columns episode, t, agent, scenario,
        site, profile.*, state.*, action.*, response.*, kpi.*, reward, ``policy`` (the id of the
        policy that decided) and ``propensity`` (its action's probability / density, NaN where the
        policy is deterministic over continuous actions); and `cluster_spec(config)`.
    """
    regimes = check_regimes(regimes, episodes, policy)
    return log_system(_LoggedCluster(config), regimes, seed, make_policy, progress=progress)


def log_system(
    system: LoggedSystem,
    regimes: Sequence[Regime],
    seed: int,
    resolve: Callable[[str | PlatformPolicy, TwinSpec, int], PlatformPolicy],
    progress: bool = False,
) -> tuple[pd.DataFrame, TwinSpec]:
    """Log any `LoggedSystem` under ``regimes`` (see `generate_logs`): one row per (episode, t, agent).

    ``resolve(policy, spec, seed)`` turns a regime's or arm's policy (a name or a policy) into a
    `PlatformPolicy`, so that each system names its own logging policies. Episode ``e`` is reset
    with `episode_seed` ``(seed, e)``; a trial's arms are drawn from ``(seed, e, 2)``.
    """
    regimes = check_regimes(regimes)
    episodes = sum(int(r.days) for r in regimes)
    spec = system.spec
    # one policy object per regime and arm, seeded apart, kept across the regime's days
    plan: list[tuple[str, PlatformPolicy, list[tuple[str, PlatformPolicy]]]] = []
    for i, reg in enumerate(regimes):
        pol = resolve(reg.policy, spec, seed if i == 0 else seed + 7919 * i)
        if reg.noise > 0:
            pol = NoisyPolicy(pol, spec, reg.noise, seed=seed + 104729 + i)
        arms = [(str(k), resolve(v, spec, seed + 31 * (i + 1) + j)) for j, (k, v) in enumerate(reg.arms.items())]
        plan.extend([(reg.policy_id(), pol, arms)] * int(reg.days))
    n, steps = system.n, system.steps
    rows = episodes * steps * n
    o_dim, a_dim = len(spec.observation_columns), len(spec.action_columns)
    r_dim, k_dim = len(spec.names("response")), len(spec.names("kpi"))
    obs_buf = np.empty((rows, o_dim))
    act_buf = np.empty((rows, a_dim))
    resp_buf = np.empty((rows, r_dim))
    kpi_buf = np.empty((rows, k_dim))
    rew_buf = np.empty(rows)
    prop_buf = np.empty(rows)
    policy_col = np.empty(rows, dtype=object)
    episode_col = np.repeat(np.arange(episodes, dtype=np.int64), steps * n)
    t_col = np.tile(np.repeat(np.arange(steps, dtype=np.int64), n), episodes)
    agent_col = np.empty(rows, dtype=object)
    scen_col = np.empty(rows, dtype=object)
    site_col = np.empty(rows, dtype=object)
    bar = tqdm(total=episodes * steps, desc="emulating", unit="tick", disable=not progress)
    for e in range(episodes):
        policy_id, pol, arms = plan[e]
        obs = system.reset(episode_seed(seed, e), e)
        base = e * steps * n
        block = slice(base, base + steps * n)
        agents, scenarios, sites = system.keys()
        agent_col[block] = np.tile(agents, steps)
        scen_col[block] = np.tile(scenarios, steps)
        site_col[block] = np.tile(sites, steps)
        # the day's trial: which agents follow which arm (-1: the regime's policy)
        arm_of = np.full(n, -1)
        if arms:
            trial_rng = np.random.default_rng([seed, e, 2])
            joined = trial_rng.random(n) < regimes_share(regimes, e)
            arm_of[joined] = trial_rng.integers(len(arms), size=int(joined.sum()))
        ids = np.array([policy_id, *(k for k, _ in arms)], dtype=object)[arm_of + 1]
        for t in range(steps):
            act, prop = act_logged(pol, obs, spec)
            for j, (_, arm) in enumerate(arms):
                rows_j = np.flatnonzero(arm_of == j)
                if len(rows_j):
                    act[rows_j], prop[rows_j] = act_logged(arm, obs[rows_j], spec)
            r = slice(base + t * n, base + (t + 1) * n)
            obs_buf[r] = obs
            prop_buf[r] = prop
            policy_col[r] = ids
            act, obs, reward, responses, kpis = system.step(act)
            act_buf[r] = act
            resp_buf[r] = responses
            kpi_buf[r] = kpis
            rew_buf[r] = reward
            bar.update(1)
    bar.close()
    data: dict[str, Any] = {"episode": episode_col, "t": t_col, "agent": agent_col, "scenario": scen_col, "site": site_col}
    for j, c in enumerate(spec.observation_columns):
        data[c] = obs_buf[:, j]
    for block_cols, buf in ((spec.action_columns, act_buf), (spec.names("response"), resp_buf), (spec.names("kpi"), kpi_buf)):
        for j, c in enumerate(block_cols):
            data[c] = buf[:, j]
    data["reward"] = rew_buf
    data[POLICY_COLUMN] = policy_col
    if not np.isnan(prop_buf).all():  # a deterministic policy over continuous actions has no density
        data[PROPENSITY_COLUMN] = prop_buf
    return pd.DataFrame(data), spec


def regimes_share(regimes: Sequence[Regime], episode: int) -> float:
    """The trial share of the regime that holds ``episode`` (episodes are numbered across regimes)."""
    first = 0
    for r in regimes:
        if episode < first + int(r.days):
            return float(r.arm_share)
        first += int(r.days)
    raise IndexError(episode)


def write_openmetrics_logs(
    log: pd.DataFrame,
    spec: TwinSpec,
    path: str | Path,
    *,
    start: float = 1767225600.0,
    prefix: str = "edgetwin_",
) -> tuple[Path, Path]:
    """Write a cluster log as OpenMetrics (one gauge per column) and the import mapping beside it.

    Episode ``e`` becomes the UTC day ``start + e days`` (``start`` a midnight; default
    2026-01-01), tick ``t`` is ``t * spec.step_seconds`` into it, and every series is labelled
    ``agent``, ``site``, ``scenario`` and ``policy`` (who decided; the ``propensity`` column is a
    gauge of its own): what the cluster's exporters would have left in Prometheus.
    ``promtool tsdb create-blocks-from openmetrics PATH DIR`` backfills it; ``edgetwin logs import
    prometheus --mapping PATH.mapping.toml`` (from that server, or ``--from-file PATH``) gives
    the log back, its spec skeleton carrying the spec's kinds and bounds.

    Returns:
        ``(dump, mapping)``: the OpenMetrics file and ``<dump stem>.mapping.toml`` beside it.
    """
    import tomli_w

    from edgetwin.contract.prometheus.exposition import mapping_for, write_openmetrics

    if float(start) % 86400.0:
        raise InputError(f"start must be a UTC midnight (a multiple of 86400 s), got {start}", "start")
    path = Path(path)
    columns = [*(f.name for f in spec.features), *(c for c in ("reward", PROPENSITY_COLUMN) if c in log.columns)]
    write_openmetrics(log, path, start=float(start), step_seconds=spec.step_seconds, columns=columns, prefix=prefix)
    mapping = mapping_for(columns, spec, prefix=prefix, name=spec.name, step=spec.step_seconds,
                          policy=POLICY_COLUMN in log.columns)  # fmt: skip
    mapping_path = path.with_name(path.name.split(".")[0] + ".mapping.toml")
    mapping_path.write_text(tomli_w.dumps(mapping), encoding="utf-8")
    return path, mapping_path


def plot_overview(log: pd.DataFrame, path: str | Path, title: str = "emulated edge-cloud cluster") -> Path:
    """A 2x2 PNG of a cluster log by hour of day: offload ratio and SLO violations per scenario,
    utilisation and grid carbon intensity per edge site. Returns the path written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    hour = (log["state.day_fraction"] * 24).astype(int)
    panels = (
        ("response.offload_ratio", "scenario", "offload ratio"),
        ("kpi.slo_violation", "scenario", "share of tasks over SLO"),
        ("state.site_util", "site", "edge site CPU utilisation"),
        ("state.carbon_g_per_kwh", "site", "grid carbon (gCO2eq/kWh)"),
    )
    fig, axes = plt.subplots(2, 2, figsize=(11, 6.5), sharex=True)
    for ax, (col, by, label) in zip(axes.ravel(), panels, strict=True):
        table = log.groupby([log[by], hour])[col].mean().unstack(0)
        table.plot(ax=ax, marker=".", lw=1.2)
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    for ax in axes[1]:
        ax.set_xlabel("hour of day")
    per_episode = int(log.groupby("episode")["agent"].nunique().max())
    fig.suptitle(f"{title}: {log['episode'].nunique()} episodes x {per_episode} service groups, by hour")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
