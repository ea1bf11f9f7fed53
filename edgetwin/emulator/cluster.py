"""The emulated edge-cloud cluster: "the real system" that edgetwin learns twins of.

Like the Kubernetes testbeds of seeds 003/004, but in NumPy and vectorised over service groups
(agents). Each tick (default 15 simulated minutes; 96 ticks = one day):

1. every service group ``i`` sees ``obs_i = [profile.*, state.*]`` (its profile, its own recent
   experience and its home site's state at the start of the tick);
2. the platform acts per group: ``action_i = [edge_share, capacity, price]`` — the share of its
   offloaded tasks placed on its home edge site (rest: the paired cloud region), the edge vCPU
   reserved for it (relative to its nominal load at this hour), and the price (fraction of list);
3. the group responds (hidden behaviour, below): the share of its tasks it offloads and the demand it
   submits; its tasks then see latency from RTT (with jitter), service time and queueing;
4. at the end of the tick the sites' utilisation, backlog, reservations, memory pressure and cooling
   are updated from all groups' loads.

The coupling is causal: group ``i``'s outcome at tick ``t`` depends only on its own action, its own
history and its site's state at the start of ``t``. So a per-agent view (`EdgeClusterEnv`) is exact:
acting for one group at a time gives the same result as acting for all at once.

The hidden response (what a twin must learn; never written to the spec) is, per group::

    ema_latency <- (1-α)·ema_latency + α·latency_offloaded,  α = 1 - exp(-1/convergence_steps)
    pain        =  sigmoid((ema_latency/slo - 1) / 0.15)            # threshold at the SLO
    logit(offload) = logit(base_offload) + b_s + e_s·(edge_share-½)·(1+0.3(priority-1))
                     - p_s·price_sensitivity·price + c·log((capacity_honoured+0.05)/1.05)
                     - l_s·(0.5+0.25(priority-1))·pain + u_i + η_t,  η AR(1)
    demand = demand_rate·diurnal_s(hour)·exp(-d_s·price_sensitivity·price)·(1-0.4·pain)·noise AR(1)

with scenario-specific coefficients that drift with simulated time (`Behaviour`), a persistent
per-group effect ``u_i`` and autocorrelated noise: logs are not i.i.d. Energy follows seed 001's
node power model with SPECpower curves and seed 002's air/liquid cooling; carbon uses hourly grid
intensity of each site's zone.

Logging it (`generate_logs`) is `edgetwin.emulator.logs`; its Gymnasium and SB3 environments are
`edgetwin.emulator.envs`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import Feature, TwinSpec
from edgetwin.emulator.energy import CarbonSeries, carbon_series_for, joules_to_grams_co2
from edgetwin.emulator.population import (
    PROFILE_FEATURES,
    PROFILE_NAMES,
    SCENARIOS,
    Drift,
    drift_days,
    sample_profiles,
)
from edgetwin.emulator.sites import Site, check_topology, default_sites

if TYPE_CHECKING:
    from edgetwin.emulator.traces import TraceSample


# ------------------------------------------------------------------------------------ columns
#: (short name, kind, low, high, unit) of each role, in spec order.
STATE_FEATURES: tuple[tuple[str, str, float, float, str], ...] = (
    ("day_fraction", "continuous", 0.0, 1.0, "time of day / 24 h"),
    ("latency_ms", "heavy_tailed", 0.0, 1.0e7, "ms: mean latency of its offloaded tasks last tick"),
    ("prev_offload", "continuous", 0.0, 1.0, "its offload ratio last tick"),
    ("prev_demand", "heavy_tailed", 0.0, 2.0e4, "tasks/s it submitted last tick"),
    ("site_util", "continuous", 0.0, 1.0, "home edge site CPU utilisation"),
    ("gpu_util", "continuous", 0.0, 1.0, "home edge site GPU utilisation"),
    ("site_backlog_s", "heavy_tailed", 0.0, 3600.0, "s to drain the home edge site's queue"),
    ("site_reserved", "continuous", 0.0, 20.0, "reserved / total vCPU at the home edge site"),
    ("cloud_util", "continuous", 0.0, 1.0, "paired cloud region CPU utilisation"),
    ("rtt_edge_ms", "continuous", 0.0, 100.0, "ms"),
    ("rtt_cloud_ms", "continuous", 0.0, 200.0, "ms"),
    ("carbon_g_per_kwh", "continuous", 0.0, 1500.0, "gCO2eq/kWh at the home edge site"),
    ("site_background", "continuous", 0.0, 1.0, "other tenants' CPU utilisation of the home edge site"),
)


#: Constants of the home edge site, logged with every group (``scope = "site"`` in the spec).
SITE_PROFILE_FEATURES: tuple[tuple[str, str, float, float, str], ...] = (
    ("site_vcpu", "heavy_tailed", 0.0, 1.0e7, "vCPU of the home edge site"),
)


ACTION_FEATURES: tuple[tuple[str, str, float, float, str], ...] = (
    ("edge_share", "continuous", 0.0, 1.0, "share of offloaded tasks placed at the edge"),
    ("capacity", "continuous", 0.0, 2.0, "reserved edge capacity / nominal load"),
    ("price", "continuous", 0.0, 1.0, "fraction of the list price"),
)


RESPONSE_FEATURES: tuple[tuple[str, str, float, float, str], ...] = (
    ("offload_ratio", "continuous", 0.0, 1.0, "share of its tasks it offloads"),
    ("demand", "heavy_tailed", 0.0, 2.0e4, "tasks/s submitted"),
)


KPI_FEATURES: tuple[tuple[str, str, float, float, str], ...] = (
    ("task_time_ms", "heavy_tailed", 0.0, 1.0e7, "ms: mean completion time of all its tasks"),
    ("slo_violation", "continuous", 0.0, 1.0, "share of its tasks over the SLO"),
    ("energy_j", "heavy_tailed", 0.0, 1.0e10, "J of platform energy incl. cooling"),
    ("carbon_g", "heavy_tailed", 0.0, 1.0e7, "gCO2eq"),
    ("utilisation", "continuous", 0.0, 1.0, "used share of its reserved edge capacity"),
    ("revenue", "heavy_tailed", 0.0, 1.0e6, "$ (list price 0.5 $ per 1000 tasks)"),
    ("reserved_vcpu", "heavy_tailed", 0.0, 1.0e7, "vCPU reserved for it at its home edge site this tick"),
    ("edge_cpu", "heavy_tailed", 0.0, 1.0e7, "vCPU its tasks kept busy at its home edge site this tick"),
)


#: What the operator of the emulated cluster wants of each outcome, and the relative worsening it
#: accepts (the spec's ``better`` / ``margin``: the gate, the canary's guard and its verdict guard
#: each, whether or not the training reward weighs it). The source papers' objectives are the
#: reference: seed 001's weighted reward (revenue up, latency and SLO violations down), seed 002's
#: energy- and carbon-aware scheduling, seed 003's cost-aware offloading. Revenue is the operator's
#: income: 2 % is the most it gives up for anything else; SLO violations, task time, energy and carbon
#: at 5 %, the gate's default margin. Utilisation, reservations and edge CPU are means to these ends,
#: not goals: no direction.
KPI_GOALS: dict[str, tuple[str, float]] = {
    "kpi.revenue": ("higher", 0.02),
    "kpi.slo_violation": ("lower", 0.05),
    "kpi.task_time_ms": ("lower", 0.05),
    "kpi.energy_j": ("lower", 0.05),
    "kpi.carbon_g": ("lower", 0.05),
}


#: Columns that are one value per home edge site and tick: what the operator logs per site.
SITE_SCOPED: frozenset[str] = frozenset(
    {"profile.site_vcpu"}
    | {f"state.{c}" for c in ("site_util", "gpu_util", "site_backlog_s", "site_reserved", "cloud_util", "carbon_g_per_kwh", "site_background")}
)


#: The operator's accounting, declared in the spec (`cluster_spec`): what it reserved over the
#: site's vCPUs, and the site's CPU as a fluid queue of the edge load (its groups' plus the other
#: tenants'); every client behaviour behind ``kpi.edge_cpu`` and ``kpi.reserved_vcpu`` stays learned.
EDGE_LOAD = "sum(kpi.edge_cpu) / profile.site_vcpu + state.site_background"
DECLARED_DYNAMICS: tuple[dict[str, Any], ...] = (
    {"column": "state.site_reserved", "aggregate": "sum", "of": "kpi.reserved_vcpu", "divide_by": "profile.site_vcpu"},
    {"column": "state.site_util", "next": EDGE_LOAD},
    {"column": "state.site_backlog_s", "queue": {"arrivals": EDGE_LOAD, "service": "1"}},
)


STATE_NAMES = tuple(f[0] for f in STATE_FEATURES)


ACTION_NAMES = tuple(f[0] for f in ACTION_FEATURES)


RESPONSE_NAMES = tuple(f[0] for f in RESPONSE_FEATURES)


KPI_NAMES = tuple(f[0] for f in KPI_FEATURES)


#: The spec's reward, what training maximises: the operator's multi-objective (`KPI_GOALS`' KPIs,
#: seed 001's weighted reward over this cluster's own columns). Each column enters with the weight
#: ``share / scale``, ``scale`` its mean per agent-step under the random logging policy of the default
#: cluster (offload 0.44, revenue 3.1 $, SLO violations 0.22, task time 670 ms, energy 8,100 J,
#: carbon 0.87 g; 100 groups x 96 ticks, seed 0), so that each term moves the reward by about its
#: share when its column moves by its own mean. Shares after seed 001's (QoS 0.25 -> SLO violations
#: 0.15 + task time 0.10; energy 0.20 -> energy 0.10 + carbon 0.10, seed 002's emissions; priority +
#: dismissal 0.40 -> revenue 0.30, what served tasks earn), seed 004's offload ratio kept at 0.20.
#: The signs agree with `KPI_GOALS` (a test checks it); the offload ratio, which has no declared
#: goal, gets its direction (higher) from its weight.
REWARD_WEIGHTS: dict[str, float] = {
    "response.offload_ratio": 0.20 / 0.44,
    "kpi.revenue": 0.30 / 3.1,
    "kpi.slo_violation": -0.15 / 0.22,
    "kpi.task_time_ms": -0.10 / 670.0,
    "kpi.energy_j": -0.10 / 8100.0,
    "kpi.carbon_g": -0.10 / 0.87,
}


LIST_PRICE_PER_TASK = 0.5e-3  # $


DEVICE_SLOWDOWN = np.array([8.0, 4.0, 2.0])  # local execution vs reference vCPU, by device class


GPU_SLOTS_PER_CAPACITY = 1.0


MAX_BACKLOG_S = 3600.0  # admission control: work beyond an hour of queue is shed


# ------------------------------------------------------------------------------------ behaviour
@dataclass(frozen=True)
class Behaviour:
    """Hidden response coefficients of a scenario at day 0 and after full drift (level 1)."""

    intercept: tuple[float, float]
    edge_pref: tuple[float, float]
    price_coef: tuple[float, float]
    latency_aversion: tuple[float, float]
    demand_price_elasticity: float = 0.25
    capacity_coef: float = 0.6
    noise_sd: float = 0.35
    noise_phi: float = 0.6
    demand_noise_sd: float = 0.25
    demand_noise_phi: float = 0.7

    def at(self, level: float) -> dict[str, float]:
        def mix(v: tuple[float, float]) -> float:
            return (1 - level) * v[0] + level * v[1]

        return {
            "intercept": mix(self.intercept),
            "edge_pref": mix(self.edge_pref),
            "price_coef": mix(self.price_coef),
            "latency_aversion": mix(self.latency_aversion),
        }


#: Scenario behaviour: iov wants the edge and hates latency; iot is price-driven and indifferent to
#: placement at first but grows edge-seeking; mbb turns from the edge to the cloud (e.g. CDN-backed
#: apps) and grows more price- and latency-sensitive. A placement tuned at day 0 is wrong by 1 month.
BEHAVIOUR: dict[str, Behaviour] = {
    "mbb": Behaviour(intercept=(0.2, 0.0), edge_pref=(1.5, -1.5), price_coef=(0.6, 0.8), latency_aversion=(2.5, 3.5)),
    "iot": Behaviour(intercept=(0.3, 0.1), edge_pref=(-1.0, 2.0), price_coef=(0.8, 1.0), latency_aversion=(1.2, 2.0)),
    "iov": Behaviour(intercept=(0.0, 0.2), edge_pref=(2.5, 1.0), price_coef=(0.3, 0.4), latency_aversion=(3.5, 2.5)),
}


def _periodic_bump(h: np.ndarray, centre: float, width: float) -> np.ndarray:
    d = (h - centre + 12.0) % 24.0 - 12.0
    return np.exp(-0.5 * (d / width) ** 2)


def _raw_diurnal(h: np.ndarray) -> np.ndarray:
    return np.stack(
        [
            0.35 + 1.3 * _periodic_bump(h, 20.5, 3.5) + 0.6 * _periodic_bump(h, 12.5, 3.0),  # mbb: evening
            0.7 + 0.5 * _periodic_bump(h, 11.0, 4.0),  # iot: working hours, flat at night
            0.25 + 1.6 * _periodic_bump(h, 8.0, 1.5) + 1.5 * _periodic_bump(h, 17.5, 2.0)
            + 0.4 * _periodic_bump(h, 13.0, 3.0),  # iov: commuting peaks
        ]
    )


_DIURNAL_MEAN = _raw_diurnal(np.arange(0.0, 24.0, 0.25)).mean(axis=1)


def builtin_diurnal(hours: np.ndarray) -> np.ndarray:
    """Arrival-rate multiplier per scenario (mean 1 over the day) at the given hours: (3, len(hours))."""
    return _raw_diurnal(np.asarray(hours, dtype=np.float64)) / _DIURNAL_MEAN[:, None]


# ------------------------------------------------------------------------------------ config
@dataclass(frozen=True)
class ClusterConfig:
    """What emulated system to run.

    Attributes:
        n_agents: service groups per episode (resampled at every reset).
        steps: ticks per episode.
        step_seconds: simulated seconds per tick (96 x 900 s = one day).
        sites: the topology (default: 3 edge clusters, 2 cloud regions; see `default_sites`).
        drift: ``"0d"|"1d"|"1w"|"1m"`` or days since day 0: population and behaviour drift.
        trace: a real trace (path or `TraceSample`) for task time/cpu/memory shapes and the arrival
            curve, or None for the built-in distributions.
        carbon: carbon intensity source: a file, a directory of ``<zone>_*.parquet``/CSV, a mapping
            zone -> file, or None for the built-in hourly profiles.
        start_day: day of year of day 0 in the carbon series.
        capacity_scale: multiply every site's nodes by this; None sizes the sites to the population
            (edge sites ~``target_util`` busy on average under random actions at day 0).
        target_util: see ``capacity_scale``.
        scenario_weights: override the scenario mix (default: the drifted built-in mix).
        reward_weights: the reward as weights of ``response.*`` / ``kpi.*`` columns (default
            `REWARD_WEIGHTS`); e.g. a site run for cost rather than offload weighs
            ``kpi.utilisation`` (seed 003's cost-cap mode). Also the logs' spec reward.
        declared: the logs' spec declares the site-scoped columns and the operator's accounting
            (`DECLARED_DYNAMICS`); False: a spec that declares nothing (every state learned).
    """

    n_agents: int = 200
    steps: int = 96
    step_seconds: float = 900.0
    sites: tuple[Site, ...] = field(default_factory=default_sites)
    drift: str | float = "0d"
    trace: str | Path | TraceSample | None = None
    carbon: str | Path | Mapping[str, str | Path] | None = None
    start_day: int = 0
    capacity_scale: float | None = None
    target_util: float = 0.45
    scenario_weights: Mapping[str, float] | None = None
    reward_weights: Mapping[str, float] | None = None
    declared: bool = True

    def __post_init__(self) -> None:
        if self.reward_weights is not None:
            known = [f"response.{c}" for c in RESPONSE_NAMES] + [f"kpi.{c}" for c in KPI_NAMES]
            bad = sorted(set(self.reward_weights) - set(known))
            if bad or not self.reward_weights:
                what = f"unknown column(s) {bad}" if bad else "no column"
                raise InputError(f"{what}; expected some of {known}", "reward_weights")
        if int(self.n_agents) < 1:
            raise InputError(f"n_agents must be >= 1, got {self.n_agents}", "--agents")
        if int(self.steps) < 1:
            raise InputError(f"steps must be >= 1, got {self.steps}", "--steps")
        if not self.step_seconds > 0:
            raise InputError(f"step_seconds must be > 0, got {self.step_seconds}", "step_seconds")
        if self.capacity_scale is not None and not self.capacity_scale > 0:
            raise InputError(f"capacity_scale must be > 0, got {self.capacity_scale}", "capacity_scale")
        if not 0 < self.target_util < 1:
            raise InputError(f"target_util must be in (0, 1), got {self.target_util}", "target_util")
        drift_days(self.drift)  # validates
        check_topology(tuple(self.sites))

    @property
    def drift_days(self) -> float:
        return drift_days(self.drift)


def _features(role: str, table: Sequence[tuple[str, str, float, float, str]], scoped: bool) -> list[Feature]:
    feats = []
    for name, kind, low, high, unit in table:
        values = None
        if kind == "discrete" or kind == "categorical":
            values = tuple(float(v) for v in np.arange(low, high + 1))
        full = f"{role}.{name}"
        scope = "site" if scoped and full in SITE_SCOPED else "agent"
        better, margin = KPI_GOALS.get(full, (None, None))
        feats.append(Feature(name=full, kind=kind, low=low, high=high, values=values, unit=unit, scope=scope,  # type: ignore[arg-type]
                             better=better, margin=margin))  # fmt: skip
    return feats


def cluster_spec(config: ClusterConfig | None = None, declared: bool | None = None) -> TwinSpec:
    """The twin spec of the emulated cluster's logs.

    With ``declared`` (default: ``config.declared``) the spec says what the operator knows: which
    columns are the site's (`SITE_SCOPED`) and its own accounting (`DECLARED_DYNAMICS`: the site's
    reservation ratio and its CPU as a fluid queue of the edge load). Without, every state column
    is learned (the twin of issue 19's "before"). The reward is the operator's multi-objective
    over revenue, offload, SLO violations, task time, energy and carbon (`REWARD_WEIGHTS`).
    """
    from edgetwin.contract.dynamics import Declaration

    config = config or ClusterConfig()
    declared = config.declared if declared is None else declared
    feats = (
        _features("profile", PROFILE_FEATURES + SITE_PROFILE_FEATURES, declared)
        + _features("state", STATE_FEATURES, declared)
        + _features("action", ACTION_FEATURES, declared)
        + _features("response", RESPONSE_FEATURES, declared)
        + _features("kpi", KPI_FEATURES, declared)
    )
    dynamics = tuple(Declaration.parse(d, i) for i, d in enumerate(DECLARED_DYNAMICS, start=1)) if declared else ()
    return TwinSpec(
        features=tuple(feats),
        name="emulated-edge-cloud",
        step_seconds=float(config.step_seconds),
        transition=None,
        reward_weights=dict(config.reward_weights or REWARD_WEIGHTS),
        scenarios=SCENARIOS,
        dynamics=dynamics,
    )


def _bounds(table: Sequence[tuple[str, str, float, float, str]]) -> tuple[np.ndarray, np.ndarray]:
    return np.array([f[2] for f in table], dtype=np.float64), np.array([f[3] for f in table], dtype=np.float64)


OBS_LOW, OBS_HIGH = (
    np.concatenate(p)
    for p in zip(_bounds(PROFILE_FEATURES + SITE_PROFILE_FEATURES), _bounds(STATE_FEATURES), strict=True)
)


ACT_LOW, ACT_HIGH = _bounds(ACTION_FEATURES)


RESP_LOW, RESP_HIGH = _bounds(RESPONSE_FEATURES)


KPI_LOW, KPI_HIGH = _bounds(KPI_FEATURES)


_P = {n: i for i, n in enumerate(PROFILE_NAMES)}


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * x))


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-4, 1 - 1e-4)
    return np.log(p) - np.log1p(-p)


def _resolve_trace(trace: str | Path | TraceSample | None) -> TraceSample | None:
    if trace is None:
        return None
    from edgetwin.emulator.traces import TraceSample, read_trace

    return trace if isinstance(trace, TraceSample) else read_trace(trace)


@lru_cache(maxsize=8)
def _reference_load(trace: TraceSample | None) -> float:
    """Mean nominal offloaded vCPU of a service group (trimmed at the 99th percentile), from a fixed
    reference sample: sizes the sites to the population deterministically."""
    rng = np.random.default_rng(20240601)
    prof, _, _ = sample_profiles(rng, 20000, Drift(0.0), trace)
    load = prof[:, _P["demand_rate"]] * prof[:, _P["mean_task_s"]] * prof[:, _P["cpu_per_task"]] * prof[:, _P["base_offload"]]
    load = np.minimum(load, np.quantile(load, 0.99))
    return float(load.mean())


# ------------------------------------------------------------------------------------ simulator
class EdgeCluster:
    """The vectorised emulated edge-cloud cluster.

    ``reset(seed) -> obs (N, O)``; ``step(actions (N, A)) -> (obs (N, O), reward (N,), done, info)``
    with ``info["responses"] (N, R)``, ``info["kpis"] (N, K)`` (columns in `cluster_spec` order),
    ``info["t"]`` and site-level totals. A tick can also be driven agent by agent with
    `act_agents` + `end_tick` (what `EdgeClusterEnv` does); results are identical.

    Attributes after reset: ``profiles (N, P)``, ``scenario`` (N,) index into `SCENARIOS`,
    ``home`` (N,) index into ``sites``, ``agent_ids`` (N,) str, ``t``.
    """

    def __init__(self, config: ClusterConfig | None = None) -> None:
        self.config = config or ClusterConfig()
        cfg = self.config
        self.spec = cluster_spec(cfg)
        # (role, column index within that role's block, weight) per term of the reward
        self._reward_terms: list[tuple[str, int, float]] = []
        for key, w in (cfg.reward_weights or REWARD_WEIGHTS).items():
            role, name = key.split(".", 1)
            block = RESPONSE_NAMES if role == "response" else KPI_NAMES
            self._reward_terms.append((role, block.index(name), float(w)))
        self.n = int(cfg.n_agents)
        self.steps = int(cfg.steps)
        self.dt = float(cfg.step_seconds)
        self.sites: tuple[Site, ...] = tuple(cfg.sites)
        self.drift = Drift(cfg.drift_days)
        self.behaviour = {s: BEHAVIOUR[s].at(self.drift.level) for s in SCENARIOS}
        self.trace = _resolve_trace(cfg.trace)
        self.edge_idx = np.array([k for k, s in enumerate(self.sites) if s.kind == "edge"])
        names = [s.name for s in self.sites]
        self.cloud_of = np.array([names.index(cast(str, s.cloud)) if s.kind == "edge" else k for k, s in enumerate(self.sites)])
        self.carbon: list[CarbonSeries] = [carbon_series_for(s.zone, cfg.carbon) for s in self.sites]
        self._scale_sites()
        self._diurnal_grid = self._make_diurnal()
        self.episodes_done = 0
        self.rng = np.random.default_rng(0)
        self.t = 0
        self._ready = False

    # --- construction helpers -----------------------------------------------------------------
    def _scale_sites(self) -> None:
        cfg = self.config
        s = self.sites
        vcpu = np.array([x.vcpu for x in s], dtype=np.float64)
        if cfg.capacity_scale is not None:
            scale = np.full(len(s), float(cfg.capacity_scale))
        else:
            ref = _reference_load(self.trace)
            w = np.array([x.weight if x.kind == "edge" else 0.0 for x in s])
            w = w / w.sum()
            # Random actions place half the offloaded load at the edge on average.
            need = self.n * ref * 0.5 * w / cfg.target_util
            scale = np.where(w > 0, need / vcpu, 1.0)
            # Cloud regions are sized to ~3x what their edge sites could send them.
            for k, x in enumerate(s):
                if x.kind == "cloud":
                    sent = sum(self.n * ref * 0.5 * w[j] for j, y in enumerate(s) if y.kind == "edge" and y.cloud == x.name)
                    scale[k] = max(sent, 1e-6) * 3.0 / ((1 - x.background_util) * vcpu[k])
        self.scale = scale
        self.vcpu = vcpu * scale
        self.gpu_slots = np.array([x.gpus * x.gpu_slots_per_gpu for x in s], dtype=np.float64) * scale
        self.mem_gb = np.array([x.memory_gb for x in s]) * scale
        self.speed = np.array([x.speed for x in s])
        self.idle_w = np.array([x.idle_watts for x in s]) * scale
        self.dyn_w_per_vcpu = np.array([x.dynamic_watts_per_vcpu for x in s])
        self.bg_util = np.array([x.background_util for x in s])

    def _make_diurnal(self) -> np.ndarray:
        """(3 scenarios, 96 quarter-hours) arrival multipliers, mean 1, from the built-in curves
        reweighted by the trace's arrival curve when one is given."""
        grid = np.arange(0, 24, 0.25)
        curves = builtin_diurnal(grid)
        if self.trace is not None and self.trace.arrivals_s is not None and len(self.trace.arrivals_s) >= 20:
            c = self.trace.arrival_profile(len(grid))
            curves = curves * c[None, :]
            curves = curves / curves.mean(axis=1, keepdims=True)
        return curves

    def diurnal(self, scen: np.ndarray, hour: float) -> np.ndarray:
        return self._diurnal_grid[scen, int(hour * 4) % 96]

    # --- episode ------------------------------------------------------------------------------
    def hour(self, t: int | None = None) -> float:
        t = self.t if t is None else t
        return (t * self.dt / 3600.0) % 24.0

    def reset(self, seed: int | None = None, day: float | None = None) -> np.ndarray:
        """Start an episode with a freshly sampled population; returns obs (N, O).

        Args:
            seed: seeds the population and all noise of the episode.
            day: day of the carbon-intensity series to play (default ``start_day + drift days``);
                `generate_logs` plays consecutive days for consecutive episodes.
        """
        self.rng = np.random.default_rng(seed)
        rng = self.rng
        n = self.n
        self.profiles, self.scenario, self.component = sample_profiles(
            rng, n, self.drift, self.trace, self.config.scenario_weights
        )
        p = self.profiles
        w = np.array([self.sites[k].weight for k in self.edge_idx])
        self.home = self.edge_idx[rng.choice(len(self.edge_idx), size=n, p=w / w.sum())]
        self.cloud = self.cloud_of[self.home]
        lo_e = np.array([s.rtt_ms[0] for s in self.sites])
        hi_e = np.array([s.rtt_ms[1] for s in self.sites])
        self.rtt_edge_base = rng.uniform(lo_e[self.home], hi_e[self.home])
        self.rtt_cloud_base = rng.uniform(lo_e[self.cloud], hi_e[self.cloud])
        self.jitter_edge = np.array([s.jitter for s in self.sites])[self.home]
        self.jitter_cloud = np.array([s.jitter for s in self.sites])[self.cloud]
        self.persistent = rng.normal(0.0, 0.3, n)
        self.is_gpu = p[:, _P["needs_gpu"]] > 0.5
        self.alpha = 1.0 - np.exp(-1.0 / p[:, _P["convergence_steps"]])
        bh = [self.behaviour[s] for s in SCENARIOS]
        self.b_intercept = np.array([b["intercept"] for b in bh])[self.scenario]
        self.b_edge = np.array([b["edge_pref"] for b in bh])[self.scenario]
        self.b_price = np.array([b["price_coef"] for b in bh])[self.scenario]
        self.b_latency = np.array([b["latency_aversion"] for b in bh])[self.scenario]
        self.b_elastic = np.array([BEHAVIOUR[s].demand_price_elasticity for s in SCENARIOS])[self.scenario]
        self.b_cap = np.array([BEHAVIOUR[s].capacity_coef for s in SCENARIOS])[self.scenario]
        self.noise_sd = np.array([BEHAVIOUR[s].noise_sd for s in SCENARIOS])[self.scenario]
        self.noise_phi = np.array([BEHAVIOUR[s].noise_phi for s in SCENARIOS])[self.scenario]
        self.dnoise_sd = np.array([BEHAVIOUR[s].demand_noise_sd for s in SCENARIOS])[self.scenario]
        self.dnoise_phi = np.array([BEHAVIOUR[s].demand_noise_phi for s in SCENARIOS])[self.scenario]
        # Nominal load per unit of diurnal demand: what `capacity` reservations are relative to.
        self.work_per_task = p[:, _P["mean_task_s"]] * np.where(self.is_gpu, 0.25, 1.0) * p[:, _P["cpu_per_task"]]

        # Hidden per-group state.
        slo = p[:, _P["latency_slo_ms"]]
        self.ema = slo * np.exp(rng.normal(-0.3, 0.4, n))
        self.eta = rng.normal(0.0, 1.0, n) * self.noise_sd
        self.xi = rng.normal(0.0, 1.0, n) * self.dnoise_sd
        # Observable per-group state.
        self.latency_ms = self.ema.copy()
        self.prev_offload = p[:, _P["base_offload"]].copy()
        self.t = 0
        self.prev_demand = p[:, _P["demand_rate"]] * self.diurnal(self.scenario, self.hour(0))
        # Sites.
        n_sites = len(self.sites)
        self.day = float(self.config.start_day + self.config.drift_days if day is None else day)
        self.episodes_done += 1
        self.site_bg = self._background(0, rng.normal(0, 1, n_sites))
        self.site_util = self.site_bg.copy()
        self.site_gpu_util = 0.5 * self.site_bg
        self.site_backlog_s = np.zeros(n_sites)
        self.site_reserved = np.zeros(n_sites)
        self.site_mem_util = self.site_bg.copy()
        self.site_liquid = np.array([s.cooling.mode == "liquid" for s in self.sites])
        self.site_cr = np.array([s.cooling.cr_liquid if liq else s.cooling.cr_air for s, liq in zip(self.sites, self.site_liquid, strict=True)])
        self.agent_ids = np.array([f"sg{self.episodes_done - 1}-{i:05d}" for i in range(n)], dtype=object)
        self._ready = True
        self._begin_tick()
        return self.observe()

    def _background(self, t: int, eps: np.ndarray) -> np.ndarray:
        """Other tenants' utilisation of each site at tick t (diurnal, noisy)."""
        h = self.hour(t)
        bg = self.bg_util * (1.0 + 0.35 * np.sin(2 * np.pi * (h - 9.0) / 24.0)) * np.exp(0.1 * eps)
        return np.clip(bg, 0.0, 0.95)

    def _begin_tick(self) -> None:
        """Draw all randomness of the tick up front, so per-agent and batch stepping agree."""
        rng, n = self.rng, self.n
        self._eps_off = rng.standard_normal(n)
        self._eps_dem = rng.standard_normal(n)
        self._jit_e = rng.beta(2.0, 5.0, n)
        self._jit_c = rng.beta(2.0, 5.0, n)
        self._eps_site = rng.standard_normal(len(self.sites))
        self.rtt_edge = self.rtt_edge_base * (1.0 + self.jitter_edge * self._jit_e)
        self.rtt_cloud = self.rtt_cloud_base * (1.0 + self.jitter_cloud * self._jit_c)
        hours = self.day * 24.0 + self.hour()
        self.site_ci = np.array([c.at(hours) for c in self.carbon])
        s = len(self.sites)
        self._acc_cpu = np.zeros(s)
        self._acc_gpu = np.zeros(s)
        self._acc_mem = np.zeros(s)
        self._acc_res = np.zeros(s)
        self._acted = np.zeros(self.n, dtype=bool)
        self._pending: dict[str, np.ndarray] = {
            k: np.empty(self.n) for k in ("ema", "eta", "xi", "latency", "offload", "demand")
        }

    def observe(self, idx: np.ndarray | slice | None = None) -> np.ndarray:
        """Observations ``[profile.*, state.*]`` at the start of the current tick: (N, O) or (len(idx), O)."""
        if not self._ready:
            raise RuntimeError("call reset() first")
        sel = slice(None) if idx is None else idx
        home = self.home[sel]
        cols = [
            np.full(len(home), self.hour() / 24.0),
            self.latency_ms[sel],
            self.prev_offload[sel],
            self.prev_demand[sel],
            self.site_util[home],
            self.site_gpu_util[home],
            self.site_backlog_s[home],
            self.site_reserved[home],
            self.site_util[self.cloud[sel]],
            self.rtt_edge[sel],
            self.rtt_cloud[sel],
            self.site_ci[home],
            self.site_bg[home],
        ]
        obs = np.concatenate([self.profiles[sel], self.vcpu[home][:, None], np.stack(cols, axis=1)], axis=1)
        return np.clip(obs, OBS_LOW, OBS_HIGH)

    # --- the hidden response and the KPIs -----------------------------------------------------
    def act_agents(self, idx: np.ndarray, actions: np.ndarray) -> dict[str, np.ndarray]:
        """Apply the platform's actions to the groups ``idx`` in the current tick.

        Args:
            idx: (n,) agent indices that have not acted in this tick.
            actions: (n, A) actions in spec order; clipped to the spec bounds.

        Returns:
            ``{"responses": (n, R), "kpis": (n, K), "reward": (n,)}``.
        """
        if not self._ready or self.t >= self.steps:
            raise RuntimeError("episode is over: call reset()")
        idx = np.asarray(idx, dtype=np.int64)
        if self._acted[idx].any():
            raise RuntimeError("an agent acted twice in one tick")
        a = check_actions(actions, len(idx))
        edge_share, capacity, price = a[:, 0], a[:, 1], a[:, 2]
        p = self.profiles[idx]
        scen, home, cloud = self.scenario[idx], self.home[idx], self.cloud[idx]
        gpu = self.is_gpu[idx]
        slo = p[:, _P["latency_slo_ms"]]
        prio = p[:, _P["priority"]]
        ps = p[:, _P["price_sensitivity"]]
        task_s = p[:, _P["mean_task_s"]]
        hour = self.hour()

        # Response: offload ratio (threshold reaction to experienced latency vs SLO) and demand.
        pain = _sigmoid((self.ema[idx] / slo - 1.0) / 0.15)
        eta = self.noise_phi[idx] * self.eta[idx] + np.sqrt(1 - self.noise_phi[idx] ** 2) * self.noise_sd[idx] * self._eps_off[idx]
        logit = (
            _logit(p[:, _P["base_offload"]])
            + self.b_intercept[idx]
            + self.b_edge[idx] * (edge_share - 0.5) * (1.0 + 0.3 * (prio - 1.0))
            - self.b_price[idx] * ps * price
            + self.b_cap[idx] * np.log((capacity / np.maximum(1.0, self.site_reserved[home]) + 0.05) / 1.05)
            - self.b_latency[idx] * (0.5 + 0.25 * (prio - 1.0)) * pain
            + self.persistent[idx]
            + eta
        )
        offload = _sigmoid(logit)
        diurnal = self.diurnal(scen, hour)
        xi = self.dnoise_phi[idx] * self.xi[idx] + np.sqrt(1 - self.dnoise_phi[idx] ** 2) * self.dnoise_sd[idx] * self._eps_dem[idx]
        nominal = p[:, _P["demand_rate"]] * diurnal
        demand = nominal * np.exp(-self.b_elastic[idx] * ps * price) * (1.0 - 0.4 * pain) * np.exp(xi - 0.5 * self.dnoise_sd[idx] ** 2)

        # Loads (Little's law): vCPU busy, GPU slots busy, GB resident.
        off_rate = demand * offload
        work = self.work_per_task[idx]
        cpu_edge = off_rate * edge_share * work
        cpu_cloud = off_rate * (1.0 - edge_share) * work
        gpu_edge = np.where(gpu, off_rate * edge_share * task_s, 0.0)
        mem_edge = off_rate * edge_share * task_s * p[:, _P["memory_gb"]]
        # Reservation: relative to nominal load at this hour; overcommitted sites shrink it.
        alloc = capacity * nominal * work
        eff_alloc = alloc / np.maximum(1.0, self.site_reserved[home])
        gpu_alloc = capacity * nominal * task_s
        gpu_eff_alloc = gpu_alloc / np.maximum(1.0, self.site_reserved[home])

        # Edge latency: own reservation first, the rest queues on the shared pool at its current
        # utilisation and behind the site's backlog.
        own_load = np.where(gpu, gpu_edge, cpu_edge)
        own_alloc = np.where(gpu, gpu_eff_alloc, eff_alloc)
        rho_own = own_load / np.maximum(own_alloc, 1e-9)
        spill = np.where(rho_own > 1.0, 1.0 - 1.0 / np.maximum(rho_own, 1e-9), 0.0)
        pool_util = np.where(gpu & (self.gpu_slots[home] > 0), self.site_gpu_util[home], self.site_util[home])
        rho_res = np.minimum(rho_own, 0.95)
        rho_pool = np.minimum(pool_util, 0.97)
        q = (1.0 - spill) / (1.0 - rho_res) + spill / (1.0 - rho_pool)
        mem_slow = 1.0 + 3.0 * np.clip((self.site_mem_util[home] - 0.85) / 0.15, 0.0, None)
        speed_e = np.where(gpu & (self.gpu_slots[home] <= 0), 0.25, np.where(gpu, 1.0, self.speed[home]))
        svc_edge = task_s * 1000.0 / speed_e * mem_slow
        backlog_ms = self.site_backlog_s[home] * 1000.0 * (0.2 + 0.8 * spill) / prio
        lat_edge = self.rtt_edge[idx] + svc_edge * q + backlog_ms
        # Cloud: abundant, shared, farther.
        speed_c = np.where(gpu, 1.2, self.speed[cloud])
        svc_cloud = task_s * 1000.0 / speed_c
        lat_cloud = self.rtt_cloud[idx] + svc_cloud / (1.0 - np.minimum(self.site_util[cloud], 0.97))
        lat_local = task_s * 1000.0 * DEVICE_SLOWDOWN[p[:, _P["device_class"]].astype(np.int64)] * np.where(gpu, 3.0, 1.0)
        lat_off = edge_share * lat_edge + (1.0 - edge_share) * lat_cloud
        task_time = offload * lat_off + (1.0 - offload) * lat_local

        def p_over(mean_ms: np.ndarray, fixed_ms: np.ndarray) -> np.ndarray:
            # Sojourn = fixed part + exponential with the rest of the mean.
            var = np.maximum(mean_ms - fixed_ms, 1e-6)
            return np.exp(-np.maximum(slo - fixed_ms, 0.0) / var)

        v_edge = p_over(lat_edge, self.rtt_edge[idx] + backlog_ms)
        v_cloud = p_over(lat_cloud, self.rtt_cloud[idx])
        v_local = p_over(lat_local, np.zeros_like(lat_local))
        slo_violation = offload * (edge_share * v_edge + (1.0 - edge_share) * v_cloud) + (1.0 - offload) * v_local

        # Energy: own dynamic load plus a share of idle power by reservation, with cooling.
        busy_e = cpu_edge + np.where(gpu, gpu_edge * 2.0, 0.0)  # a GPU slot draws ~2 vCPU-equivalents
        busy_c = cpu_cloud + np.where(gpu, off_rate * (1.0 - edge_share) * task_s * 2.0, 0.0)
        e_edge = (busy_e * self.dyn_w_per_vcpu[home] + eff_alloc / self.vcpu[home] * self.idle_w[home]) * self.dt
        e_cloud = (busy_c * self.dyn_w_per_vcpu[cloud] + busy_c / self.vcpu[cloud] * self.idle_w[cloud]) * self.dt
        e_edge *= 1.0 + self.site_cr[home]
        e_cloud *= 1.0 + self.site_cr[cloud]
        energy = e_edge + e_cloud
        carbon = joules_to_grams_co2(e_edge, self.site_ci[home]) + joules_to_grams_co2(e_cloud, self.site_ci[cloud])
        utilisation = np.where(own_alloc > 0, np.minimum(own_load, own_alloc) / np.maximum(own_alloc, 1e-12), 0.0)
        revenue = price * LIST_PRICE_PER_TASK * off_rate * self.dt

        # Accumulate the site loads (applied at the end of the tick) and pend the group's new state.
        s = len(self.sites)
        self._acc_cpu += np.bincount(home, cpu_edge, s) + np.bincount(cloud, cpu_cloud, s)
        self._acc_gpu += np.bincount(home, gpu_edge, s)
        self._acc_mem += np.bincount(home, mem_edge, s)
        self._acc_res += np.bincount(home, alloc, s)
        pend = self._pending
        pend["ema"][idx] = (1.0 - self.alpha[idx]) * self.ema[idx] + self.alpha[idx] * lat_off
        pend["eta"][idx] = eta
        pend["xi"][idx] = xi
        pend["latency"][idx] = lat_off
        pend["offload"][idx] = offload
        pend["demand"][idx] = demand
        self._acted[idx] = True

        responses = np.clip(np.stack([offload, demand], axis=1), RESP_LOW, RESP_HIGH)
        kpis = np.clip(
            np.stack([task_time, slo_violation, energy, carbon, utilisation, revenue, alloc, cpu_edge], axis=1),
            KPI_LOW,
            KPI_HIGH,
        )
        reward = np.zeros(len(responses))
        for role, j, w in self._reward_terms:
            reward = reward + w * (responses[:, j] if role == "response" else kpis[:, j])
        return {"responses": responses, "kpis": kpis, "reward": reward}

    def end_tick(self) -> tuple[bool, dict[str, np.ndarray]]:
        """Close the tick once every group has acted: update sites and groups; returns (done, site totals)."""
        if not self._acted.all():
            raise RuntimeError(f"{int((~self._acted).sum())} agents have not acted in tick {self.t}")
        pend = self._pending
        self.ema, self.eta, self.xi = pend["ema"], pend["eta"], pend["xi"]
        self.latency_ms, self.prev_offload, self.prev_demand = pend["latency"], pend["offload"], pend["demand"]

        bg = self.site_bg
        load = self._acc_cpu + bg * self.vcpu
        util = np.clip(load / self.vcpu, 0.0, 1.0)
        gpu_util = np.where(self.gpu_slots > 0, np.clip(self._acc_gpu / np.maximum(self.gpu_slots, 1e-9) + 0.5 * bg, 0, 1), 0.0)
        self.site_backlog_s = np.clip(self.site_backlog_s + (load - self.vcpu) / self.vcpu * self.dt, 0.0, MAX_BACKLOG_S)
        self.site_reserved = self._acc_res / self.vcpu
        self.site_mem_util = np.clip(self._acc_mem / self.mem_gb + bg, 0.0, 2.0)
        # Seed 002 cooling: the room switches method by its IT power.
        it_w = np.array([s.power_watts(u) for s, u in zip(self.sites, util, strict=True)]) * self.scale
        switch_j = np.zeros(len(self.sites))
        for k, site in enumerate(self.sites):
            liq, cr, sw = site.cooling.step(
                self.site_liquid[k : k + 1], it_w[k : k + 1] / self.scale[k]
            )
            self.site_liquid[k], self.site_cr[k], switch_j[k] = liq[0], cr[0], sw[0] * self.scale[k]
        site_energy = it_w * (1.0 + self.site_cr) * self.dt + switch_j
        totals = {
            "site_util": util,
            "site_energy_j": site_energy,
            "site_carbon_g": joules_to_grams_co2(site_energy, self.site_ci),
            "site_backlog_s": self.site_backlog_s.copy(),
            "site_liquid": self.site_liquid.copy(),
        }
        self.site_util, self.site_gpu_util = util, gpu_util
        self.t += 1
        done = self.t >= self.steps
        self.site_bg = self._background(self.t, self._eps_site)
        if not done:
            self._begin_tick()
        return done, totals

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool, dict[str, Any]]:
        """Advance one tick with actions for every group.

        Args:
            actions: (N, A) in spec order (edge_share, capacity, price); clipped to bounds.

        Returns:
            ``(obs (N, O), reward (N,), done, info)``; ``info`` has ``responses (N, R)``,
            ``kpis (N, K)``, ``t`` (the tick just played) and site totals (``site_*``, per site).
        """
        t = self.t
        out = self.act_agents(np.arange(self.n), actions)
        done, totals = self.end_tick()
        info: dict[str, Any] = {"responses": out["responses"], "kpis": out["kpis"], "t": t, **totals}
        return self.observe(), out["reward"], done, info

    @property
    def site_names(self) -> list[str]:
        return [s.name for s in self.sites]


