"""Rewards for platform policies: the components of the source papers and a multi-objective sum.

Every component is a plain vectorised numpy function with its equation number; the
:class:`MultiObjectiveReward` combines them over a step's columns (``{name: (N,) array}``, one entry
per agent, i.e. the `edgetwin.contract.spec.RewardFn` signature), so a twin spec can name it and a user
can name their own (``module:function``). Which column holds latency, energy, priority ... is given
by a :class:`RewardColumns` at construction: nothing here knows any system's column names.

Sources:

* seed 001 (WA3C), eqs. 1-9: ``R = w1 R_QoS + w2 R_E + w3 R_P + w4 R_F + w5 R_D`` with weights
  0.25 / 0.2 / 0.25 / 0.15 / 0.15, the power model ``(W_base + U ι (W_max - W_base)) τ``.
* seed 002 (ERLFC): room energy with the cooling ratio and the air/liquid switching cost, emissions
  ``ER · energy``, the reward relative to a Round-Robin reference.
* seed 000 (PFRL-DM), eqs. 3-9: response time, load balance, ``ρ R_res + (1-ρ) R_Load``, the
  penalty for a rejected placement.
* seed 003 (MA-FL): named modes (energy-saver, burst-absorber, cost-cap) that change the weights and
  the shield's SLO guard margin (10-15 %).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any, Literal

import numpy as np

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import RewardFn, TwinSpec

Array = np.ndarray
J_PER_KWH = 3.6e6

# ------------------------------------------------------------------------------ seed 001 (WA3C)


def job_latency(wait_s: Array, queue_s: Array, exec_s: Array) -> Array:
    """Eq. 3: ``L_j = T_wait + T_queue + T_exec`` (seconds, shape of the inputs)."""
    return np.asarray(wait_s, float) + np.asarray(queue_s, float) + np.asarray(exec_s, float)


def execution_time(work: Array, freq_ghz: float | Array, interference: float | Array = 0.2) -> Array:
    """``T_exec = C_j / (f (1 - θ_j))``: seconds for ``C_j`` giga-cycles at ``f`` GHz, θ = 0.2."""
    return np.asarray(work, float) / (np.asarray(freq_ghz, float) * (1.0 - np.asarray(interference, float)))


def qos_reward(latency_s: Array, latency_max_s: float | Array) -> Array:
    """Eq. 2: ``R_QoS = 1 - L_j / L_max`` (1 for instant service, <0 beyond the tolerable latency)."""
    return 1.0 - np.asarray(latency_s, float) / np.asarray(latency_max_s, float)


def performance_coefficient(cpi: Array, mapi: Array, z: float = 0.3) -> Array:
    """Eq. 6: ``ι = CPI z + MAPI (1 - z)`` with z = 0.3."""
    return np.asarray(cpi, float) * z + np.asarray(mapi, float) * (1.0 - z)


def power_w(u_cpu: Array, iota: float | Array = 1.0, w_base: float = 100.0, w_max: float = 200.0) -> Array:
    """The power part of eq. 5: ``W_base + U ι (W_max - W_base)`` in watts; ``U`` in [0, 1]."""
    return w_base + np.asarray(u_cpu, float) * np.asarray(iota, float) * (w_max - w_base)


def energy_j(
    u_cpu: Array,
    seconds: float | Array,
    iota: float | Array = 1.0,
    w_base: float = 100.0,
    w_max: float = 200.0,
) -> Array:
    """Eq. 5: ``E_j = (W_base + U ι (W_max - W_base)) τ`` in joules for ``τ`` seconds of execution."""
    return power_w(u_cpu, iota, w_base, w_max) * np.asarray(seconds, float)


def energy_reward(energy_norm: Array, alpha: float = 1.0) -> Array:
    """Eq. 4: ``R_E = -α E_j`` on a normalised energy (the caller divides by a reference)."""
    return -alpha * np.asarray(energy_norm, float)


def priority_reward(priority: Array, latency_norm: Array) -> Array:
    """Eq. 7: ``R_P = P_j (1 - L_j)`` with ``P_j`` in [0, 1] and the latency normalised by ``L_max``."""
    return np.asarray(priority, float) * (1.0 - np.asarray(latency_norm, float))


def fairness_reward(utilisation: Array, lam: float = 1.0) -> float:
    """Eq. 8: ``R_F = -λ σ²(U)``, the variance of the utilisation across the active jobs (a scalar)."""
    u = np.asarray(utilisation, float)
    return 0.0 if u.size == 0 else float(-lam * np.var(u))


def dismissal_reward(dismissed: Array, mu: float = 0.5) -> Array:
    """Eq. 9: ``R_D = -μ D_t``, μ = 0.5, ``D_t`` the number of jobs dismissed at t."""
    return -mu * np.asarray(dismissed, float)


def jain_index(x: Array) -> float:
    """Jain's fairness index ``(Σx)² / (n Σx²)`` in ``[1/n, 1]``; 1 when all equal (and for all-zero)."""
    x = np.asarray(x, float).ravel()
    if x.size == 0:
        return 1.0
    sq = float(np.sum(x * x))
    return 1.0 if sq == 0.0 else float(np.sum(x) ** 2 / (x.size * sq))


