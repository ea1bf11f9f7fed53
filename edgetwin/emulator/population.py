"""The population of service groups (agents) of the emulated cluster, and how it drifts.

Profiles are drawn per scenario (``mbb``, ``iot``, ``iov``) from a mixture of sub-populations
("components": e.g. video streaming vs web browsing in mbb). Within a component the features are
tied by a Gaussian copula (task time with cpu and memory, SLO with priority, ...), and each
feature has its own marginal: log-Student-t for the heavy-tailed ones (task time, demand, memory),
logit-normal for propensities, ordered cuts for priority and device class, a threshold for needs-GPU.
So the joint distribution is correlated, multi-modal, heavy-tailed and partly discrete; a single
Gaussian (or a GMM on raw values) does not fit it, which is what seed 004's Table 1 needs.

With a real trace (`edgetwin.emulator.traces.TraceSample`), the *shapes* of task time, cpu and memory
come from the trace's empirical quantiles (rescaled to each component's median), so the heavy tail
is the real one; scenario and component structure stay.

`Drift` moves the population and the behaviour with simulated time (seed 004 Table 2: 0 d, 1 d,
1 week, 1 month): scenario mix and component weights shift, demand grows, price sensitivity rises.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from scipy import stats

from edgetwin.contract.errors import InputError

if TYPE_CHECKING:
    from edgetwin.emulator.traces import TraceSample

SCENARIOS: tuple[str, ...] = ("mbb", "iot", "iov")

#: Profile features in spec order: (short name, kind, low, high, unit).
PROFILE_FEATURES: tuple[tuple[str, str, float, float, str], ...] = (
    ("mean_task_s", "heavy_tailed", 1e-3, 600.0, "s per task on a reference vCPU"),
    ("convergence_steps", "heavy_tailed", 1.0, 200.0, "steps: time constant of adapting to experience"),
    ("base_offload", "continuous", 0.0, 1.0, "baseline share of tasks offloaded"),
    ("demand_rate", "heavy_tailed", 1e-3, 2000.0, "tasks/s at the daily mean"),
    ("latency_slo_ms", "heavy_tailed", 5.0, 20000.0, "ms"),
    ("priority", "discrete", 1.0, 3.0, "1 low .. 3 high"),
    ("price_sensitivity", "continuous", 0.0, 6.0, "1/price unit"),
    ("cpu_per_task", "heavy_tailed", 0.05, 8.0, "vCPU"),
    ("memory_gb", "heavy_tailed", 0.01, 64.0, "GB per running task"),
    ("needs_gpu", "binary", 0.0, 1.0, ""),
    ("device_class", "categorical", 0.0, 2.0, "0 constrained, 1 mid, 2 capable"),
)
PROFILE_NAMES: tuple[str, ...] = tuple(f[0] for f in PROFILE_FEATURES)
_IDX = {n: i for i, n in enumerate(PROFILE_NAMES)}


@dataclass(frozen=True)
class Component:
    """One sub-population of a scenario: marginal parameters of each profile feature.

    Log-scale features are ``(median, log-sd)``; ``base_offload`` is ``(logit mean, logit sd)``;
    discrete features are probabilities of each level.
    """

    name: str
    weight: float
    mean_task_s: tuple[float, float]
    convergence_steps: tuple[float, float]
    base_offload: tuple[float, float]
    demand_rate: tuple[float, float]
    latency_slo_ms: tuple[float, float]
    priority: tuple[float, float, float]
    price_sensitivity: tuple[float, float]
    cpu_per_task: tuple[float, float]
    memory_gb: tuple[float, float]
    p_gpu: float
    device_class: tuple[float, float, float]


#: Copula correlations (shared by a scenario's components); unlisted pairs are 0.
_CORR: tuple[tuple[str, str, float], ...] = (
    ("mean_task_s", "cpu_per_task", 0.55),
    ("mean_task_s", "memory_gb", 0.45),
    ("cpu_per_task", "memory_gb", 0.35),
    ("mean_task_s", "needs_gpu", 0.35),
    ("latency_slo_ms", "priority", -0.6),  # strict SLO <-> high priority
    ("price_sensitivity", "priority", -0.4),
    ("price_sensitivity", "base_offload", -0.3),
    ("demand_rate", "base_offload", 0.3),
    ("demand_rate", "mean_task_s", -0.35),  # many small tasks or few big ones
    ("convergence_steps", "device_class", -0.5),  # capable devices adapt faster
    ("base_offload", "device_class", -0.4),  # constrained devices offload more
)

#: Student-t degrees of freedom of the heavy-tailed log marginals.
_DF = 4.0

#: Built-in scenarios (sizes loosely after the papers' mobile broadband / IoT / vehicular mixes).
SCENARIO_COMPONENTS: dict[str, tuple[Component, ...]] = {
    "mbb": (
        Component("video", 0.55, (0.04, 0.6), (8.0, 0.5), (0.6, 0.8), (6.0, 0.9), (200.0, 0.35),
                  (0.3, 0.5, 0.2), (1.2, 0.5), (1.0, 0.5), (1.0, 0.6), 0.35, (0.1, 0.5, 0.4)),
        Component("web", 0.45, (0.012, 0.7), (4.0, 0.5), (1.2, 0.7), (25.0, 1.0), (300.0, 0.4),
                  (0.5, 0.4, 0.1), (2.0, 0.45), (0.25, 0.5), (0.25, 0.7), 0.02, (0.2, 0.5, 0.3)),
    ),
    "iot": (
        Component("sensor", 0.6, (0.01, 0.6), (30.0, 0.6), (1.6, 0.6), (60.0, 1.1), (2000.0, 0.6),
                  (0.7, 0.25, 0.05), (3.0, 0.35), (0.1, 0.4), (0.05, 0.5), 0.0, (0.7, 0.25, 0.05)),
        Component("gateway", 0.3, (2.0, 0.8), (15.0, 0.5), (0.3, 0.7), (0.8, 0.8), (5000.0, 0.5),
                  (0.4, 0.5, 0.1), (1.8, 0.4), (1.0, 0.5), (2.0, 0.7), 0.05, (0.1, 0.5, 0.4)),
        Component("camera", 0.1, (0.1, 0.5), (10.0, 0.5), (0.9, 0.6), (4.0, 0.7), (600.0, 0.4),
                  (0.3, 0.5, 0.2), (1.4, 0.4), (1.5, 0.4), (1.5, 0.5), 0.75, (0.3, 0.5, 0.2)),
    ),
    "iov": (
        Component("telemetry", 0.4, (0.005, 0.5), (3.0, 0.4), (1.0, 0.6), (20.0, 0.8), (50.0, 0.3),
                  (0.1, 0.4, 0.5), (0.6, 0.5), (0.2, 0.4), (0.2, 0.5), 0.0, (0.1, 0.4, 0.5)),
        Component("perception", 0.35, (0.012, 0.4), (2.0, 0.4), (0.8, 0.6), (10.0, 0.6), (45.0, 0.25),
                  (0.0, 0.3, 0.7), (0.4, 0.5), (2.0, 0.4), (3.0, 0.5), 0.9, (0.0, 0.3, 0.7)),
        Component("infotainment", 0.25, (0.05, 0.6), (6.0, 0.5), (0.4, 0.7), (3.0, 0.9), (250.0, 0.4),
                  (0.5, 0.4, 0.1), (1.5, 0.5), (0.8, 0.5), (1.0, 0.6), 0.15, (0.2, 0.5, 0.3)),
    ),
}

#: Scenario mix at day 0 and where drift takes it (weights need not sum to 1; they are normalised).
SCENARIO_WEIGHTS_0D: dict[str, float] = {"mbb": 0.45, "iot": 0.35, "iov": 0.20}
SCENARIO_WEIGHTS_DRIFTED: dict[str, float] = {"mbb": 0.28, "iot": 0.32, "iov": 0.40}

DRIFT_DAYS: dict[str, float] = {"0d": 0.0, "1d": 1.0, "1w": 7.0, "1m": 30.0}


def drift_days(drift: str | float) -> float:
    """Days of simulated time for a drift knob (``"0d"|"1d"|"1w"|"1m"`` or a number of days)."""
    if isinstance(drift, int | float) and not isinstance(drift, bool):
        if drift < 0:
            raise InputError(f"drift must be >= 0 days, got {drift}", "--drift")
        return float(drift)
    if drift in DRIFT_DAYS:
        return DRIFT_DAYS[drift]
    raise InputError(f"drift must be one of {', '.join(DRIFT_DAYS)} or a number of days, got {drift!r}", "--drift")


@dataclass(frozen=True)
class Drift:
    """How the system has moved ``t_days`` after day 0.

    ``level = 1 - exp(-t_days / tau_days)`` (0 at day 0, ~0.1 after a day, ~0.5 after a week, ~0.95
    after a month) interpolates the scenario mix, shifts each scenario's component weights toward
    its last component and scales behaviour; demand grows linearly; a weekly cycle modulates it.

    Attributes:
        t_days: simulated days since day 0.
        tau_days: time constant of the drift.
        demand_growth_per_day: relative demand growth per day.
    """

    t_days: float = 0.0
    tau_days: float = 10.0
    demand_growth_per_day: float = 0.01

    @property
    def level(self) -> float:
        return float(1.0 - np.exp(-self.t_days / self.tau_days))

    def scenario_weights(self) -> dict[str, float]:
        lv = self.level
        w = {s: (1 - lv) * SCENARIO_WEIGHTS_0D[s] + lv * SCENARIO_WEIGHTS_DRIFTED[s] for s in SCENARIOS}
        total = sum(w.values())
        return {s: v / total for s, v in w.items()}

    def component_weights(self, scenario: str) -> np.ndarray:
        comps = SCENARIO_COMPONENTS[scenario]
        w = np.array([c.weight for c in comps])
        # Drift moves mass toward the last component (e.g. more perception workloads in iov).
        target = np.zeros_like(w)
        target[-1] = 1.0
        w = (1 - 0.5 * self.level) * w + 0.5 * self.level * target
        return w / w.sum()

    @property
    def demand_scale(self) -> float:
        weekly = 1.0 + 0.08 * np.cos(2 * np.pi * self.t_days / 7.0)  # day 0 is a busy weekday
        return float((1.0 + self.demand_growth_per_day * self.t_days) * weekly)

    @property
    def price_sensitivity_scale(self) -> float:
        return 1.0 + 0.3 * self.level


def _corr_matrix() -> np.ndarray:
    k = len(PROFILE_NAMES)
    r = np.eye(k)
    for a, b, rho in _CORR:
        r[_IDX[a], _IDX[b]] = r[_IDX[b], _IDX[a]] = rho
    # Nearest correlation matrix by eigenvalue clipping, so that the listed pairs need not be
    # jointly consistent by hand.
    vals, vecs = np.linalg.eigh(r)
    r = vecs @ np.diag(np.clip(vals, 1e-3, None)) @ vecs.T
    d = np.sqrt(np.diag(r))
    return r / d[:, None] / d[None, :]


_CHOL = np.linalg.cholesky(_corr_matrix())


def _cut(u: np.ndarray, probs: tuple[float, ...] | np.ndarray) -> np.ndarray:
    """Ordered levels 0..L-1 from uniforms by cumulative probabilities."""
    p = np.asarray(probs, dtype=np.float64)
    edges = np.cumsum(p / p.sum())[:-1]
    return np.searchsorted(edges, u, side="right").astype(np.float64)


class TraceMarginals:
    """Empirical quantile functions of a trace's task time, cpu and memory, normalised to median 1."""

    def __init__(self, trace: TraceSample) -> None:
        self.name = trace.name
        self.q: dict[str, np.ndarray] = {}
        for feature, values in (
            ("mean_task_s", trace.durations_s),
            ("cpu_per_task", trace.cpu),
            ("memory_gb", trace.memory),
        ):
            if values is None:
                continue
            v = np.asarray(values, dtype=np.float64)
            v = v[np.isfinite(v) & (v > 0)]
            # Too few values, or no spread (e.g. one memory size for every SURF job): the trace says
            # nothing about the shape, so the built-in marginal stays.
            if len(v) >= 20 and np.quantile(v, 0.9) > 1.05 * np.quantile(v, 0.1):
                self.q[feature] = np.sort(v / np.median(v))

    def ppf(self, feature: str, u: np.ndarray) -> np.ndarray | None:
        q = self.q.get(feature)
        if q is None:
            return None
        return np.interp(u, np.linspace(0.0, 1.0, len(q)), q)


