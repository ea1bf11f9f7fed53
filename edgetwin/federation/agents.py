"""MA-FL agents (seed 003 §3.3, §4.2-4.4; seed 000 Algorithm 1): ESA, COA and GCA over a `Bus`.

Three roles, each an asyncio agent that only talks over the bus (in-process or NATS):

- `EdgeServiceAgent` (ESA, one per site): trains its `Learner` locally (dual-critic PPO on the
  site's twin or emulated-cluster VecEnv, or a tiny forecaster at scale), publishes *intents*
  (predicted backlog, tentative migrations) and its *model update* (the change of the federated
  parameters, compressed with `UpdateCodec`, durable over JetStream).
- `ClusterOrchestratorAgent` (COA, one per aggregation group below the root): aggregates its
  members' updates with the group's strategy (`HierarchyNode`: FedAvg, FedAvgM, attention, robust
  rules, ...), resolves conflicting intents with congestion prices (`resolve_intents`), publishes a
  summary and sends its group's model change upward.
- `GlobalCoordinationAgent` (GCA, the root): drives the rounds, aggregates globally, publishes
  policy versions.

One round ``r`` (every wait bounded)::

    GCA ── global_model v=r (durable) ──▶ COA ── global_model v=r (durable, personalised) ──▶ ESA
    GCA ── round_control open r ───────▶ COA ── round_control open r (participants) ────────▶ ESA
                                                                     ESA trains from model v=r
    GCA ◀── model_update (durable) ──── COA ◀── intent + model_update (durable, compressed) ── ESA
          (RoundCollector: k-of-n + grace, hard timeout)   (resolve intents, summary upward)

A round closes on its quorum plus a grace period or at its timeout (`RoundCollector`). An update
that arrives after its round closed (a straggler, or an ESA that restarted and finished the round
it was killed in) is kept and mixed into the next aggregation, discounted by its staleness
(`StalenessAware`). Messages are checked on receipt by the bus; updates from another run, of the
wrong size or of unknown senders are refused and counted here. Bytes on the wire are counted per
round and per level.

Nothing here imports torch or stable-baselines3 at module level: a subprocess agent with the tiny
forecaster starts quickly.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import math
import pickle
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

import numpy as np

from edgetwin.contract.errors import InputError
from edgetwin.edge.bus import Bus, Received, Subjects
from edgetwin.edge.messages import Envelope
from edgetwin.federation.aggregation import (
    AggregateResult,
    ClientUpdate,
    QuorumNotMet,
    RoundCollector,
)
from edgetwin.federation.compression import UpdateCodec, decode_update, model_update
from edgetwin.federation.hierarchy import HierarchyNode

if TYPE_CHECKING:
    from edgetwin.policies.dual_critic import DualCriticPolicy

__all__ = [
    "AggregatorAgent",
    "Attack",
    "ClusterOrchestratorAgent",
    "DampedErrorFeedbackCodec",
    "EdgeServiceAgent",
    "ForecastLearner",
    "GlobalCoordinationAgent",
    "IntentResolution",
    "Learner",
    "PPOLearner",
    "RoundRecord",
    "SiteSpec",
    "SiteTelemetry",
    "heterogeneous_sites",
    "make_learner",
    "resolve_intents",
]

log = logging.getLogger("edgetwin.agents")

# SB3 and torch draw from the process-global RNGs: learners that use them train one at a time and
# keep their own RNG state, so a run is reproducible whatever order the agents' rounds interleave.
_GLOBAL_RNG_LOCK = threading.Lock()


# ------------------------------------------------------------------------------ sites
#: Site archetypes (seed 000 Table 3: clients differ in workload and machines). Each is a scenario
#: mix (mbb video-heavy, iot, iov), a provisioning level and a drift (days of behaviour change).
SITE_ARCHETYPES: tuple[dict[str, Any], ...] = (
    {"scenario_weights": {"mbb": 0.8, "iot": 0.1, "iov": 0.1}, "target_util": 0.35, "drift": "0d"},
    {"scenario_weights": {"mbb": 0.1, "iot": 0.8, "iov": 0.1}, "target_util": 0.65, "drift": "1w"},
    {"scenario_weights": {"mbb": 0.1, "iot": 0.1, "iov": 0.8}, "target_util": 0.8, "drift": "1m"},
    {"scenario_weights": {"mbb": 0.34, "iot": 0.33, "iov": 0.33}, "target_util": 0.5, "drift": "1d"},
)


@dataclass
class SiteSpec:
    """One edge site of a federation: its name, its aggregation group and its local system.

    Attributes:
        name: the site (a subject token: no '.', '*', '>' or spaces).
        cluster: the aggregation group (COA) it belongs to.
        n_agents: service groups of its emulated cluster.
        steps: ticks per episode of its emulated cluster.
        step_seconds: simulated seconds per tick (``steps · step_seconds`` = one episode; 24 ×
            3600 s is a whole day at hourly decisions).
        target_util: how busy its edge sites are under random actions (provisioning level).
        scenario_weights: its scenario mix (None: the built-in mix).
        drift: ``"0d" | "1d" | "1w" | "1m"`` or days: how far its behaviour has drifted.
        trace: a real trace for task shapes and arrivals (path), or None.
        twin: a twin directory to train in instead of the emulated cluster (PPO learner only).
        seed: the site's own randomness (data, environment).
        reward_weights: what the site's operator optimises, as weights of ``response.*`` / ``kpi.*``
            columns (None: the emulated cluster's default, offload ratio − 0.5 SLO violations).
    """

    name: str
    cluster: str = "cluster-0"
    n_agents: int = 8
    steps: int = 24
    step_seconds: float = 900.0
    target_util: float = 0.45
    scenario_weights: dict[str, float] | None = None
    drift: str | float = "0d"
    trace: str | None = None
    twin: str | None = None
    seed: int = 0
    reward_weights: dict[str, float] | None = None

    def __post_init__(self) -> None:
        Subjects._tok(self.name, "site name")
        Subjects._tok(self.cluster, f"cluster of site {self.name}")

    def cluster_config(self, n_agents: int | None = None, steps: int | None = None) -> Any:
        """The `ClusterConfig` of this site's emulated system."""
        from edgetwin.emulator.cluster import ClusterConfig

        return ClusterConfig(
            n_agents=int(n_agents or self.n_agents),
            steps=int(steps or self.steps),
            step_seconds=float(self.step_seconds),
            drift=self.drift,
            trace=self.trace,
            target_util=float(self.target_util),
            scenario_weights=self.scenario_weights,
            reward_weights=self.reward_weights,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "site") -> SiteSpec:
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(d) - known)
        if unknown:
            raise InputError(f"unknown keys {unknown}; known: {sorted(known)}", where=where)
        try:
            return cls(**d)
        except TypeError as e:
            raise InputError(str(e), where=where) from None


def heterogeneous_sites(
    n: int,
    clusters: int = 1,
    seed: int = 0,
    n_agents: int = 8,
    steps: int = 24,
    traces: Sequence[str] | None = None,
    step_seconds: float = 900.0,
) -> list[SiteSpec]:
    """``n`` sites cycling through `SITE_ARCHETYPES` (jittered), spread round-robin over clusters.

    Args:
        n: number of sites (ESAs).
        clusters: aggregation groups; site ``i`` goes to ``cluster-(i mod clusters)``.
        seed: jitter of the provisioning level and the sites' own seeds.
        n_agents, steps, step_seconds: size of each site's emulated cluster and its episode.
        traces: real traces assigned round-robin (None: the built-in distributions).
    """
    if n < 1 or clusters < 1 or clusters > n:
        raise InputError(
            f"need 1 <= clusters <= sites, got sites={n}, clusters={clusters}", where="--sites/--clusters"
        )
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        arch = SITE_ARCHETYPES[i % len(SITE_ARCHETYPES)]
        util = float(np.clip(arch["target_util"] + rng.uniform(-0.05, 0.05), 0.1, 0.9))
        out.append(
            SiteSpec(
                name=f"site-{i}",
                cluster=f"cluster-{i % clusters}",
                n_agents=n_agents,
                steps=steps,
                step_seconds=float(step_seconds),
                target_util=round(util, 3),
                scenario_weights=dict(arch["scenario_weights"]),
                drift=arch["drift"],
                trace=None if not traces else str(traces[i % len(traces)]),
                seed=int(rng.integers(0, 2**31 - 1)),
            )
        )
    return out


# ------------------------------------------------------------------------------ learners
@dataclass
class SiteTelemetry:
    """What an ESA knows about its site for intents.

    Attributes:
        util: edge utilisation now, in [0, 1].
        predicted_util: forecast utilisation a few ticks ahead.
        backlog_s: seconds of queued work now.
        vcpu: edge vCPU of the site.
    """

    util: float
    predicted_util: float
    backlog_s: float
    vcpu: float