# ----------------------------------------------------------------------------- seed 002 (ERLFC)

Cooling = Literal["air", "liquid"]


def cooling_switch(
    busy_servers: int,
    p_peak_w: float,
    p_air_peak_w: float,
    current: Cooling,
    air_start_j: float,
    liquid_start_j: float,
) -> tuple[float, Cooling]:
    """``P_ctStart``: the start-up energy of switching a room's cooling, and the mode after it.

    Liquid cooling is switched to air when the room's IT power ``busy * P_peak`` falls below the
    air-cooling peak, and air to liquid when it exceeds it; otherwise nothing changes (0 J).
    """
    it_power = busy_servers * p_peak_w
    if it_power < p_air_peak_w and current == "liquid":
        return float(air_start_j), "air"
    if it_power > p_air_peak_w and current == "air":
        return float(liquid_start_j), "liquid"
    return 0.0, current


def room_energy_j(
    exe_time_s: Array,
    idle_time_s: Array,
    p_peak_w: float,
    p_idle_w: float,
    cooling_ratio: float,
    start_j: float = 0.0,
) -> float:
    """``TE_i = Σ_k (exe_k P_peak + idle_k P_idle)(1 + cr) + P_ctStart`` in joules for one room.

    Args:
        exe_time_s, idle_time_s: (n_servers,) seconds each server computed / stood by.
        cooling_ratio: ``cr``, cooling energy per joule of IT energy (air and liquid differ).
        start_j: the cooling switch energy from :func:`cooling_switch`.
    """
    it = np.sum(np.asarray(exe_time_s, float) * p_peak_w + np.asarray(idle_time_s, float) * p_idle_w)
    return float(it * (1.0 + cooling_ratio) + start_j)


def emissions_g(energy_joules: Array, carbon_g_per_kwh: float | Array) -> Array:
    """``TEM = ER · TEN``: grams of CO2-eq for an energy in joules at an intensity in gCO2/kWh."""
    return np.asarray(energy_joules, float) / J_PER_KWH * np.asarray(carbon_g_per_kwh, float)


def erlfc_reward(
    energy_ref: float, energy: float, emissions_ref: float, emissions: float, gain: float = 1.0
) -> float:
    """The terminal ERLFC reward: relative energy + relative emission savings vs a reference
    (Round-Robin) schedule, times the amplification ``ϑ``; positive when better than the reference."""
    return float(((energy_ref - energy) / energy_ref + (emissions_ref - emissions) / emissions_ref) * gain)


# -------------------------------------------------------------------------- seed 000 (PFRL-DM)


def response_time(run_s: Array, wait_s: Array) -> Array:
    """Eq. 3: ``j_res = j_run + j_wait`` (seconds)."""
    return np.asarray(run_s, float) + np.asarray(wait_s, float)


