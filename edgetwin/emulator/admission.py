"""A second system: tenants' requests behind an admission controller, on gateways that share their
capacity with traffic the logs do not show.

The emulated cluster (`edgetwin.emulator.cluster`) is the system edgetwin's models were developed
on; a claim that a twin is "not fooled by the scheduler that wrote its logs" needs a system whose
code, columns and dynamics those models were not tuned on. This one is small, vectorised and
different in kind: no placement, no energy; a fluid request queue per gateway.

**Agents** are tenants (scenario ``interactive`` or ``batch``) on ``n_sites`` gateways. A tenant's
profile: its base request rate (req/s), the work of one request (ms of one core), its latency SLO
(ms) and its patience (the share of rejected requests it retries on the next tick); the gateway's
cores are a site-scoped profile column.

**A tick** (``86400 / steps`` s; an episode is a day):

1. the tenant *sends* (its response, req/s): base rate x diurnal curve x engagement + retries of
   last tick's rejections; engagement drops when last tick's latency exceeded its SLO (users leave);
2. the platform's **actions** per tenant: ``action.admit`` (share of the sent requests admitted, the
   rest rejected) and ``action.premium`` (share of the admitted ones served on an elastic premium
   pool: fast, but paid for);
3. the gateway serves the standard requests of all its tenants, plus the backlog, with its cores
   *minus a hidden background load* ``b`` (other traffic, noisy neighbours: an AR(1) process of
   the share of capacity it takes, not in the log); its utilisation ``rho = (backlog + arrivals) /
   capacity`` sets the standard latency (``work / (1 - rho)``, and half a tick per unit of overflow
   beyond 1), and what it cannot serve stays as backlog (``state.site_queue``, site-scoped);
4. KPIs: goodput (requests served within their SLO, as a share of those sent), latency, the premium
   cost (premium requests as a share of the base rate); reward = goodput - 0.4 x cost.

**The logging controller** (`ForecastAdmission`, production's policy) sees a forecast of the hidden
load (the load plus a little noise: what an operator's capacity dashboard shows and the logs do not
keep) and tightens admission and buys premium capacity for tight-SLO tenants when it is high. So in
its logs low admission goes with high latency, and premium with slow standard service: the
scheduler's habits, confounded with a state the twin cannot see. Policies that act on the logged
observation (`reference_policies`) are what a twin can be asked about; their truth is their mean
reward when run here (`evaluate`).

Shapes: ``n`` tenants, observation ``(n, 8)`` = ``[profile.rate, profile.work_ms, profile.slo_ms,
profile.patience, profile.site_cores, state.latency_ms, state.rejected, state.site_queue,
state.day_fraction]`` (9 columns; `admission_spec` order), actions ``(n, 2)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from edgetwin.contract.errors import InputError
from edgetwin.contract.policy import FunctionPolicy, PlatformPolicy, RandomPolicy, RegimePolicy
from edgetwin.contract.spec import Feature, TwinSpec
from edgetwin.emulator.logs import Regime, check_regimes, log_system

__all__ = [
    "ADMISSION_SCENARIOS",
    "AdmissionConfig",
    "AdmissionSystem",
    "ForecastAdmission",
    "admission_spec",
    "benchmark_regimes",
    "evaluate",
    "generate_admission_logs",
    "make_admission_policy",
    "reference_policies",
]

ADMISSION_SCENARIOS: tuple[str, ...] = ("interactive", "batch")
#: per scenario: (median req/s, log-sd), (median work ms, log-sd), SLO ms, patience beta (a, b), share
_TENANTS: dict[str, dict[str, Any]] = {
    "interactive": {"rate": (40.0, 0.5), "work": (20.0, 0.4), "slo": 300.0, "patience": (4.0, 2.0), "share": 0.6},
    "batch": {"rate": (8.0, 0.6), "work": (250.0, 0.5), "slo": 5000.0, "patience": (2.0, 4.0), "share": 0.4},
}
#: reward weight of the premium cost
COST_WEIGHT = 0.4
MAX_LATENCY_MS = 600_000.0


@dataclass(frozen=True)
class AdmissionConfig:
    """The system's size and its hidden load.

    Attributes:
        n_tenants: tenants per episode (a fresh population each episode).
        n_sites: gateways.
        steps: ticks per episode (a day).
        target_util: a gateway's cores are sized so that its tenants' mean offered work is this
            share of them (before the hidden load takes its part).
        hidden_mean: mean share of a gateway's capacity taken by the hidden load.
        hidden_persistence: per-tick AR(1) coefficient of the hidden load (in log-odds), scaled to
            a 15-minute tick.
        hidden_sd: stationary sd of the hidden load's log-odds.
        forecast_sd: sd of the logging controller's forecast error of the hidden load (a share).
    """

    n_tenants: int = 60
    n_sites: int = 4
    steps: int = 48
    target_util: float = 0.55
    hidden_mean: float = 0.3
    hidden_persistence: float = 0.9
    hidden_sd: float = 0.8
    forecast_sd: float = 0.05

    def __post_init__(self) -> None:
        if self.n_tenants < self.n_sites or self.n_sites < 1 or self.steps < 2:
            raise InputError(
                f"need n_sites >= 1, n_tenants >= n_sites, steps >= 2; got {self.n_tenants}, {self.n_sites}, {self.steps}",
                "AdmissionConfig",
            )
        if not (0 < self.target_util < 2 and 0 < self.hidden_mean < 1 and 0 <= self.hidden_persistence < 1
                and self.hidden_sd >= 0 and self.forecast_sd >= 0):
            raise InputError("need 0 < target_util < 2, 0 < hidden_mean < 1, 0 <= persistence < 1, sds >= 0",
                             "AdmissionConfig")

    @property
    def tick_seconds(self) -> float:
        return 86_400.0 / self.steps


def admission_spec(config: AdmissionConfig | None = None) -> TwinSpec:
    """The log contract's spec of this system (columns, kinds, bounds, scopes, reward weights)."""
    c = config or AdmissionConfig()
    feats = (
        Feature("profile.rate", "heavy_tailed", 0.1, 2000.0, unit="req/s"),
        Feature("profile.work_ms", "heavy_tailed", 1.0, 5000.0, unit="ms of one core per request"),
        Feature("profile.slo_ms", "discrete", values=(300.0, 5000.0), unit="ms"),
        Feature("profile.patience", "continuous", 0.0, 1.0, unit="share of rejections retried"),
        Feature("profile.site_cores", "heavy_tailed", 1.0, 1e6, unit="cores", scope="site"),
        Feature("state.latency_ms", "heavy_tailed", 0.0, MAX_LATENCY_MS, unit="ms, last tick"),
        Feature("state.rejected", "heavy_tailed", 0.0, 1e5, unit="req/s rejected last tick"),
        Feature("state.site_queue", "continuous", 0.0, 2.0, unit="backlog / one tick of the cores", scope="site"),
        Feature("state.day_fraction", "continuous", 0.0, 1.0 - 1.0 / c.steps),
        Feature("action.admit", "continuous", 0.0, 1.0),
        Feature("action.premium", "continuous", 0.0, 1.0),
        Feature("response.sent", "heavy_tailed", 0.0, 1e5, unit="req/s"),
        Feature("kpi.goodput", "continuous", 0.0, 1.0, unit="share of sent requests served within SLO"),
        Feature("kpi.latency_ms", "heavy_tailed", 0.0, MAX_LATENCY_MS),
        Feature("kpi.premium_cost", "continuous", 0.0, 10.0, unit="premium requests / base requests"),
    )
    return TwinSpec(
        feats, name="admission-control", step_seconds=c.tick_seconds,
        reward_weights={"kpi.goodput": 1.0, "kpi.premium_cost": -COST_WEIGHT}, scenarios=ADMISSION_SCENARIOS,
    )  # fmt: skip


