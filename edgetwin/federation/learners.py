"""The local learners of an ESA (`Learner`): what a site trains between two federated rounds.

* `ForecastLearner`: a tiny load forecaster (seed 003's forecasting; fast, for scale runs).
* `SB3Learner`: the base of the stable-baselines3 learners, one site's env and RNG state each.
* `PPOLearner`: dual-critic PPO (seed 000) on the site's emulated-cluster or twin VecEnv; the
  shared trunk is federated, the heads stay local.
* `SchedulerLearner`: PPO on seed 000's VM-scheduling MDP (PFRL-DM).
* `make_learner`: a learner from a config table.

``get_params`` / ``set_params`` are the federated parameters as a flat float32 vector; nothing here
imports torch or stable-baselines3 at module level, so a subprocess agent with the forecaster
starts quickly.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

import numpy as np

from edgetwin.contract.errors import InputError
from edgetwin.federation.sites import SiteSpec, SiteTelemetry

if TYPE_CHECKING:
    from edgetwin.policies.dual_critic import DualCriticPolicy

__all__ = [
    "ForecastLearner",
    "Learner",
    "PPOLearner",
    "SB3Learner",
    "SchedulerLearner",
    "make_learner",
    "site_series",
]


# SB3 and torch draw from the process-global RNGs: learners that use them train one at a time and
# keep their own RNG state, so a run is reproducible whatever order the agents' rounds interleave.
_GLOBAL_RNG_LOCK = threading.Lock()


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

    from edgetwin.emulator.cluster import EdgeCluster
    from edgetwin.emulator.logs import SLOAwarePolicy, episode_seed

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

        # plain state dicts and the generator's byte tensor: read as data, never unpickled as objects
        state = torch.load(path, weights_only=True)
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
        """The model's parameters (SB3's zip; `load` reads only its tensors, with
        ``weights_only=True``) and the learner's own state as npz (no pickle)."""
        self.model.save(path.with_suffix(".zip"))
        name, keys, pos, has_gauss, cached = self._rng[1]
        arrays: dict[str, np.ndarray] = {
            "torch_rng": self._rng[0].numpy(),
            "np_rng_name": np.asarray(str(name)),
            "np_rng_keys": np.asarray(keys),
            "np_rng_rest": np.asarray([pos, has_gauss], np.int64),
            "np_rng_cached": np.asarray(cached, np.float64),
            "episodes": np.asarray(self.episodes, np.int64),
        }
        if self.normalize is not None:
            for which in ("obs_rms", "ret_rms"):
                rms = getattr(self.normalize, which)
                arrays[f"{which}.mean"] = np.asarray(rms.mean)
                arrays[f"{which}.var"] = np.asarray(rms.var)
                arrays[f"{which}.count"] = np.asarray(rms.count, np.float64)
        with path.with_suffix(".state.npz").open("wb") as f:
            np.savez(f, **arrays)  # type: ignore[arg-type]  # the stub lets **kwds fill allow_pickle

    def load(self, path: Path) -> None:
        import torch as th

        from edgetwin.contract.errors import InputError

        state = path.with_suffix(".state.npz")
        if not state.is_file() and path.with_suffix(".state").is_file():
            raise InputError(
                "a learner state pickled by an older edgetwin; states are data now and pickles are never "
                "loaded: remove the agent's state directory to start it afresh",
                str(path.with_suffix(".state")),
            )
        self.model.set_parameters(str(path.with_suffix(".zip")), exact_match=False, device="cpu")
        with np.load(state, allow_pickle=False) as z:
            st = {k: z[k] for k in z.files}
        self.episodes = int(st["episodes"])
        pos, has_gauss = (int(v) for v in st["np_rng_rest"])
        np_state = (str(st["np_rng_name"]), st["np_rng_keys"], pos, has_gauss, float(st["np_rng_cached"]))
        self._rng = (th.as_tensor(st["torch_rng"]), np_state)
        if "obs_rms.mean" in st and self.normalize is not None:
            for which in ("obs_rms", "ret_rms"):
                rms = getattr(self.normalize, which)
                rms.mean = st[f"{which}.mean"]
                rms.var = st[f"{which}.var"]
                rms.count = float(st[f"{which}.count"])


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
            from edgetwin.emulator.envs import EdgeClusterVecEnv

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