def load_balance(loads: Array, weights: Array | None = None) -> float:
    """Eqs. 4-5: ``Σ_i w_i sqrt(mean_m (load_{m,i} - AvgLoad_i)²)``; 0 is perfectly balanced.

    Args:
        loads: (M, d) load of each of M machines in each of d resource types, in [0, 1].
        weights: (d,) importance of each resource type; default equal weights summing to 1.
    """
    loads = np.atleast_2d(np.asarray(loads, float))
    d = loads.shape[1]
    w = np.full(d, 1.0 / d) if weights is None else np.asarray(weights, float)
    return float(np.sum(w * np.std(loads, axis=0)))  # np.std is the population std of eq. 4


def response_reward(run_s: Array, res_s: Array) -> Array:
    """Eq. 7: ``R_res = exp(j_run / j_res)``: e when there is no waiting, falling towards 1."""
    return np.exp(np.asarray(run_s, float) / np.asarray(res_s, float))


def load_reward(load_balance_before: float, load_balance_after: float) -> float:
    """Eq. 8 as printed: ``Load_c = LoadBal(t') - LoadBal(t)``; 1 if ``Load_c <= 0`` else ``Load_c``."""
    change = load_balance_after - load_balance_before
    return 1.0 if change <= 0 else float(change)


def rejection_penalty(machine_util: Array, weights: Array | None = None) -> float:
    """Eq. 9: ``R_p = -exp(Σ_i w_i util_{a,i})`` for a placement the chosen machine cannot hold."""
    u = np.asarray(machine_util, float).ravel()
    w = np.full(u.size, 1.0 / u.size) if weights is None else np.asarray(weights, float)
    return float(-np.exp(np.sum(w * u)))


def pfrl_reward(r_res: Array, r_load: Array, rho: float = 0.5) -> Array:
    """Eq. 6: ``R_a = ρ R_res + (1 - ρ) R_Load``."""
    return rho * np.asarray(r_res, float) + (1.0 - rho) * np.asarray(r_load, float)


# ----------------------------------------------------------------- multi-objective reward + modes


@dataclass(frozen=True)
class RewardWeights:
    """Scalarisation weights of :class:`MultiObjectiveReward`; WA3C's by default (sum 1)."""

    qos: float = 0.25
    energy: float = 0.2
    priority: float = 0.25
    fairness: float = 0.15
    dismissal: float = 0.15
    carbon: float = 0.0
    cost: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


@dataclass(frozen=True)
class RewardMode:
    """A named operating mode (seed 003): scalarisation weights plus the shield's SLO guard margin."""

    name: str
    weights: RewardWeights
    slo_margin: float
    description: str


#: seed 003 names the modes but gives no numbers: the weights below are ours, chosen so that each
#: mode moves weight towards its objective and still sums to 1; margins stay in the paper's 10-15 %.
MODES: dict[str, RewardMode] = {
    "balanced": RewardMode("balanced", RewardWeights(), 0.10, "WA3C's weights (seed 001)"),
    "energy-saver": RewardMode(
        "energy-saver",
        RewardWeights(qos=0.15, energy=0.35, priority=0.15, fairness=0.10, dismissal=0.10, carbon=0.15),
        0.10,
        "energy and carbon first; the SLO guard at its lower margin",
    ),
    "burst-absorber": RewardMode(
        "burst-absorber",
        RewardWeights(qos=0.30, energy=0.05, priority=0.25, fairness=0.10, dismissal=0.30),
        0.15,
        "latency and no dismissals under bursts; the SLO guard at its upper margin",
    ),
    "cost-cap": RewardMode(
        "cost-cap",
        RewardWeights(qos=0.20, energy=0.15, priority=0.15, fairness=0.10, dismissal=0.10, cost=0.30),
        0.10,
        "spend per step penalised most",
    ),
}