@runtime_checkable
class Learner(Protocol):
    """The local learner of an ESA.

    ``get_params`` / ``set_params`` are the *federated* parameters as a flat float32 vector (D,);
    whatever else the learner holds (a local critic, personal heads, optimiser state, observation
    statistics) stays on the site.
    """

    num_samples: int

    def get_params(self) -> np.ndarray: ...

    def set_params(self, params: np.ndarray) -> None: ...

    def train(self) -> dict[str, float]:
        """One round of local training; returns metrics with at least ``"reward"``."""
        ...

    def telemetry(self) -> SiteTelemetry: ...

    def save(self, path: Path) -> None: ...

    def load(self, path: Path) -> None: ...


def _edge_view(cluster: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(util, backlog_s, reserved, cloud util) of each edge site of an `EdgeCluster` now."""
    e = cluster.edge_idx
    return (
        cluster.site_util[e],
        cluster.site_backlog_s[e],
        cluster.site_reserved[e],
        cluster.site_util[cluster.cloud_of[e]],
    )


def site_series(
    site: SiteSpec,
    episodes: int = 3,
    horizon: int = 2,
    steps: int = 48,
    step_seconds: float = 1800.0,
    seed: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """A site's forecasting data from its emulated cluster under the heuristic (logging) policy.

    One sample per (tick, edge site): features ``[sin h, cos h, u_t, u_{t-1}, u_{t-4},
    min(backlog_t / 600 s, 5), reserved_t, cloud u_t]`` (fixed physical scales, no local
    standardisation, so weights mean the same thing at every site); target ``u_{t+horizon}``.
    Each episode is one simulated day of ``steps`` ticks of ``step_seconds``.

    Returns:
        ``(X (M, 8) float32, y (M,) float32)``, episode after episode, in time order.
    """
    from dataclasses import replace

    from edgetwin.emulator.cluster import EdgeCluster, SLOAwarePolicy, episode_seed

    cluster = EdgeCluster(replace(site.cluster_config(steps=steps), step_seconds=float(step_seconds)))
    pol = SLOAwarePolicy(cluster.spec)
    xs, ys = [], []
    base = site.seed if seed is None else seed
    for ep in range(episodes):
        obs = cluster.reset(seed=episode_seed(base, ep))
        rows = []
        for _ in range(cluster.steps):
            util, backlog, reserved, cloud = _edge_view(cluster)
            rows.append((cluster.hour(), util.copy(), backlog.copy(), reserved.copy(), cloud.copy()))
            obs, _, done, _ = cluster.step(pol.act(obs))
        util_t = np.stack([r[1] for r in rows])  # (T, E)
        for t in range(4, len(rows) - horizon):
            h, u, b, res, c = rows[t]
            ang = 2 * np.pi * h / 24.0
            feats = np.stack(
                [
                    np.full_like(u, np.sin(ang)),
                    np.full_like(u, np.cos(ang)),
                    u,
                    util_t[t - 1],
                    util_t[t - 4],
                    np.minimum(b / 600.0, 5.0),
                    np.minimum(res, 3.0),
                    c,
                ],
                axis=1,
            )
            xs.append(feats)
            ys.append(util_t[t + horizon])
    return np.concatenate(xs).astype(np.float32), np.concatenate(ys).astype(np.float32)


class ForecastLearner:
    """A tiny federated workload forecaster (seed 003 §5.3: light predictors retrained on rolling windows).

    A one-hidden-layer MLP (torch) predicts the site's edge utilisation ``horizon`` ticks ahead from
    `site_series` features. Its reward is the forecast skill on the site's held-out last quarter,
    ``1 - MSE / Var(y)`` (R²; 0 = predicting the mean, 1 = perfect). Used where many ESAs must fit
    on two cores (scalability, robustness); every parameter is federated.

    Args:
        site: the site (its data comes from its emulated cluster).
        hidden: width of the hidden layer; D = 8·hidden + 2·hidden + 1.
        local_epochs: passes over the local training data per round.
        batch_size, lr: Adam minibatch size and learning rate.
        episodes, horizon, steps: see `site_series` (the last episode is the held-out day).
        model_seed: initial weights (the same at every site of a federation).
        data: precomputed ``(X, y)`` instead of simulating the site.
    """

    def __init__(
        self,
        site: SiteSpec,
        hidden: int = 32,
        local_epochs: int = 1,
        batch_size: int = 64,
        lr: float = 3e-3,
        episodes: int = 3,
        horizon: int = 2,
        steps: int = 48,
        model_seed: int = 0,
        data: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        import torch
        from torch import nn

        if hidden < 1 or local_epochs < 1 or batch_size < 1 or not lr > 0:
            raise InputError("hidden, local_epochs, batch_size must be >= 1 and lr > 0", where="learner")
        self.site = site
        if episodes < 2:
            raise InputError(
                f"episodes must be >= 2 (the last one is held out), got {episodes}", where="learner.episodes"
            )
        x, y = (
            data if data is not None else site_series(site, episodes=episodes, horizon=horizon, steps=steps)
        )
        # the last simulated day is held out: the skill is measured on a day the model never saw
        n_val = max(1, len(y) // episodes)
        self._x = torch.as_tensor(x[:-n_val])
        self._y = torch.as_tensor(y[:-n_val])
        self._xv = torch.as_tensor(x[-n_val:])
        self._yv = torch.as_tensor(y[-n_val:])
        self._var = float(self._yv.var(unbiased=False)) + 1e-6
        self.num_samples = int(len(self._y))
        self.local_epochs, self.batch_size = int(local_epochs), int(batch_size)
        self.last_obs = torch.as_tensor(x[-1:])
        with _GLOBAL_RNG_LOCK, torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(model_seed))
            self.net = nn.Sequential(nn.Linear(x.shape[1], hidden), nn.Tanh(), nn.Linear(hidden, 1))
        self.opt = torch.optim.Adam(self.net.parameters(), lr=lr)
        self.gen = torch.Generator().manual_seed(int(site.seed))
        from edgetwin.emulator.cluster import EdgeCluster

        cluster = EdgeCluster(site.cluster_config())
        self.vcpu = float(cluster.vcpu[cluster.edge_idx].sum())  # edge capacity, for intents

    def _params(self) -> list[Any]:
        return list(self.net.parameters())

    def get_params(self) -> np.ndarray:
        return np.concatenate([p.detach().numpy().ravel() for p in self._params()]).astype(np.float32)

    def set_params(self, params: np.ndarray) -> None:
        import torch

        v = np.asarray(params, dtype=np.float32)
        ps = self._params()
        if v.size != sum(p.numel() for p in ps):
            raise InputError(
                f"model has {sum(p.numel() for p in ps)} parameters, got {v.size}", where="set_params"
            )
        off = 0
        with torch.no_grad():
            for p in ps:
                p.copy_(torch.as_tensor(v[off : off + p.numel()]).view_as(p))
                off += p.numel()

    def evaluate(self) -> float:
        """Forecast skill (R²) on the held-out day."""
        import torch

        with torch.no_grad():
            mse = float(((self.net(self._xv).squeeze(1) - self._yv) ** 2).mean())
        return 1.0 - mse / self._var

    def train(self) -> dict[str, float]:
        import torch

        t0 = time.perf_counter()
        n = len(self._y)
        loss_sum, steps = 0.0, 0
        for _ in range(self.local_epochs):
            perm = torch.randperm(n, generator=self.gen)
            for i in range(0, n, self.batch_size):
                idx = perm[i : i + self.batch_size]
                loss = ((self.net(self._x[idx]).squeeze(1) - self._y[idx]) ** 2).mean()
                self.opt.zero_grad()
                loss.backward()
                self.opt.step()
                loss_sum += loss.item()
                steps += 1
        return {
            "reward": self.evaluate(),
            "train_mse": loss_sum / max(steps, 1),
            "train_s": time.perf_counter() - t0,
        }

    def telemetry(self) -> SiteTelemetry:
        import torch

        with torch.no_grad():
            pred = float(self.net(self.last_obs).squeeze())
        x = self.last_obs[0].numpy()
        return SiteTelemetry(
            util=float(x[2]),
            predicted_util=float(np.clip(pred, 0.0, 1.5)),
            backlog_s=float(x[5]) * 600.0,
            vcpu=self.vcpu,
        )

    def save(self, path: Path) -> None:
        import torch

        torch.save(
            {"net": self.net.state_dict(), "opt": self.opt.state_dict(), "gen": self.gen.get_state()}, path
        )

    def load(self, path: Path) -> None:
        import torch

        state = torch.load(path, weights_only=False)
        self.net.load_state_dict(state["net"])
        self.opt.load_state_dict(state["opt"])
        self.gen.set_state(state["gen"])


class _EpisodeRewards:
    """An SB3 callback collecting the returns of the episodes finished during one `learn` call."""

    def __init__(self) -> None:
        from stable_baselines3.common.callbacks import BaseCallback

        outer = self

        class _CB(BaseCallback):
            def _on_step(self) -> bool:
                for info in self.locals.get("infos", []):
                    ep = info.get("episode")
                    if ep is not None:
                        outer.returns.append(float(ep["r"]))
                return True

        self.returns: list[float] = []
        self.callback = _CB()


class SB3Learner:
    """What every PPO learner of an ESA shares: which parameters are federated, and local training.

    A subclass checks its arguments with `_check`, sets ``self.federate``, ``self.normalize`` (its
    `VecNormalize` or None), ``self.steps_per_round``, ``self.episode_group`` (sub-envs that make one
    site episode together), ``self.episodes`` and ``self.num_samples``, and calls `_build_model`, which
    builds ``self.model`` (SB3 `PPO` or `DualCriticPPO`) and ``self._rng`` (the site's own torch / numpy
    generator states, so that several learners in one process do not draw from each other's streams).

    ``federate``: ``"public_critic"`` (PFRL-DM: only the dual-critic's public critic), ``"policy"``
    (actor and critic(s): FedAvg as in seed 000's baseline), ``"trunk"`` (shared layers only,
    personal heads stay local: seed 003's adapters), ``"actor"`` or ``"none"`` (independent PPO).
    """

    FEDERATE = ("public_critic", "policy", "trunk", "actor", "none")

    model: Any
    normalize: Any
    federate: str
    steps_per_round: int
    episode_group: int
    _rng: tuple[Any, Any]

    @classmethod
    def _check(cls, algo: str, federate: str, episodes_per_round: int) -> None:
        if algo not in ("dual_critic_ppo", "ppo"):
            raise InputError(f"algo must be 'dual_critic_ppo' or 'ppo', got {algo!r}", where="learner.algo")
        if federate not in cls.FEDERATE:
            raise InputError(
                f"federate must be one of {cls.FEDERATE}, got {federate!r}", where="learner.federate"
            )
        if federate == "public_critic" and algo != "dual_critic_ppo":
            raise InputError(
                "federate='public_critic' needs algo='dual_critic_ppo'", where="learner.federate"
            )
        if episodes_per_round < 1:
            raise InputError(f"episodes_per_round must be >= 1, got {episodes_per_round}", where="learner")

    def _build_model(self, algo: str, venv: Any, n_steps: int, seed: int, site_seed: int, **ppo: Any) -> None:
        """``self.model`` on ``venv`` with initial weights from ``seed``; the site's streams from ``site_seed``."""
        import torch as th
        from stable_baselines3 import PPO

        from edgetwin.policies.dual_critic import DualCriticPPO
        from edgetwin.policies.train import quiet_logger

        cls = DualCriticPPO if algo == "dual_critic_ppo" else PPO
        with _GLOBAL_RNG_LOCK:
            saved = th.get_rng_state(), np.random.get_state()
            self.model = cls("MlpPolicy", venv, n_steps=n_steps, seed=int(seed), device="cpu", verbose=0, **ppo)
            self.model.set_logger(quiet_logger())
            # SB3 seeds the env with the model seed: give each site its own episodes back.
            venv.seed(int(site_seed))
            th.manual_seed(int(site_seed))
            np.random.seed(int(site_seed) % (2**32))
            self._rng = (th.get_rng_state(), np.random.get_state())
            th.set_rng_state(saved[0])
            np.random.set_state(saved[1])

    # --- federated parameters ----------------------------------------------------------------
    def _federated(self) -> dict[str, Any]:
        p = self.model.policy
        named = dict(p.named_parameters())
        if self.federate == "public_critic":
            return {k: v for k, v in named.items() if k.startswith("public_critic.")}
        if self.federate == "policy":
            return named
        if self.federate == "trunk":
            return {k: v for k, v in named.items() if k.startswith("mlp_extractor.")}
        if self.federate == "actor":
            return {
                k: v
                for k, v in named.items()
                if k.startswith(("mlp_extractor.policy_net", "action_net", "log_std"))
            }
        return {}

    def get_params(self) -> np.ndarray:
        ps = self._federated()
        if not ps:
            return np.zeros(0, np.float32)
        return np.concatenate([v.detach().cpu().numpy().ravel() for v in ps.values()]).astype(np.float32)

    def set_params(self, params: np.ndarray) -> None:
        import torch as th

        v = np.asarray(params, dtype=np.float32)
        ps = self._federated()
        size = sum(p.numel() for p in ps.values())
        if v.size != size:
            raise InputError(f"federated part has {size} parameters, got {v.size}", where="set_params")
        state, off = {}, 0
        for k, p in ps.items():
            state[k] = th.as_tensor(v[off : off + p.numel()]).view_as(p)
            off += p.numel()
        if self.federate == "public_critic":
            # Algorithm 1 lines 7-8: the local critic takes the old public critic, the public the new.
            policy = cast("DualCriticPolicy", self.model.policy)
            policy.load_public_critic({k[len("public_critic.") :]: t for k, t in state.items()})
            return
        with th.no_grad():
            for k, p in ps.items():
                p.copy_(state[k])

    # --- training ------------------------------------------------------------------------------
    @contextlib.contextmanager
    def sampling(self, seed: int) -> Iterator[None]:
        """Inside, sampled actions (``predict(..., deterministic=False)``) draw from a torch stream
        seeded with ``seed``: the same draws at every entry, and neither the site's training stream nor
        the process's is touched."""
        import torch as th

        with _GLOBAL_RNG_LOCK, th.random.fork_rng(devices=[]):
            th.manual_seed(int(seed))
            yield

    def train(self) -> dict[str, float]:
        import torch as th

        t0 = time.perf_counter()
        cb = _EpisodeRewards()
        with _GLOBAL_RNG_LOCK:
            saved = th.get_rng_state(), np.random.get_state()
            th.set_rng_state(self._rng[0])
            np.random.set_state(self._rng[1])
            try:
                self.model.learn(
                    self.steps_per_round, callback=cb.callback, reset_num_timesteps=False, progress_bar=False
                )
            finally:
                self._rng = (th.get_rng_state(), np.random.get_state())
                th.set_rng_state(saved[0])
                np.random.set_state(saved[1])
        # one site episode = `episode_group` sub-env episodes (all service groups of a tick): average them
        g = self.episode_group
        rets = np.asarray(cb.returns, dtype=np.float64)
        site_eps = [float(rets[i : i + g].mean()) for i in range(0, len(rets) - g + 1, g)]
        self.episodes += len(site_eps)
        self.last_returns = site_eps
        reward = float(np.mean(site_eps)) if site_eps else float("nan")
        out = {"reward": reward, "episodes": float(self.episodes), "train_s": time.perf_counter() - t0}
        alpha = getattr(self.model.policy, "alpha", None)
        if alpha is not None:
            out["alpha"] = float(alpha)
        return out

    def save(self, path: Path) -> None:

        self.model.save(path.with_suffix(".zip"))
        with path.with_suffix(".state").open("wb") as f:
            pickle.dump(
                {
                    "rng": (self._rng[0].numpy(), self._rng[1]),
                    "episodes": self.episodes,
                    "normalize": self.normalize,
                },
                f,
            )

    def load(self, path: Path) -> None:
        import torch as th

        self.model.set_parameters(str(path.with_suffix(".zip")), exact_match=False, device="cpu")
        with path.with_suffix(".state").open("rb") as f:
            st = pickle.load(f)
        self.episodes = int(st["episodes"])
        self._rng = (th.as_tensor(st["rng"][0]), st["rng"][1])
        if st.get("normalize") is not None and self.normalize is not None:
            self.normalize.obs_rms = st["normalize"].obs_rms
            self.normalize.ret_rms = st["normalize"].ret_rms


class PPOLearner(SB3Learner):
    """PPO on the site's own system; federates the dual-critic public critic or (parts of) the policy.

    The environment is the site's twin (``site.twin``) when given, else its emulated cluster
    (`EdgeClusterVecEnv`, one sub-env per service group), wrapped by
    `edgetwin.policies.train.build_env` (action rescaling, VecMonitor, VecNormalize — whose
    statistics stay local). Hyper-parameters follow seed 003 §5.3 (γ = 0.985, GAE λ = 0.95,
    clip 0.2, entropy 0.01).

    Args:
        site: the site.
        algo: ``"dual_critic_ppo"`` (seed 000) or ``"ppo"``.
        federate: which parameters are federated (`SB3Learner`).
        episodes_per_round: local training per round, in episodes of the site's system (one
            episode = ``steps`` ticks of all ``n_agents`` service groups).
        net_arch: hidden layers of actor and critics.
        model_seed: initial weights (the same at every site, so the federated part starts equal).
        learning_rate, n_epochs, batch_size: PPO's.
    """

    def __init__(
        self,
        site: SiteSpec,
        algo: str = "dual_critic_ppo",
        federate: str = "public_critic",
        episodes_per_round: int = 4,
        net_arch: Sequence[int] = (32, 32),
        model_seed: int = 0,
        learning_rate: float = 3e-4,
        n_epochs: int = 4,
        batch_size: int = 64,
    ) -> None:
        from edgetwin.policies.train import Algo, build_env, spec_of

        self._check(algo, federate, episodes_per_round)
        self.site, self.algo, self.federate = site, algo, federate
        if site.twin is not None:
            from edgetwin.twin.twin import Twin

            source: Any = Twin.load(site.twin)
            spec = source.spec
            twin_opts: dict[str, Any] = {"n_agents": site.n_agents, "steps": site.steps}
            self._cluster = None
        else:
            from edgetwin.emulator.cluster import EdgeClusterVecEnv

            source = EdgeClusterVecEnv(site.cluster_config(), seed=site.seed)
            spec = spec_of(source)
            twin_opts = {}
            self._cluster = source.cluster
        self.spec = spec
        self.chain = build_env(
            source, spec, cast(Algo, algo), seed=site.seed, normalize=True, gamma=0.985, **twin_opts
        )
        self.normalize = self.chain.normalize
        n_envs = self.chain.venv.num_envs
        self.episode_group = n_envs
        self.n_steps = int(site.steps)
        self.rollout_size = n_envs * self.n_steps
        self.steps_per_round = self.rollout_size * int(episodes_per_round)
        self._build_model(
            algo,
            self.chain.venv,
            self.n_steps,
            model_seed,
            site.seed,
            batch_size=min(batch_size, self.rollout_size),
            n_epochs=n_epochs,
            learning_rate=learning_rate,
            gamma=0.985,
            gae_lambda=0.95,
            clip_range=0.2,
            ent_coef=0.01,
            policy_kwargs={"net_arch": list(net_arch)},
        )
        self.num_samples = int(self.steps_per_round)
        self.episodes = 0
        self.last_returns: list[float] = []

    def platform_policy(self) -> Any:
        """A `PlatformPolicy` (``act(obs (N, O)) -> (N, A)`` in spec units) of the current policy."""
        return _SB3PlatformPolicy(self.model, self.chain.normalize, self.chain.transform)

    def telemetry(self) -> SiteTelemetry:
        c = self._cluster
        if c is None or not getattr(c, "_ready", False):
            return SiteTelemetry(0.0, 0.0, 0.0, 0.0)
        util, backlog, _, _ = _edge_view(c)
        vcpu = float(c.vcpu[c.edge_idx].sum())
        u = float(np.average(util, weights=c.vcpu[c.edge_idx]))
        # persistence forecast with the backlog's pressure: a queue keeps the site busy
        pred = min(1.5, u + float(backlog.mean()) / (c.dt + 1e-9))
        return SiteTelemetry(util=u, predicted_util=pred, backlog_s=float(backlog.mean()), vcpu=vcpu)


class SchedulerLearner(SB3Learner):
    """PPO on seed 000's task-scheduling MDP of one site (`edgetwin.emulator.vm_scheduling`).

    The same federation choices as `PPOLearner`; seed 000 §3.1's PPO settings (γ 0.99, clip 0.2,
    one hidden layer of 64 by default) with a reward-normalising `VecNormalize` (its statistics stay
    local). One rollout = one episode (``config.decisions`` scheduling decisions).

    Args:
        config: the site's scheduling system.
        seed: the site's own randomness (its episodes).
        algo, federate, episodes_per_round, net_arch, model_seed, learning_rate, n_epochs,
            batch_size: as `PPOLearner`.
    """

    def __init__(
        self,
        config: Any,
        seed: int = 0,
        algo: str = "dual_critic_ppo",
        federate: str = "public_critic",
        episodes_per_round: int = 25,
        net_arch: Sequence[int] = (64,),
        model_seed: int = 0,
        learning_rate: float = 3e-4,
        n_epochs: int = 10,
        batch_size: int = 64,
    ) -> None:
        from stable_baselines3.common.vec_env import DummyVecEnv, VecMonitor, VecNormalize

        from edgetwin.emulator.vm_scheduling import VMSchedulingEnv

        self._check(algo, federate, episodes_per_round)
        self.config, self.algo, self.federate = config, algo, federate
        venv = VecMonitor(DummyVecEnv([lambda: VMSchedulingEnv(config)]))
        self.normalize = VecNormalize(venv, norm_obs=False, norm_reward=True, gamma=0.99)
        self.env = cast(VMSchedulingEnv, venv.venv.envs[0])  # type: ignore[attr-defined]
        self.episode_group = 1
        self.steps_per_round = int(config.decisions) * int(episodes_per_round)
        self._build_model(
            algo,
            self.normalize,
            int(config.decisions),
            model_seed,
            seed,
            batch_size=min(batch_size, int(config.decisions)),
            n_epochs=n_epochs,
            learning_rate=learning_rate,
            gamma=0.99,
            gae_lambda=0.95,
            clip_range=0.2,
            ent_coef=0.01,
            policy_kwargs={"net_arch": list(net_arch)},
        )
        self.num_samples = self.steps_per_round
        self.episodes = 0
        self.last_returns: list[float] = []

    def act(self, obs: np.ndarray, deterministic: bool = True) -> int:
        """The current policy's action for one observation: its most likely one, or a sample (seed the
        draws with `sampling`)."""
        a, _ = self.model.predict(obs, deterministic=deterministic)
        return int(a)

    def telemetry(self) -> SiteTelemetry:
        env = self.env
        if not hasattr(env, "free"):
            return SiteTelemetry(0.0, 0.0, 0.0, 0.0)
        util = float(env._utilisation().mean())
        # queued vCPU-steps per site vCPU: time steps of work (the MDP's clock has no seconds)
        backlog = float(sum(v * s for v, _, s, _ in env.queue)) / float(env.config.fleet.vcpu.sum())
        return SiteTelemetry(
            util=util, predicted_util=min(1.5, util + backlog), backlog_s=backlog, vcpu=float(env.config.fleet.vcpu.sum())
        )


class _SB3PlatformPolicy:
    """Deterministic actions of an SB3 model for raw observations: normalise, predict, rescale."""

    def __init__(self, model: Any, normalize: Any, transform: Any) -> None:
        self.model, self.normalize, self.transform = model, normalize, transform

    def act(self, obs: np.ndarray) -> np.ndarray:
        x = np.atleast_2d(np.asarray(obs, dtype=np.float32))
        if self.normalize is not None:
            x = self.normalize.normalize_obs(x)
        raw, _ = self.model.predict(x, deterministic=True)
        return self.transform.apply(np.asarray(raw).reshape(len(x), -1))


def make_learner(spec: Mapping[str, Any], site: SiteSpec) -> Learner:
    """A learner from a config table ``{"kind": "forecast" | "ppo", ...its arguments}``."""
    if not isinstance(spec, Mapping) or not isinstance(spec.get("kind"), str):
        raise InputError(
            f"a learner is a table with 'kind' ('forecast' or 'ppo'), got {spec!r}", where="learner"
        )
    kwargs = {k: v for k, v in spec.items() if k != "kind"}
    cls: Any = {"forecast": ForecastLearner, "ppo": PPOLearner}.get(spec["kind"])
    if cls is None:
        raise InputError(
            f"unknown learner kind {spec['kind']!r}; known: ['forecast', 'ppo']", where="learner.kind"
        )
    if "net_arch" in kwargs:
        kwargs["net_arch"] = tuple(kwargs["net_arch"])
    try:
        return cls(site, **kwargs)
    except TypeError as e:
        raise InputError(f"{spec['kind']}: {e}", where="learner") from None


# ------------------------------------------------------------------------------ uplink codec
class DampedErrorFeedbackCodec(UpdateCodec):
    """`UpdateCodec` (top-k + int8) whose error-feedback residual is damped before it is re-sent.

    A federated client trains many local steps from each new global model, so its next update
    re-learns much of what compression dropped from the last one; full error feedback then sends
    that part twice and the global model overshoots. With top-k 10 % we measured FedAvg swinging
    with a period of about a dozen rounds (forecast skill from +0.6 to -1.5 and back); multiplying
    the residual by ``residual_decay`` (0.5) before adding it keeps most of the correction and
    converges smoothly, close to uncompressed updates.

    Args:
        topk, quantize_bits, error_feedback: as `UpdateCodec`.
        residual_decay: factor in [0, 1] applied to a client's residual at each encode (1: plain
            error feedback, 0: none).
    """

    def __init__(
        self,
        topk: float | None = 0.1,
        quantize_bits: int | None = 8,
        error_feedback: bool = True,
        residual_decay: float = 0.5,
    ) -> None:
        super().__init__(topk=topk, quantize_bits=quantize_bits, error_feedback=error_feedback)
        if not 0.0 <= residual_decay <= 1.0:
            raise InputError(
                f"residual_decay must be in [0, 1], got {residual_decay}", where="codec.residual_decay"
            )
        self.residual_decay = float(residual_decay)

    def encode(self, client_id: str, delta: np.ndarray) -> Any:
        prev = self.residuals.get(client_id)
        if self.error_feedback and prev is not None and self.residual_decay != 1.0:
            self.residuals[client_id] = prev * np.float32(self.residual_decay)
        return super().encode(client_id, delta)


# ------------------------------------------------------------------------------ attacks
@dataclass
class Attack:
    """A Byzantine client's tampering with its update (for robustness tests and benchmarks).

    Attributes:
        kind: ``"scaled"`` (send ``scale · delta``, e.g. -10: a boosted sign flip) or
            ``"random"`` (Gaussian noise of ``scale`` times the honest update's RMS per coordinate).
        scale: see kind.
    """

    kind: str = "scaled"
    scale: float = -10.0

    def __post_init__(self) -> None:
        if self.kind not in ("scaled", "random"):
            raise InputError(
                f"attack kind must be 'scaled' or 'random', got {self.kind!r}", where="attack.kind"
            )
        if not math.isfinite(self.scale):
            raise InputError("attack scale must be finite", where="attack.scale")

    def apply(self, delta: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """The tampered update (D,) float32."""
        if self.kind == "scaled":
            return (self.scale * delta).astype(np.float32)
        rms = float(np.sqrt(np.mean(delta.astype(np.float64) ** 2))) + 1e-3
        return rng.normal(0.0, abs(self.scale) * rms, delta.shape).astype(np.float32)


# ------------------------------------------------------------------------------ intents
@dataclass
class IntentResolution:
    """How a COA settled one round's intents (seed 003 §4.2, §4.4: auction-style, congestion-priced).

    Attributes:
        prices: destination -> internal price per unit of migrated load.
        congestion: destination -> requested load / headroom (> 1: oversubscribed).
        accepted: ``{"site", "service", "to", "load", "bid"}`` migrations granted.
        rejected: those refused (the destination had no headroom left for them).
    """

    prices: dict[str, float] = field(default_factory=dict)
    congestion: dict[str, float] = field(default_factory=dict)
    accepted: list[dict[str, Any]] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)


def resolve_intents(
    intents: Mapping[str, Mapping[str, Any]],
    base_price: float = 1.0,
    sensitivity: float = 2.0,
    cloud: str = "cloud",
) -> IntentResolution:
    """Resolve conflicting tentative migrations with congestion prices.

    Each site's intent names its ``headroom`` (vCPU it could take in) and ``migrations``
    (``{"service", "to", "load", "bid"}``: load in vCPU, bid = urgency). Per destination, requests
    are granted in order of bid (ties: site, service) while they fit its headroom; the rest are
    refused. The destination's price is ``base_price · (1 + sensitivity · congestion)``, so an
    oversubscribed site becomes expensive and ESAs route their next intents elsewhere. The cloud
    (``cloud``) has unbounded headroom at ``base_price · (1 + sensitivity)`` (the backhaul costs).

    Args:
        intents: site -> intent payload of this round.
    """
    headroom = {s: max(0.0, float(p.get("headroom", 0.0))) for s, p in intents.items()}
    requests: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for s, p in sorted(intents.items()):
        for m in p.get("migrations", []):
            load = max(0.0, float(m.get("load", 0.0)))
            requests[str(m["to"])].append(
                {
                    "site": s,
                    "service": str(m["service"]),
                    "to": str(m["to"]),
                    "load": load,
                    "bid": float(m.get("bid", 0.0)),
                }
            )
    res = IntentResolution()
    for dest in sorted(set(requests) | set(headroom)):
        reqs = sorted(requests.get(dest, []), key=lambda m: (-m["bid"], m["site"], m["service"]))
        demand = sum(m["load"] for m in reqs)
        if dest == cloud:
            res.congestion[dest] = 0.0
            res.prices[dest] = base_price * (1.0 + sensitivity)
            res.accepted.extend(reqs)
            continue
        room = headroom.get(dest, 0.0)
        cong = demand / room if room > 0 else (10.0 if demand > 0 else 0.0)
        res.congestion[dest] = float(min(cong, 10.0))
        res.prices[dest] = float(base_price * (1.0 + sensitivity * min(cong, 10.0)))
        used = 0.0
        for m in reqs:
            if used + m["load"] <= room + 1e-9:
                used += m["load"]
                res.accepted.append(m)
            else:
                res.rejected.append(m)
    return res


def _intent_payload(
    site: str,
    cluster: str,
    tel: SiteTelemetry,
    peers: Sequence[str],
    prices: Mapping[str, float],
    risk_util: float = 0.85,
) -> dict[str, Any]:
    """An ESA's intent from its telemetry: migrate what its forecast says will not fit."""
    excess = max(0.0, tel.predicted_util - risk_util) * tel.vcpu
    migrations = []
    if excess > 0:
        # route to the cheapest peer by the last prices the COA published (the cloud if none)
        options = sorted([p for p in peers if p != site], key=lambda p: (prices.get(p, 1.0), p)) or ["cloud"]
        n = min(3, max(1, int(math.ceil(excess / 4.0))))
        for j in range(n):
            migrations.append(
                {
                    "service": f"{site}/svc-{j}",
                    "to": options[j % len(options)],
                    "load": excess / n,
                    "bid": float(tel.predicted_util),
                }
            )
    return {
        "site": site,
        "cluster": cluster,
        "predicted_backlog": float(tel.backlog_s + max(0.0, tel.predicted_util - 1.0) * 900.0),
        "migrations": migrations,
        "risk": float(np.clip(tel.predicted_util / risk_util - 1.0, 0.0, 10.0)),
        "headroom": float(max(0.0, risk_util - tel.predicted_util) * tel.vcpu),
        "congestion": float(prices.get(site, 1.0)),
    }


# ------------------------------------------------------------------------------ helpers
_DENSE = UpdateCodec(topk=None, quantize_bits=None, error_feedback=False)


def _model_envelope(
    sender: str,
    run: str,
    level: str,
    group: str,
    version: int,
    params: np.ndarray,
    for_client: str | None = None,
    metrics: Mapping[str, float] | None = None,
) -> Envelope:
    """A ``global_model`` envelope carrying full parameters, dense float32 (models are not deltas)."""
    enc = _DENSE.encode("model", params)
    payload: dict[str, Any] = {
        "level": level,
        "group": group,
        "version": int(version),
        "codec": enc.meta,
        "run": run,
    }
    if for_client is not None:
        payload["for_client"] = for_client
    if metrics:
        payload["metrics"] = {k: float(v) for k, v in metrics.items() if math.isfinite(float(v))}
    return Envelope(
        kind="global_model", sender=sender, round=int(version), payload=payload, tensors=dict(enc.tensors)
    )


def _control(
    sender: str,
    run: str,
    level: str,
    group: str,
    r: int,
    action: str,
    deadline_s: float | None = None,
    participants: Sequence[str] | None = None,
) -> Envelope:
    payload: dict[str, Any] = {"level": level, "group": group, "action": action, "run": run}
    if deadline_s is not None:
        payload["deadline_s"] = float(deadline_s)
    if participants is not None:
        payload["participants"] = list(participants)
    return Envelope(kind="round_control", sender=sender, round=int(r), payload=payload)


def params_sha256(params: np.ndarray) -> str:
    """The hash a policy version carries: sha256 of the float32 little-endian parameter bytes."""
    return hashlib.sha256(np.ascontiguousarray(params, dtype="<f4").tobytes()).hexdigest()


async def _wait_for(pred: Callable[[], bool], event: asyncio.Event, timeout: float) -> bool:
    """Wait until ``pred()`` holds (re-checked whenever ``event`` fires), at most ``timeout`` s."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not pred():
        left = deadline - loop.time()
        if left <= 0:
            return False
        event.clear()
        if pred():
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), left)
    return True


class _AgentBase:
    """Task bookkeeping shared by the agents: spawned tasks are tracked and their errors logged."""

    def __init__(self, bus: Bus, name: str, run: str) -> None:
        self.bus, self.name, self.run_id = bus, name, run
        self.refused: Counter[str] = Counter()
        self.done = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._subs: list[Any] = []

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        task = asyncio.create_task(coro, name=f"{self.name}:{name}")
        self._tasks.add(task)

        def _done(t: asyncio.Task[Any]) -> None:
            self._tasks.discard(t)
            if not t.cancelled() and t.exception() is not None:
                log.error("%s: task %s failed: %r", self.name, name, t.exception(), exc_info=t.exception())

        task.add_done_callback(_done)
        return task

    def _foreign(self, env: Envelope) -> bool:
        # Several runs may share a server (and JetStream keeps old messages): ignore other runs'.
        if env.payload.get("run") != self.run_id:
            self.refused["other_run"] += 1
            return True
        return False

    async def stop(self) -> None:
        """Cancel this agent's tasks and subscriptions (the bus stays open)."""
        for t in list(self._tasks):
            t.cancel()
        for t in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        for s in self._subs:
            with contextlib.suppress(Exception):
                await s.unsubscribe()
        self._subs.clear()


# ------------------------------------------------------------------------------ ESA
class EdgeServiceAgent(_AgentBase):
    """An Edge Service Agent: local training, intents and compressed, durable model updates.

    Args:
        bus: its bus client (may be shared with other agents of the process).
        site: the site it runs.
        learner: the local learner.
        parent: ``(level, name)`` of the aggregation group it reports to.
        run: the federation run id (messages of other runs are ignored).
        peers: the other sites of its cluster (migration destinations).
        codec: compression of its uplink (top-k + int8 with error feedback by default).
        attack: make this a Byzantine client (tests, benchmarks).
        state_dir: where it checkpoints its model and the round it is training, so that a restarted
            ESA finishes that round and sends the (then stale) update.
        model_wait_s: how long a round waits for the round's model before training from the
            model it has (its update is then stale).
        seed: randomness of the attack.
    """

    role = "esa"

    def __init__(
        self,
        bus: Bus,
        site: SiteSpec,
        learner: Learner,
        parent: tuple[str, str],
        run: str,
        peers: Sequence[str] = (),
        codec: UpdateCodec | None = None,
        attack: Attack | None = None,
        state_dir: str | Path | None = None,
        model_wait_s: float = 2.0,
        seed: int = 0,
    ) -> None:
        super().__init__(bus, f"esa/{site.name}", run)
        self.site, self.learner, self.parent = site, learner, parent
        self.peers = list(peers)
        self.codec = codec if codec is not None else DampedErrorFeedbackCodec()
        self.attack = attack
        self.state_dir = Path(state_dir) if state_dir is not None else None
        self.model_wait_s = float(model_wait_s)
        self.rng = np.random.default_rng(seed)
        self.version = -1  # version of the federated model installed
        self.prices: dict[str, float] = {}
        self.records: list[dict[str, Any]] = []
        self.published_ids: list[str] = []
        self.skipped: list[int] = []  # rounds opened while it was still busy with an earlier one
        self._model_event = asyncio.Event()
        self._busy = asyncio.Lock()
        self._deferred: tuple[int, np.ndarray] | None = None
        self._training = False
        self._started_rounds: set[int] = set()
        self._final_version: int | None = None

    # --- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        """Subscribe and, if a checkpoint says a round was under way, finish it."""
        level, group = self.parent
        self._subs += [
            await self.bus.subscribe(Subjects.model(level, group), self._on_model),
            await self.bus.subscribe(Subjects.round(level, group), self._on_round),
            await self.bus.subscribe(Subjects.summary(self.site.cluster), self._on_summary),
        ]
        pending = self._load_checkpoint()
        if pending is not None:
            r, base = pending
            log.info("%s: resuming round %d (model v%d) after a restart", self.name, r, base)
            self._started_rounds.add(r)
            self._spawn(self._train_round(r, base=base), f"resume-{r}")

    # --- handlers -------------------------------------------------------------------------------
    async def _on_model(self, rcv: Received) -> None:
        env = rcv.envelope
        if env.kind != "global_model" or self._foreign(env):
            return
        fc = env.payload.get("for_client")
        if fc is not None and fc != self.site.name:
            return
        v = int(env.payload["version"])
        if v <= self.version:
            return
        params = decode_update(env)
        if self._training:
            # Mid-training: install after this round's update is out (it was computed from the old one).
            if self._deferred is None or v > self._deferred[0]:
                self._deferred = (v, params)
            return
        self._install(v, params)

    def _install(self, v: int, params: np.ndarray) -> None:
        try:
            self.learner.set_params(params)
        except InputError as e:
            self.refused["model_shape"] += 1
            log.warning("%s: refused model v%d: %s", self.name, v, e)
            return
        self.version = v
        self._save_checkpoint(None)
        self._model_event.set()

    async def _on_round(self, rcv: Received) -> None:
        env = rcv.envelope
        if env.kind != "round_control" or self._foreign(env):
            return
        if env.payload["action"] == "close":
            self._final_version = env.round
            self._spawn(self._finish(env.round), "finish")
            return
        parts = env.payload.get("participants")
        if parts is not None and self.site.name not in parts:
            return
        if env.round in self._started_rounds:
            return
        if self._busy.locked():
            # Still on an earlier round (a straggler, or finishing the round it was restarted in):
            # skip this one rather than queue up rounds it can no longer make in time.
            self.skipped.append(env.round)
            return
        self._started_rounds.add(env.round)
        self._spawn(self._train_round(env.round), f"round-{env.round}")

    async def _on_summary(self, rcv: Received) -> None:
        env = rcv.envelope
        if env.kind == "summary" and not self._foreign(env):
            prices = env.payload["stats"].get("prices", {})
            if isinstance(prices, dict):
                self.prices = {str(k): float(v) for k, v in prices.items() if isinstance(v, int | float)}

    async def _finish(self, final_version: int, finish_timeout_s: float = 60.0) -> None:
        # Let a round in progress send its update (bounded: a stuck learner must not keep the agent).
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._busy.acquire(), finish_timeout_s)
            self._busy.release()
        if self._deferred is not None:
            self._install(*self._deferred)
            self._deferred = None
        await _wait_for(lambda: self.version >= final_version, self._model_event, self.model_wait_s)
        self.done.set()

    # --- one round ----------------------------------------------------------------------------------
    async def _train_round(self, r: int, base: int | None = None) -> None:
        async with self._busy:
            if base is None:
                # The round's model normally arrives just before the open; never wait forever for it.
                await _wait_for(lambda: self.version >= r, self._model_event, self.model_wait_s)
                base = self.version
            self._training = True
            try:
                await self._train_and_send(r, base)
            finally:
                self._training = False
                if self._deferred is not None:
                    v, params = self._deferred
                    self._deferred = None
                    if v > self.version:
                        self._install(v, params)

    async def _train_and_send(self, r: int, base: int) -> None:
        self._save_checkpoint((r, base))
        start = self.learner.get_params()
        metrics = await asyncio.to_thread(self.learner.train)
        delta = self.learner.get_params() - start
        if self.attack is not None:
            delta = self.attack.apply(delta, self.rng)
        tel = self.learner.telemetry()
        group = self.parent[1]
        intent = _intent_payload(self.site.name, self.site.cluster, tel, self.peers, self.prices)
        intent["run"] = self.run_id
        await self.bus.publish(
            Subjects.intent(self.site.cluster, self.site.name),
            Envelope(kind="intent", sender=self.name, round=r, payload=intent),
        )
        enc = self.codec.encode(self.site.name, delta)
        clean = {k: float(v) for k, v in metrics.items() if math.isfinite(v)}
        env = model_update(
            self.name,
            r,
            enc,
            num_samples=max(1, int(self.learner.num_samples)),
            level="site",
            group=group,
            base_round=max(base, 0),
            metrics=clean,
        )
        env.payload["run"] = self.run_id
        await self.bus.publish_durable(Subjects.update("site", group), env)
        self.published_ids.append(env.msg_id)
        self.records.append({"round": r, "base": base, "msg_id": env.msg_id, **metrics})
        self._save_checkpoint(None)

    # --- checkpoint ---------------------------------------------------------------------------------
    def _save_checkpoint(self, pending: tuple[int, int] | None) -> None:
        if self.state_dir is None:
            return
        self.state_dir.mkdir(parents=True, exist_ok=True)
        self.learner.save(self.state_dir / "learner")
        doc = {"version": self.version, "pending": list(pending) if pending else None, "run": self.run_id}
        tmp = self.state_dir / "esa.json.tmp"
        tmp.write_text(json.dumps(doc))
        tmp.replace(self.state_dir / "esa.json")

    def _load_checkpoint(self) -> tuple[int, int] | None:
        if self.state_dir is None or not (self.state_dir / "esa.json").is_file():
            return None
        doc = json.loads((self.state_dir / "esa.json").read_text())
        if doc.get("run") != self.run_id:
            return None
        self.learner.load(self.state_dir / "learner")
        self.version = int(doc["version"])
        p = doc.get("pending")
        return (int(p[0]), int(p[1])) if p else None


# ------------------------------------------------------------------------------ aggregators
@dataclass
class RoundRecord:
    """What one aggregation group did in one round.

    Attributes:
        node, level: the group.
        round: the round number.
        reason: how its collection closed (``complete``, ``quorum+grace``, ``timeout``).
        aggregated: whether a new model was made (False: too few updates; the model is kept).
        participants: inputs asked to report; on_time: those that did in time; missing: the rest.
        late: input -> staleness (rounds) of late updates mixed into this aggregation.
        weights: the strategy's weight per input (FedAvg-like strategies), in update order.
        reward: sample-weighted mean of the inputs' reported reward.
        input_rewards: input -> its reported reward.
        bytes_up: bytes of the updates received from the inputs during the round.
        bytes_down: bytes of the models this group published for the round.
        elapsed_s: open to close.
        info: the strategy's diagnostics (trimmed to JSON-able scalars and lists).
    """

    node: str
    level: str
    round: int
    reason: str
    aggregated: bool
    participants: list[str]
    on_time: list[str]
    missing: list[str]
    late: dict[str, int]
    weights: dict[str, float]
    reward: float
    input_rewards: dict[str, float]
    bytes_up: int
    bytes_down: int
    elapsed_s: float
    info: dict[str, Any] = field(default_factory=dict)
    intents: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if not math.isfinite(d["reward"]):
            d["reward"] = None
        return d


def _jsonable_info(info: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in info.items():
        if k in ("attention", "scores"):
            continue  # (K, K) matrices: large and not needed in round records
        try:
            json.dumps(v)
        except (TypeError, ValueError):
            continue
        out[k] = v
    return out


class AggregatorAgent(_AgentBase):
    """An aggregation group on the bus (the shared machinery of COA and GCA).

    Args:
        bus: its bus client.
        node: its `HierarchyNode` (strategy, members or children, sampler, quorum, grace, timeout).
        run: the federation run id.
        parent: the parent group ``(level, name)``, None at the root.
        codec: compression of its uplink to the parent.
        model_wait_s: how long a round waits for the parent's model of that round.
    """

    role = "coa"

    def __init__(
        self,
        bus: Bus,
        node: HierarchyNode,
        run: str,
        parent: tuple[str, str] | None = None,
        codec: UpdateCodec | None = None,
        model_wait_s: float = 2.0,
    ) -> None:
        super().__init__(bus, f"agg/{node.name}", run)
        self.node, self.parent = node, parent
        self.codec = codec if codec is not None else DampedErrorFeedbackCodec()
        self.model_wait_s = float(model_wait_s)
        self.inputs = node.inputs
        self.input_level = "site" if node.members else node.children[0].level
        self.records: list[RoundRecord] = []
        self.received_ids: set[str] = set()
        self.params: np.ndarray | None = None  # this group's model after its last round
        self._collector: RoundCollector | None = None
        self._metrics: dict[str, dict[str, float]] = {}
        self._late: dict[str, tuple[ClientUpdate, dict[str, float]]] = {}
        self._early: dict[int, list[tuple[ClientUpdate, dict[str, float]]]] = defaultdict(list)
        self._last_base: dict[str, int] = {}
        self._bytes_up = 0
        self._intents: dict[int, dict[str, dict[str, Any]]] = defaultdict(dict)
        self._parent_model: tuple[int, np.ndarray] | None = None
        self._parent_event = asyncio.Event()
        self._round_lock = asyncio.Lock()
        self._current_round = -1
        self._used_samples: dict[str, float] = {}

    # --- lifecycle ------------------------------------------------------------------------------
    async def start(self) -> None:
        """Subscribe to its inputs' updates (durable), intents, and the parent's rounds and models."""
        durable = f"{self.run_id}-agg-{self.node.name}"
        self._subs.append(
            await self.bus.subscribe_durable(
                f"{Subjects.PREFIX}.update.{self.input_level}.{self.node.name}", durable, self._on_update
            )
        )
        if self.node.members:
            self._subs.append(
                await self.bus.subscribe(f"{Subjects.PREFIX}.intent.{self.node.name}.*", self._on_intent)
            )
        if self.parent is not None:
            self._subs += [
                await self.bus.subscribe(Subjects.model(*self.parent), self._on_parent_model),
                await self.bus.subscribe(Subjects.round(*self.parent), self._on_parent_round),
            ]

    # --- receiving ----------------------------------------------------------------------------------
    async def _on_update(self, rcv: Received) -> None:
        env = rcv.envelope
        if env.kind != "model_update" or self._foreign(env):
            return
        if env.msg_id in self.received_ids:
            self.refused["duplicate"] += 1  # at-least-once delivery: the same update again
            return
        self.received_ids.add(env.msg_id)
        self._bytes_up += rcv.nbytes
        client = env.sender.split("/", 1)[-1]
        if client not in self.inputs or env.payload["group"] != self.node.name:
            self.refused["unknown_sender"] += 1
            log.warning("%s: update from %s, not an input of %s", self.name, env.sender, self.node.name)
            return
        delta = decode_update(env)
        if self.params is not None and delta.shape != self.params.shape:
            self.refused["wrong_size"] += 1
            log.warning(
                "%s: update from %s has %d values, the model %d",
                self.name,
                client,
                delta.size,
                self.params.size,
            )
            return
        base = int(env.payload["base_round"])
        if base > max(env.round, self._current_round):
            self.refused["future_base"] += 1
            return
        u = ClientUpdate(client, delta, float(env.payload["num_samples"]), base)
        metrics = {
            k: float(v) for k, v in env.payload.get("metrics", {}).items() if isinstance(v, int | float)
        }
        col = self._collector
        if col is not None and not col.closed and env.round == col.round:
            if col.submit(u):
                self._metrics[client] = metrics
                return
            if client in col.updates:
                return  # a second update for the round: the first counts
        if env.round > self._current_round:
            self._early[env.round].append((u, metrics))
            return
        # Late: keep the newest per input for the next aggregation (discounted by its staleness).
        if base > self._last_base.get(client, -1) and (
            client not in self._late or base >= self._late[client][0].base_round
        ):
            self._late[client] = (u, metrics)

    async def _on_intent(self, rcv: Received) -> None:
        env = rcv.envelope
        if env.kind == "intent" and not self._foreign(env) and env.payload["site"] in self.inputs:
            self._intents[env.round][env.payload["site"]] = env.payload

    async def _on_parent_model(self, rcv: Received) -> None:
        env = rcv.envelope
        if env.kind != "global_model" or self._foreign(env):
            return
        fc = env.payload.get("for_client")
        if fc is not None and fc != self.node.name:
            return
        v = int(env.payload["version"])
        if self._parent_model is None or v > self._parent_model[0]:
            self._parent_model = (v, decode_update(env))
            self._parent_event.set()

    async def _on_parent_round(self, rcv: Received) -> None:
        env = rcv.envelope
        if env.kind != "round_control" or self._foreign(env):
            return
        if env.payload["action"] == "close":
            self._spawn(self._close_down(env.round), "close")
            return
        parts = env.payload.get("participants")
        if parts is not None and self.node.name not in parts:
            return
        self._spawn(self._child_round(env.round), f"round-{env.round}")

    # --- rounds -------------------------------------------------------------------------------------
    async def _child_round(self, r: int) -> None:
        async with self._round_lock:
            ok = await _wait_for(
                lambda: self._parent_model is not None and self._parent_model[0] >= r,
                self._parent_event,
                self.model_wait_s,
            )
            if self._parent_model is None:
                log.warning("%s: no model from %s for round %d; skipping it", self.name, self.parent, r)
                return
            if not ok:
                log.warning(
                    "%s: round %d runs on model v%d (round's model late)", self.name, r, self._parent_model[0]
                )
            g = self._parent_model[1]
            rec, new = await self.run_round(r, g)
            if rec.aggregated and self.parent is not None:
                total = sum(self._used_samples.values())
                enc = self.codec.encode(self.node.name, (new - g).astype(np.float32))
                metrics = {
                    "reward": rec.reward,
                    f"bytes_up_{self.input_level}": float(rec.bytes_up),
                    "bytes_down": float(rec.bytes_down),
                }
                env = model_update(
                    self.name,
                    r,
                    enc,
                    num_samples=max(1, int(total)),
                    level=self.node.level,
                    group=self.parent[1],
                    base_round=r,
                    metrics={k: v for k, v in metrics.items() if math.isfinite(v)},
                )
                env.payload["run"] = self.run_id
                await self.bus.publish_durable(Subjects.update(self.node.level, self.parent[1]), env)

    async def _close_down(self, final_version: int) -> None:
        """The parent finished: pass the final models and the close down, then stop."""
        async with self._round_lock:
            await _wait_for(
                lambda: self._parent_model is not None and self._parent_model[0] >= final_version,
                self._parent_event,
                self.model_wait_s,
            )
            if self._parent_model is not None:
                self.params = self._parent_model[1]
                await self._publish_models(final_version, self._parent_model[1])
            await self.bus.publish(
                Subjects.round(self.node.level, self.node.name),
                _control(self.name, self.run_id, self.node.level, self.node.name, final_version, "close"),
            )
        self.done.set()

    async def _publish_models(self, version: int, g: np.ndarray) -> int:
        """Send each input the model to train from in round ``version``; returns the bytes sent."""
        agg = self.node.aggregator
        models = {i: agg.model_for(i, g) for i in self.inputs}
        shared = all(m is g or np.array_equal(m, g) for m in models.values())
        envs = (
            [_model_envelope(self.name, self.run_id, self.node.level, self.node.name, version, g)]
            if shared
            else [
                _model_envelope(
                    self.name, self.run_id, self.node.level, self.node.name, version, m, for_client=i
                )
                for i, m in models.items()
            ]
        )
        before = self.bus.stats.bytes_out_by_subject.get(Subjects.model(self.node.level, self.node.name), 0)
        for env in envs:
            await self.bus.publish_durable(Subjects.model(self.node.level, self.node.name), env)
        return int(
            self.bus.stats.bytes_out_by_subject.get(Subjects.model(self.node.level, self.node.name), 0)
            - before
        )

    async def run_round(self, r: int, g: np.ndarray) -> tuple[RoundRecord, np.ndarray]:
        """Run round ``r`` of this group from model ``g`` (D,): send models, open, collect, aggregate.

        Returns the round's record and the group's new model (``g`` itself if it did not aggregate).
        """
        node = self.node
        g = np.asarray(g, dtype=np.float32)
        self.params = g if self.params is None else self.params
        self._current_round = r
        bytes_down = await self._publish_models(r, g)
        participants = node.participants(r)
        col = RoundCollector(
            r,
            participants,
            quorum=min(node.quorum, len(participants)),
            grace_s=node.grace_s,
            timeout_s=node.timeout_s,
        )
        self._collector, self._metrics = col, {}
        self._bytes_up = 0
        for u, m in self._early.pop(r, []):
            if col.submit(u):
                self._metrics[u.client_id] = m
        await self.bus.publish(
            Subjects.round(node.level, node.name),
            _control(self.name, self.run_id, node.level, node.name, r, "open", node.timeout_s, participants),
        )
        outcome = await col.wait()
        on_time = sorted(outcome.updates, key=lambda u: u.client_id)
        late = [self._late.pop(c) for c in sorted(self._late) if c not in col.updates]
        for c in list(self._late):  # an on-time update supersedes what the same input sent late
            if c in col.updates:
                del self._late[c]
        metrics = dict(self._metrics)
        for u, m in late:
            metrics[u.client_id] = m
        updates = []
        for u in on_time + [u for u, _ in late]:
            # An input with a different model (or NaN / inf in its bytes) must not cost the others the round.
            if u.delta.shape != g.shape:
                self.refused["wrong_size"] += 1
            elif not np.all(np.isfinite(u.delta)):
                self.refused["non_finite"] += 1
            else:
                updates.append(u)
        new, res, aggregated = g, None, False
        info: dict[str, Any] = {}
        if updates and (outcome.quorum_met or late):
            try:
                res = node.aggregator.aggregate(updates, g, r)
                new, aggregated = res.params, True
            except (QuorumNotMet, InputError) as e:
                info["skipped"] = str(e)
                log.warning("%s: round %d not aggregated: %s", self.name, r, e)
        else:
            info["skipped"] = f"{len(on_time)} of {len(participants)} updates, quorum {col.quorum}"
        if aggregated:
            for u in updates:
                self._last_base[u.client_id] = max(self._last_base.get(u.client_id, -1), u.base_round)
            self.params = new
        self._used_samples = {u.client_id: u.num_samples for u in updates} if aggregated else {}
        rec = self._record(
            r, outcome, participants, on_time, late, res, metrics, bytes_down, aggregated, info
        )
        if node.members:
            rec.intents = self._settle_intents(r)
            await self._publish_summary(rec)
        self.records.append(rec)
        return rec, new

    def _record(
        self,
        r: int,
        outcome: Any,
        participants: list[str],
        on_time: list[ClientUpdate],
        late: list[tuple[ClientUpdate, dict[str, float]]],
        res: AggregateResult | None,
        metrics: Mapping[str, Mapping[str, float]],
        bytes_down: int,
        aggregated: bool,
        info: dict[str, Any],
    ) -> RoundRecord:
        shape = () if self.params is None else self.params.shape
        updates = [u for u in on_time + [u for u, _ in late] if u.delta.shape == shape]
        rewards = {
            c: float(m["reward"]) for c, m in metrics.items() if "reward" in m and math.isfinite(m["reward"])
        }
        w = np.array([u.num_samples for u in updates if u.client_id in rewards], dtype=np.float64)
        vals = np.array([rewards[u.client_id] for u in updates if u.client_id in rewards])
        reward = float(np.average(vals, weights=w)) if len(vals) else float("nan")
        weights: dict[str, float] = {}
        if res is not None:
            info.update(_jsonable_info(res.info))
            ws = res.info.get("weights")
            clients = res.info.get("clients", [u.client_id for u in updates])
            if isinstance(ws, list) and len(ws) == len(clients):
                weights = {c: float(x) for c, x in zip(clients, ws, strict=True)}
        return RoundRecord(
            node=self.node.name,
            level=self.node.level,
            round=r,
            reason=outcome.reason,
            aggregated=aggregated,
            participants=list(participants),
            on_time=[u.client_id for u in on_time],
            missing=list(outcome.missing),
            late={u.client_id: r - u.base_round for u, _ in late},
            weights=weights,
            reward=reward,
            input_rewards=rewards,
            bytes_up=int(self._bytes_up),
            bytes_down=int(bytes_down),
            elapsed_s=float(outcome.elapsed_s),
            info=info,
        )

    def _settle_intents(self, r: int) -> dict[str, Any]:
        intents = self._intents.pop(r, {})
        for old in [k for k in self._intents if k < r - 2]:
            del self._intents[old]  # intents too old to matter
        if not intents:
            return {}
        res = resolve_intents(intents)
        return {
            "n": len(intents),
            "prices": res.prices,
            "congestion": res.congestion,
            "accepted": len(res.accepted),
            "rejected": len(res.rejected),
            "predicted_backlog_s": float(np.mean([p["predicted_backlog"] for p in intents.values()])),
        }

    async def _publish_summary(self, rec: RoundRecord) -> None:
        stats = {
            "round": rec.round,
            "reason": rec.reason,
            "on_time": len(rec.on_time),
            "missing": rec.missing,
            "late": rec.late,
            "bytes_up": rec.bytes_up,
            "bytes_down": rec.bytes_down,
            "reward": rec.reward if math.isfinite(rec.reward) else None,
            "prices": rec.intents.get("prices", {}),
            "congestion": rec.intents.get("congestion", {}),
            "migrations_accepted": rec.intents.get("accepted", 0),
            "migrations_rejected": rec.intents.get("rejected", 0),
        }
        await self.bus.publish(
            Subjects.summary(self.node.name),
            Envelope(
                kind="summary",
                sender=self.name,
                round=rec.round,
                payload={"cluster": self.node.name, "stats": stats, "run": self.run_id},
            ),
        )


class ClusterOrchestratorAgent(AggregatorAgent):
    """A Cluster Orchestrator Agent: aggregates its sites (or child groups), settles intents, reports up.

    Its rounds are opened by its parent (`GlobalCoordinationAgent` or a region group); see
    `AggregatorAgent` for the arguments.
    """

    role = "coa"

    def __init__(
        self, bus: Bus, node: HierarchyNode, run: str, parent: tuple[str, str], **kwargs: Any
    ) -> None:
        if parent is None:
            raise InputError(f"the COA of {node.name!r} needs a parent group", where="parent")
        super().__init__(bus, node, run, parent=parent, **kwargs)


class GlobalCoordinationAgent(AggregatorAgent):
    """The Global Coordination Agent: drives the rounds, aggregates globally, versions the policy.

    Args:
        bus, node, run, codec, model_wait_s: see `AggregatorAgent` (``node`` is the root).
        initial_params: (D,) the federated parameters every site starts from (round 0's model).
        on_round: called with each finished `RoundRecord` (progress bars).
    """

    role = "gca"

    def __init__(
        self,
        bus: Bus,
        node: HierarchyNode,
        run: str,
        initial_params: np.ndarray,
        on_round: Callable[[RoundRecord], None] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(bus, node, run, parent=None, **kwargs)
        self.params = np.asarray(initial_params, dtype=np.float32)
        self.on_round = on_round
        self.versions: list[dict[str, Any]] = []
        self.summaries: dict[str, list[dict[str, Any]]] = defaultdict(list)

    async def start(self) -> None:
        await super().start()
        self._subs.append(await self.bus.subscribe(f"{Subjects.PREFIX}.summary.*", self._on_summary))

    async def _on_summary(self, rcv: Received) -> None:
        env = rcv.envelope
        if env.kind == "summary" and not self._foreign(env):
            self.summaries[env.payload["cluster"]].append(env.payload["stats"])

    async def run(self, rounds: int) -> list[RoundRecord]:
        """Run ``rounds`` rounds, publish a policy version after each, then the final model and close."""
        if rounds < 1:
            raise InputError(f"rounds must be >= 1, got {rounds}", where="--rounds")
        assert self.params is not None
        g = self.params
        for r in range(rounds):
            rec, g = await self.run_round(r, g)
            self.params = g
            await self._publish_version(r + 1, g, rec)
            if self.on_round is not None:
                self.on_round(rec)
        await self._publish_models(rounds, g)
        await self.bus.publish(
            Subjects.round(self.node.level, self.node.name),
            _control(self.name, self.run_id, self.node.level, self.node.name, rounds, "close"),
        )
        self.done.set()
        return self.records

    async def _publish_version(self, version: int, params: np.ndarray, rec: RoundRecord) -> None:
        doc = {
            "version": int(version),
            "uri": f"edgetwin://federation/{self.run_id}/model/{version}",
            "sha256": params_sha256(params),
            "run": self.run_id,
        }
        if math.isfinite(rec.reward):
            doc["metrics"] = {"reward": float(rec.reward)}
        await self.bus.publish_durable(
            Subjects.policy_version(),
            Envelope(kind="policy_version", sender=self.name, round=rec.round, payload=doc),
        )
        self.versions.append(doc)