def check_actions(actions: np.ndarray, n: int) -> np.ndarray:
    """``(n, A)`` actions checked (shape, finite values) and clipped to the action bounds."""
    a = np.asarray(actions, dtype=np.float64)
    if a.ndim == 1 and n == 1:
        a = a[None, :]
    if a.shape != (n, len(ACTION_NAMES)):
        raise InputError(f"expected actions of shape ({n}, {len(ACTION_NAMES)}) {ACTION_NAMES}, got {a.shape}", "actions")
    if not np.isfinite(a).all():
        raise InputError("actions contain NaN or inf", "actions")
    return np.clip(a, ACT_LOW, ACT_HIGH)


def cluster_kpi_columns() -> Any:
    """Which emulated-cluster columns are which KPI (`edgetwin.policies.evaluate.KpiColumns`).

    Evaluation is generic over column names; this is the mapping for the cluster's spec.
    """
    from edgetwin.policies.evaluate import KpiColumns

    return KpiColumns(
        offload="response.offload_ratio",
        revenue="kpi.revenue",
        completion_time="kpi.task_time_ms",
        slo_violation="kpi.slo_violation",
        energy="kpi.energy_j",
        carbon="kpi.carbon_g",
        requests="response.demand",
        requests_are_rate=True,
        utilisation="kpi.utilisation",
        fairness="kpi.slo_violation",
        fairness_one_minus=True,
    )