@dataclass(frozen=True)
class RewardColumns:
    """Where :class:`MultiObjectiveReward` finds each quantity among a step's columns.

    Every field is a column name of the spec, a constant, or None (that component is 0). Units:
    latency and ``busy_s`` in seconds, energy in J, carbon intensity in gCO2/kWh (or ``carbon_g``:
    grams logged directly), cost in money units; ``priority``, ``cpu_util`` and ``utilisation`` in [0, 1] (``priority_max`` rescales).

    Energy comes from ``energy`` when a column holds it, else from the power model of seed 001
    eq. 5 on ``cpu_util`` and ``busy_s`` (``w_base``/``w_max`` watts, ``iota``).
    ``latency_ratio_cap`` caps ``L / L_max`` (None: eq. 2 as printed, unbounded below), so that a
    heavy-tailed latency cannot drown the other objectives.
    """

    latency: str | None = None
    latency_max: str | float | None = None
    latency_ratio_cap: float | None = None
    energy: str | None = None
    cpu_util: str | None = None
    busy_s: str | float | None = None
    iota: float = 1.0
    w_base: float = 100.0
    w_max: float = 200.0
    energy_scale_j: float = 1.0
    priority: str | None = None
    priority_max: float = 1.0
    utilisation: str | None = None
    dismissed: str | None = None
    carbon_intensity: str | float | None = None
    carbon_g: str | None = None
    carbon_scale_g: float = 1.0
    cost: str | None = None
    cost_scale: float = 1.0

    def referenced(self) -> list[str]:
        """The column names this mapping reads."""
        return [v for f in fields(self) if isinstance(v := getattr(self, f.name), str)]

    def check(self, spec: TwinSpec) -> None:
        """Raise `InputError` naming the field whose column is not a feature of ``spec``."""
        names = {f.name for f in spec.features}
        for f in fields(self):
            v = getattr(self, f.name)
            if isinstance(v, str) and v not in names:
                raise InputError(
                    f"reward column {f.name}={v!r} is not a feature of spec {spec.name!r}", "reward"
                )


@dataclass
class MultiObjectiveReward:
    """``R = Σ_k w_k R_k`` over QoS, energy, priority, fairness, dismissal (seed 001 eq. 1), plus
    carbon and cost; callable as a `RewardFn` on ``{column: (N,) array}`` -> ``(N,)``.

    Args:
        columns: where each quantity is (see :class:`RewardColumns`).
        weights: scalarisation weights; ``mode`` picks them by name instead.
        mode: one of :data:`MODES` (``balanced`` = WA3C, ``energy-saver``, ``burst-absorber``, ``cost-cap``).
        alpha, lam, mu: the energy, fairness and dismissal scales of eqs. 4, 8, 9.
    """

    columns: RewardColumns
    weights: RewardWeights | None = None
    mode: str | None = None
    alpha: float = 1.0
    lam: float = 1.0
    mu: float = 0.5
    _w: RewardWeights = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.weights is not None and self.mode is not None:
            raise InputError("give reward weights or a mode, not both", "reward")
        if self.mode is not None:
            if self.mode not in MODES:
                raise InputError(
                    f"unknown reward mode {self.mode!r}; expected one of {sorted(MODES)}", "--mode"
                )
            self._w = MODES[self.mode].weights
        else:
            self._w = self.weights or RewardWeights()

    @property
    def effective_weights(self) -> RewardWeights:
        return self._w

    def components(self, cols: Mapping[str, Array]) -> dict[str, Array]:
        """Each unweighted component as an (N,) array (a missing input gives zeros)."""
        n = len(next(iter(cols.values())))
        c = self.columns
        zeros = np.zeros(n)

        def col(v: str | float) -> Array:
            if isinstance(v, str):
                if v not in cols:
                    raise InputError(f"reward needs column {v!r}, which this step does not have", "reward")
                return np.asarray(cols[v], float)
            return np.full(n, float(v))

        def get(v: str | float | None) -> Array | None:
            return None if v is None else col(v)

        out: dict[str, Array] = {}
        lat, lat_max = get(c.latency), get(c.latency_max)
        lat_norm = None if lat is None or lat_max is None else lat / lat_max
        if lat_norm is not None and c.latency_ratio_cap is not None:
            lat_norm = np.minimum(lat_norm, c.latency_ratio_cap)
        out["qos"] = zeros if lat_norm is None else 1.0 - lat_norm

        e = get(c.energy)
        if e is None and c.cpu_util is not None and c.busy_s is not None:
            e = energy_j(col(c.cpu_util), col(c.busy_s), c.iota, c.w_base, c.w_max)
        out["energy"] = zeros if e is None else energy_reward(e / c.energy_scale_j, self.alpha)

        prio = get(c.priority)
        out["priority"] = (
            zeros if prio is None or lat_norm is None else priority_reward(prio / c.priority_max, lat_norm)
        )
        util = get(c.utilisation)
        out["fairness"] = zeros if util is None else np.full(n, fairness_reward(util, self.lam))
        dis = get(c.dismissed)
        out["dismissal"] = zeros if dis is None else dismissal_reward(dis, self.mu)
        ci, grams = get(c.carbon_intensity), get(c.carbon_g)
        if grams is None and ci is not None and e is not None:
            grams = emissions_g(e, ci)
        out["carbon"] = zeros if grams is None else -grams / c.carbon_scale_g
        cost = get(c.cost)
        out["cost"] = zeros if cost is None else -cost / c.cost_scale
        return out

    def __call__(self, cols: Mapping[str, Array]) -> Array:
        comps = self.components(cols)
        w = self._w.as_dict()
        return sum((w[k] * v for k, v in comps.items()), np.zeros(len(comps["qos"])))