def _logistic(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(x, -30.0, 30.0)))


class AdmissionSystem:
    """The system (see the module docstring), vectorised over tenants; a `LoggedSystem`.

    After `reset`: ``profile (n, 5)``, ``site (n,)`` gateway index, ``hidden (n_sites,)`` the
    hidden load's share of each gateway's capacity at the current tick.
    """

    def __init__(self, config: AdmissionConfig | None = None) -> None:
        self.config = c = config or AdmissionConfig()
        self.spec = admission_spec(c)
        self.n, self.steps = int(c.n_tenants), int(c.steps)
        self.rng = np.random.default_rng(0)
        self._forecast_rng = np.random.default_rng(1)
        self._episode = 0

    # --- episode --------------------------------------------------------------------------------
    def reset(self, seed: int, episode: int = 0) -> np.ndarray:
        c = self.config
        self.rng = rng = np.random.default_rng(seed)
        # the dashboard's forecast errors: a stream of their own, so that a policy that reads them
        # does not change the system's own draws (every policy meets the same days)
        self._forecast_rng = np.random.default_rng([seed, 1])
        self._episode = int(episode)
        n = self.n
        names = list(_TENANTS)
        shares = np.array([_TENANTS[s]["share"] for s in names])
        self.scenario = rng.choice(len(names), size=n, p=shares / shares.sum())
        self.site = np.arange(n) % c.n_sites
        rng.shuffle(self.site)
        rate, work, slo, patience = (np.empty(n) for _ in range(4))
        for k, s in enumerate(names):
            m = self.scenario == k
            t = _TENANTS[s]
            rate[m] = t["rate"][0] * np.exp(t["rate"][1] * rng.standard_normal(m.sum()))
            work[m] = t["work"][0] * np.exp(t["work"][1] * rng.standard_normal(m.sum()))
            slo[m] = t["slo"]
            pa, pb = t["patience"]
            patience[m] = rng.beta(float(pa), float(pb), size=int(m.sum()))
        rate, work = np.clip(rate, 0.1, 2000.0), np.clip(work, 1.0, 5000.0)
        offered = np.bincount(self.site, rate * work / 1000.0, minlength=c.n_sites)  # busy cores, mean
        self.cores = np.maximum(1.0, np.round(offered / c.target_util))
        self.profile = np.stack([rate, work, slo, patience, self.cores[self.site]], axis=1)
        # hidden load: AR(1) in log-odds, started from its stationary distribution
        self._phi = c.hidden_persistence ** (c.tick_seconds / 900.0)
        self._z = c.hidden_sd * rng.standard_normal(c.n_sites)
        self.latency = work.copy()
        self.rejected = np.zeros(n)
        self.queue = np.zeros(c.n_sites)  # backlog, core-seconds
        self.t = 0
        self.agent_ids = np.array([f"tn{episode}-{i:04d}" for i in range(n)], dtype=object)
        return self.observation()

    def keys(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        scen = np.array(ADMISSION_SCENARIOS, dtype=object)[self.scenario]
        sites = np.array([f"gw-{s}" for s in range(self.config.n_sites)], dtype=object)[self.site]
        return self.agent_ids, scen, sites

    @property
    def hidden(self) -> np.ndarray:
        """(n_sites,) the share of each gateway's capacity the unlogged traffic takes now."""
        base = np.log(self.config.hidden_mean / (1.0 - self.config.hidden_mean))
        return np.asarray(_logistic(base + self._z))

    def forecast(self) -> np.ndarray:
        """(n,) what the operator's dashboard shows of the hidden load at each tenant's gateway."""
        f = self.hidden + self.config.forecast_sd * self._forecast_rng.standard_normal(self.config.n_sites)
        return np.clip(f, 0.0, 1.0)[self.site]

    def capacity_cs(self) -> np.ndarray:
        """(n_sites,) core-seconds of one tick."""
        return self.cores * self.config.tick_seconds

    def observation(self) -> np.ndarray:
        q = self.queue / self.capacity_cs()
        return np.column_stack([
            self.profile, self.latency, self.rejected, np.minimum(q, 2.0)[self.site],
            np.full(self.n, self.t / self.steps),
        ])  # fmt: skip

    def diurnal(self, t: int) -> float:
        """The demand's daily curve: 0.6 at night to 1.4 in the afternoon."""
        return float(1.0 + 0.4 * np.sin(2.0 * np.pi * (t / self.steps - 0.3)))

    # --- one tick -------------------------------------------------------------------------------
    def step(self, actions: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Apply ``actions (n, 2)`` (clipped to [0, 1]); returns ``(actions as applied, next obs,
        reward (n,), responses (n, 1), kpis (n, 3))``."""
        c = self.config
        a = np.asarray(actions, np.float64)
        if a.shape != (self.n, 2) or not np.isfinite(a).all():
            raise InputError(f"expected finite actions of shape ({self.n}, 2), got {a.shape}", "AdmissionSystem.step")
        a = np.clip(a, 0.0, 1.0)
        admit, premium = a[:, 0], a[:, 1]
        rate, work, slo, patience = self.profile[:, 0], self.profile[:, 1], self.profile[:, 2], self.profile[:, 3]
        tick = c.tick_seconds
        # 1. the tenants send: engagement falls when last tick was late; rejections come back
        engage = np.clip(1.0 - 0.5 * np.maximum(0.0, self.latency / slo - 1.0), 0.3, 1.0)
        noise = np.exp(0.1 * self.rng.standard_normal(self.n))
        sent = rate * self.diurnal(self.t) * engage * noise + patience * self.rejected  # req/s
        # 2. admission and the premium pool
        admitted = admit * sent
        rejected = sent - admitted
        standard_work = (1.0 - premium) * admitted * work / 1000.0 * tick  # core-seconds this tick
        # 3. the gateway, less its hidden load
        cap = self.capacity_cs() * (1.0 - self.hidden)
        load = self.queue + np.bincount(self.site, standard_work, minlength=c.n_sites)
        rho = load / cap
        r = np.minimum(rho, 0.95)[self.site]
        overflow = np.maximum(rho - 1.0, 0.0)[self.site]
        lat_std = np.minimum(work / (1.0 - r) + 1000.0 * tick * overflow / 2.0, MAX_LATENCY_MS)
        lat_prem = 1.2 * work
        self.queue = np.minimum(np.maximum(load - cap, 0.0), 2.0 * self.capacity_cs())  # beyond: timed out
        # 4. outcomes
        meet = (1.0 - premium) * _logistic((slo - lat_std) / (0.25 * slo)) + premium * _logistic(
            (slo - lat_prem) / (0.25 * slo)
        )
        goodput = np.where(sent > 0, admitted * meet / np.maximum(sent, 1e-9), 0.0)
        latency = (1.0 - premium) * lat_std + premium * lat_prem
        cost = np.minimum(premium * admitted / rate, 10.0)
        reward = goodput - COST_WEIGHT * cost
        self.latency, self.rejected = latency, rejected
        # the hidden load moves on
        self._z = self._phi * self._z + c.hidden_sd * np.sqrt(1.0 - self._phi**2) * self.rng.standard_normal(c.n_sites)
        self.t += 1
        return a, self.observation(), reward, sent[:, None], np.column_stack([goodput, latency, cost])


# ------------------------------------------------------------------------------------- policies
def _cols(spec: TwinSpec, *names: str) -> list[int]:
    cols = spec.observation_columns
    missing = [c for c in names if c not in cols]
    if missing:
        raise InputError(f"the policy needs observation columns {missing}", "spec")
    return [cols.index(c) for c in names]


class ForecastAdmission:
    """Production's admission controller: it reads the hidden load's forecast from ``system`` (what
    the operator's dashboard shows, not in the log) and the logged backlog.

    Admit ``clip(1.6 (1 - forecast) - 0.3 backlog - 0.2, 0.2, 1)``; premium for tight-SLO tenants
    (SLO < 1 s) ``clip(2.5 (forecast - 0.25), 0, 1)``, none for the others.
    """

    def __init__(self, spec: TwinSpec, system: AdmissionSystem) -> None:
        self.system = system
        self._slo, self._q = _cols(spec, "profile.slo_ms", "state.site_queue")

    def act(self, obs: np.ndarray) -> np.ndarray:
        o = np.atleast_2d(obs)
        f = self.system.forecast()
        if len(f) != len(o):  # a subset of the tenants (a trial's arm): not this controller's case
            raise InputError("ForecastAdmission acts on the whole population of its system", "policy")
        admit = np.clip(1.6 * (1.0 - f) - 0.3 * o[:, self._q] - 0.2, 0.2, 1.0)
        tight = o[:, self._slo] < 1000.0
        premium = np.where(tight, np.clip(2.5 * (f - 0.25), 0.0, 1.0), 0.0)
        return np.stack([admit, premium], axis=1)


class ReactiveAdmission:
    """A controller on the logged state only: it reacts to its own tenants' lateness and the backlog.

    Admit ``clip(1.1 - 0.25 late - 0.5 backlog, 0.2, 1)`` with ``late = latency / SLO``; premium
    ``clip(late - 1, 0, 1)`` for tight-SLO tenants.
    """

    def __init__(self, spec: TwinSpec) -> None:
        self._lat, self._slo, self._q = _cols(spec, "state.latency_ms", "profile.slo_ms", "state.site_queue")

    def act(self, obs: np.ndarray) -> np.ndarray:
        o = np.atleast_2d(obs)
        late = o[:, self._lat] / o[:, self._slo]
        admit = np.clip(1.1 - 0.25 * late - 0.5 * o[:, self._q], 0.2, 1.0)
        premium = np.where(o[:, self._slo] < 1000.0, np.clip(late - 1.0, 0.0, 1.0), 0.0)
        return np.stack([admit, premium], axis=1)


def _constant(admit: float, premium: float) -> PlatformPolicy:
    return FunctionPolicy(lambda o: np.tile([admit, premium], (len(np.atleast_2d(o)), 1)), f"admit {admit}, premium {premium}")


def reference_policies(spec: TwinSpec) -> dict[str, PlatformPolicy]:
    """10 policies on the logged observation, none of which logs anything in `benchmark_regimes`."""
    slo, q, lat = _cols(spec, "profile.slo_ms", "state.site_queue", "state.latency_ms")

    def tight_premium(o: np.ndarray) -> np.ndarray:
        return np.stack([np.ones(len(o)), (o[:, slo] < 1000.0).astype(float)], axis=1)

    def queue_shed(o: np.ndarray) -> np.ndarray:
        return np.stack([np.clip(1.0 - 1.5 * o[:, q], 0.3, 1.0), np.zeros(len(o))], axis=1)

    def late_premium(o: np.ndarray) -> np.ndarray:
        late = o[:, lat] / o[:, slo]
        return np.stack([np.full(len(o), 0.9), np.clip(0.5 * late, 0.0, 1.0)], axis=1)

    return {
        "admit all": _constant(1.0, 0.0),
        "admit 0.8": _constant(0.8, 0.0),
        "admit 0.6": _constant(0.6, 0.0),
        "admit all, premium 0.5": _constant(1.0, 0.5),
        "admit 0.7, premium 0.3": _constant(0.7, 0.3),
        "admit 0.9, premium 0.1": _constant(0.9, 0.1),
        "admit all, premium for tight SLOs": FunctionPolicy(tight_premium, "tight premium"),
        "shed on backlog": FunctionPolicy(queue_shed, "queue shed"),
        "premium when late": FunctionPolicy(late_premium, "late premium"),
        "reactive (logged state only)": ReactiveAdmission(spec),
    }


def make_admission_policy(
    policy: str | PlatformPolicy, spec: TwinSpec, seed: int, system: AdmissionSystem
) -> PlatformPolicy:
    """``"controller"`` (`ForecastAdmission` on ``system``), ``"reactive"`` (`ReactiveAdmission`),
    ``"random"``, ``"regime_switching"`` (`RegimePolicy`), or a policy as given."""
    if not isinstance(policy, str):
        return policy
    if policy == "controller":
        return ForecastAdmission(spec, system)
    if policy == "reactive":
        return ReactiveAdmission(spec)
    if policy == "random":
        return RandomPolicy(spec, seed=seed)
    if policy == "regime_switching":
        return RegimePolicy(spec, seed=seed)
    raise InputError(f"unknown policy {policy!r}; expected controller, reactive, random or regime_switching", "policy")


def generate_admission_logs(
    config: AdmissionConfig | None = None,
    regimes: Sequence[Regime] | None = None,
    episodes: int | None = None,
    policy: str | PlatformPolicy = "controller",
    seed: int = 0,
    progress: bool = False,
) -> tuple[pd.DataFrame, TwinSpec]:
    """The system's log in the contract and its spec, under ``regimes`` (`edgetwin.emulator.logs.Regime`,
    policies named as in `make_admission_policy`) or one ``policy`` for ``episodes`` days.

    A trial's arms must act on the logged observation (``random``, ``regime_switching``,
    ``reactive`` or a policy): the controller needs the whole population.
    """
    system = AdmissionSystem(config)
    regimes = check_regimes(regimes, episodes, policy)

    def resolve(p: str | PlatformPolicy, spec: TwinSpec, s: int) -> PlatformPolicy:
        return make_admission_policy(p, spec, s, system)

    return log_system(system, regimes, seed, resolve, progress=progress)


def evaluate(
    policies: dict[str, PlatformPolicy], config: AdmissionConfig, days: int, seed: int
) -> dict[str, pd.DataFrame]:
    """The truth: each policy run on the system for ``days`` days (the same days for every policy,
    `generate_admission_logs` with seed ``seed``). Returns each policy's log."""
    return {name: generate_admission_logs(config, episodes=days, policy=pol, seed=seed)[0] for name, pol in policies.items()}


def benchmark_regimes(name: str, days: int, trial_share: float = 0.1) -> list[Regime]:
    """Logs ``a`` (the controller + 10 % noise, ``days`` days), ``b`` (2/3 of them the controller,
    then the reactive controller, both + 10 % noise) and ``c1``..``c3`` (``a`` plus 1-3 days on
    which ``trial_share`` of the tenants are assigned at random to uniform-random or
    regime-switching actions), as in issue 36 for the emulated cluster."""
    prod = Regime("controller", days, noise=0.1)
    if name == "a":
        return [prod]
    if name == "b":
        first = max(1, round(days * 2 / 3))
        return [Regime("controller", first, noise=0.1), Regime("reactive", max(1, days - first), noise=0.1)]
    if name in ("c1", "c2", "c3"):
        arms = {"arm-random": "random", "arm-regimes": "regime_switching"}
        return [prod, Regime("controller", int(name[1]), noise=0.1, arms=arms, arm_share=trial_share)]
    raise InputError(f"unknown logs {name!r}; expected a, b, c1, c2 or c3", "logs")