def sample_profiles(
    rng: np.random.Generator,
    n: int,
    drift: Drift | None = None,
    trace: TraceSample | None = None,
    scenario_weights: Mapping[str, float] | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Draw ``n`` service-group profiles.

    Args:
        rng: the random generator (the only source of randomness).
        n: number of service groups.
        drift: the population's drift (default: day 0).
        trace: a real trace whose task-time/cpu/memory shapes replace the built-in marginals.
        scenario_weights: override the (drifted) scenario mix.

    Returns:
        ``(profiles (n, P) in PROFILE_NAMES order, scenario index (n,) into SCENARIOS,
        component index (n,) within the scenario)``.
    """
    drift = drift or Drift()
    sw = dict(scenario_weights) if scenario_weights is not None else drift.scenario_weights()
    unknown = set(sw) - set(SCENARIOS)
    if unknown:
        raise InputError(f"unknown scenarios {sorted(unknown)}; known: {SCENARIOS}", "scenario_weights")
    p_s = np.array([max(sw.get(s, 0.0), 0.0) for s in SCENARIOS])
    if p_s.sum() <= 0:
        raise InputError("scenario weights must have a positive sum", "scenario_weights")
    scen = rng.choice(len(SCENARIOS), size=n, p=p_s / p_s.sum())
    comp = np.zeros(n, dtype=np.int64)
    for si, s in enumerate(SCENARIOS):
        m = scen == si
        cw = drift.component_weights(s)
        comp[m] = rng.choice(len(cw), size=int(m.sum()), p=cw)

    z = rng.standard_normal((n, len(PROFILE_NAMES))) @ _CHOL.T
    u = np.clip(stats.norm.cdf(z), 1e-6, 1 - 1e-6)
    heavy = stats.t.ppf(u, df=_DF) * np.sqrt((_DF - 2) / _DF)  # unit-variance Student-t scores
    marg = TraceMarginals(trace) if trace is not None else None

    out = np.empty((n, len(PROFILE_NAMES)), dtype=np.float64)
    for si, s in enumerate(SCENARIOS):
        for ci, c in enumerate(SCENARIO_COMPONENTS[s]):
            m = (scen == si) & (comp == ci)
            if not m.any():
                continue
            zz, uu, hh = z[m], u[m], heavy[m]

            def lognorm(name: str, par: tuple[float, float], tail: bool, zz=zz, uu=uu, hh=hh) -> np.ndarray:
                j = _IDX[name]
                shape = marg.ppf(name, uu[:, j]) if marg is not None else None
                if shape is not None:
                    return par[0] * shape  # the trace's own tail, at this component's median
                score = hh[:, j] if tail else zz[:, j]
                return par[0] * np.exp(par[1] * score)

            cols = out[m]
            cols[:, _IDX["mean_task_s"]] = lognorm("mean_task_s", c.mean_task_s, True)
            cols[:, _IDX["convergence_steps"]] = 1.0 + lognorm("convergence_steps", c.convergence_steps, False)
            cols[:, _IDX["base_offload"]] = 1 / (1 + np.exp(-(c.base_offload[0] + c.base_offload[1] * zz[:, _IDX["base_offload"]])))
            cols[:, _IDX["demand_rate"]] = lognorm("demand_rate", c.demand_rate, True) * drift.demand_scale
            cols[:, _IDX["latency_slo_ms"]] = lognorm("latency_slo_ms", c.latency_slo_ms, False)
            cols[:, _IDX["priority"]] = 1.0 + _cut(uu[:, _IDX["priority"]], c.priority)
            cols[:, _IDX["price_sensitivity"]] = (
                lognorm("price_sensitivity", c.price_sensitivity, False) * drift.price_sensitivity_scale
            )
            cols[:, _IDX["cpu_per_task"]] = lognorm("cpu_per_task", c.cpu_per_task, False)
            cols[:, _IDX["memory_gb"]] = lognorm("memory_gb", c.memory_gb, True)
            cols[:, _IDX["needs_gpu"]] = (uu[:, _IDX["needs_gpu"]] > 1.0 - c.p_gpu).astype(np.float64)
            cols[:, _IDX["device_class"]] = _cut(uu[:, _IDX["device_class"]], c.device_class)
            out[m] = cols

    lows = np.array([f[2] for f in PROFILE_FEATURES])
    highs = np.array([f[3] for f in PROFILE_FEATURES])
    np.clip(out, lows, highs, out=out)
    return out, scen, comp