# ---------------------------------------------------------------------------------- registry

RewardFactory = Callable[..., RewardFn]
_REGISTRY: dict[str, RewardFactory] = {}


def register_reward(name: str, factory: RewardFactory) -> None:
    """Make ``make_reward(name, ...)`` call ``factory(columns=..., spec=..., **kwargs)``."""
    _REGISTRY[name] = factory


def available_rewards() -> list[str]:
    return sorted({"spec", "wa3c", *MODES, *_REGISTRY})


def make_reward(
    name: str,
    columns: RewardColumns | Mapping[str, Any] | None = None,
    spec: TwinSpec | None = None,
    **kwargs: Any,
) -> RewardFn:
    """A reward function by name.

    Args:
        name: ``"spec"`` (the reward the twin spec names), ``"wa3c"`` or a mode of :data:`MODES`
            (a :class:`MultiObjectiveReward`), a name given to :func:`register_reward`, or
            ``"module:function"`` (a user's own `RewardFn`).
        columns: the :class:`RewardColumns` (or a dict of its fields) for the built-in rewards.
        spec: checks that the columns exist; needed for ``"spec"``.
        kwargs: passed to :class:`MultiObjectiveReward` or the registered factory.
    """
    if isinstance(columns, Mapping):
        unknown = set(columns) - {f.name for f in fields(RewardColumns)}
        if unknown:
            raise InputError(f"unknown reward column fields {sorted(unknown)}", "reward")
        columns = RewardColumns(**columns)
    if name == "spec":
        if spec is None:
            raise InputError("reward 'spec' needs the twin spec", "reward")
        return spec.reward_fn()
    if name in ("wa3c", *MODES):
        if columns is None:
            raise InputError(f"reward {name!r} needs RewardColumns naming its inputs", "reward")
        if spec is not None:
            columns.check(spec)
        return MultiObjectiveReward(columns, mode="balanced" if name == "wa3c" else name, **kwargs)
    if name in _REGISTRY:
        return _REGISTRY[name](columns=columns, spec=spec, **kwargs)
    if ":" in name:
        module, _, attr = name.partition(":")
        try:
            fn = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as e:
            raise InputError(f"reward {name!r} cannot be imported ({e})", "reward") from None
        if not callable(fn):
            raise InputError(f"reward {name!r} is not callable", "reward")
        return fn
    raise InputError(
        f"unknown reward {name!r}; expected one of {available_rewards()} or module:function", "reward"
    )


def with_mode(reward: MultiObjectiveReward, mode: str) -> MultiObjectiveReward:
    """The same reward with another mode's weights (modes switch online in seed 003)."""
    return replace(reward, weights=None, mode=mode)
