"""MAIL-MMSG (seed 004 §3.4, Algorithm 2): client policies learned adversarially from logs.

Per scenario there is a joint policy: an engine policy ``π_σ`` (the platform, behaviour-cloned
from the logged actions) and a client policy ``π^c_k`` that, given ``⟨profile, state, engine
action, site aggregates⟩``, produces the response, the KPIs/reward the spec's reward needs and the
next state (as ``Δstate`` when the spec names no transition function). A discriminator over
``(client inputs, client outputs)`` tells logged from generated steps; ``-log D`` (imitation's
GAIL reward) is the reward with which the client policy is improved by PPO.

How this maps onto the ``imitation`` library (`imitation.algorithms.adversarial.gail.GAIL`):
GAIL trains one SB3 algorithm on one VecEnv. `ClientVecEnv` is that VecEnv for one scenario's
client policy: each sub-env is one agent of that scenario in a simulated world of sites; the
"dynamics" are the engine policies (which pick every agent's action), the other scenarios'
current client policies (their agents share the sites) and the known or learned transition.
All agents of a world advance in lockstep, which is what lets site aggregates (the capacity
coupling between agents) be computed. Scenarios are trained round-robin, one GAIL round each, so
every scenario's agent adapts to the others' current behaviour.

What the library cannot express, and what we did instead: imitation's GAIL has a single learner,
so the engine policy is not updated by the adversarial RL step (eq. 6 updates ``k`` and ``σ``
together). ``σ`` is fitted by behaviour cloning (eq. 7) and kept fixed; the engine's only job in
the twin is to drive the logged state distribution during training, because at twin time the
platform policy under evaluation replaces it.
"""

from __future__ import annotations

import logging
import math
import shutil
import tempfile
import warnings
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym
import numpy as np
import pandas as pd
import torch as th
from imitation.algorithms import bc
from imitation.algorithms.adversarial.gail import GAIL
from imitation.data import types as itypes
from imitation.rewards.reward_nets import BasicRewardNet
from imitation.util import logger as imit_logger
from stable_baselines3 import PPO
from stable_baselines3.common.distributions import DiagGaussianDistribution
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.preprocessing import preprocess_obs
from stable_baselines3.common.torch_layers import FlattenExtractor
from stable_baselines3.common.vec_env import VecEnv
from tqdm.auto import tqdm

from edgetwin.imitation.layout import Layout
from edgetwin.imitation.site_model import SiteStateModel
from edgetwin.imitation.steps import StepTable, transition_features
from edgetwin.imitation.world import Composition, InitialStates, World, site_consistent

log = logging.getLogger(__name__)

#: Client outputs live in standardised units; the action box only guards against runaway samples.
OUTPUT_CLIP = 10.0
#: Floor of a fitted Gaussian's std (standardised units): a column the mean fits exactly keeps a
#: finite log-likelihood.
MIN_STD = 1e-2

#: ``(n, scenario label, seed) -> raw profiles (n, P)``, e.g. a GAN-SMMSG population model.
ProfileSampler = Callable[[int, str, int], np.ndarray]


# --------------------------------------------------------------------------- batched Gaussian models
#: rows per forward pass when a model runs on more rows than this (`GaussianModel.mean`,
#: `log_likelihood`): a twin's tick (up to 10k agents) runs in one pass
CHUNK_ROWS = 65_536


class GaussianModel:
    """A diagonal-Gaussian SB3 policy used as a batched sampler (numpy in, numpy out).

    Sampling uses a numpy generator, so the same seed gives the same rollout.

    Args:
        policy: an `ActorCriticPolicy` over a Box action space (standardised units).
    """

    def __init__(self, policy: ActorCriticPolicy) -> None:
        self.policy = policy

    @th.no_grad()
    def mean(self, x: np.ndarray) -> np.ndarray:
        """``(N, in) -> (N, out)`` the policy's mean output.

        More than `CHUNK_ROWS` rows go through the network `CHUNK_ROWS` at a time: each row's
        output depends on its own row only, so the numbers are the same to the bit
        (tests/test_scale.py checks it), and a million-row call (the maximum-likelihood std at the
        end of behaviour cloning) does not hold every hidden layer's activations of every row at
        once (0.25 GiB per 64-unit layer).
        """
        if len(x) > CHUNK_ROWS:
            return np.concatenate([self.mean(x[i : i + CHUNK_ROWS]) for i in range(0, len(x), CHUNK_ROWS)])
        if len(x) == 0:
            shape = self.policy.action_space.shape
            assert shape is not None  # a Box action space always has a shape
            return np.zeros((0, shape[0]), dtype=np.float32)
        # shares memory with x when it is already float32, contiguous and writable (torch wants
        # writable arrays); the network only reads it
        layers = self.plain_layers()
        if layers is not None:
            return plain_forward(layers, x)
        arr = np.ascontiguousarray(x, dtype=np.float32)
        obs = th.as_tensor(arr if arr.flags.writeable else arr.copy())
        pol = self.policy
        # what `policy.get_distribution(obs).distribution.mean` computes, without building the
        # distribution (whose argument checks cost more than the network on a twin's tick)
        features = pol.pi_features_extractor(preprocess_obs(obs, pol.observation_space))
        return pol.action_net(pol.mlp_extractor.forward_actor(features)).numpy()

    def plain_layers(self) -> list[Any] | None:
        """`_plain_actor` of the policy, looked up once per model: its entries are the policy's own
        parameter tensors, so weights trained or loaded in place are seen (a model unpickled from
        an older twin looks them up on first use)."""
        if "_plain" not in self.__dict__:
            self.__dict__["_plain"] = _plain_actor(self.policy)
        plain: list[Any] | None = self.__dict__["_plain"]
        return plain

    def numpy_layers(self) -> list[Any] | None:
        """`numpy_actor` of `plain_layers`, looked up once per model (None when the actor is not
        a plain MLP). Its arrays are views of the policy's parameter tensors: weights trained or
        loaded in place are seen."""
        if "_numpy" not in self.__dict__:
            plain = self.plain_layers()
            self.__dict__["_numpy"] = None if plain is None else numpy_actor(plain)
        layers: list[Any] | None = self.__dict__["_numpy"]
        return layers

    @property
    def std(self) -> np.ndarray:
        return th.exp(self.policy.log_std).detach().numpy()

    def sample(self, x: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        mu = self.mean(x)
        return np.clip(mu + self.std * rng.standard_normal(mu.shape), -OUTPUT_CLIP, OUTPUT_CLIP).astype(
            np.float32
        )


_ACTIVATIONS: dict[type, Callable[[th.Tensor], th.Tensor]] = {th.nn.Tanh: th.tanh, th.nn.ReLU: th.relu}


def plain_forward(layers: list[Any], x: np.ndarray) -> np.ndarray:
    """``(N, in) -> (N, out)`` float32 (a fresh array): a plain actor's mean (`_plain_actor`'s
    ``layers``, `GaussianModel.plain_layers`), to be called under ``torch.no_grad``.

    The same kernels on the same tensors as the modules' forward, without nn.Module's per-call
    hooks machinery (a twin's tick calls this once per scenario). ``x`` is shared, not copied,
    when it is already float32, contiguous and writable (torch wants writable arrays); the
    network only reads it.
    """
    arr = np.ascontiguousarray(x, dtype=np.float32)
    h = th.as_tensor(arr if arr.flags.writeable else arr.copy())
    for layer in layers:
        h = layer(h) if callable(layer) else th.nn.functional.linear(h, layer[0], layer[1])
    out: np.ndarray = h.numpy()
    return out


def _np_tanh(h: np.ndarray) -> None:
    np.tanh(h, out=h)


def _np_relu(h: np.ndarray) -> None:
    np.maximum(h, 0.0, out=h)


#: the in-place numpy kernel of each of `_ACTIVATIONS`' torch functions
_NUMPY_ACTIVATIONS: dict[Any, Callable[[np.ndarray], None]] = {th.tanh: _np_tanh, th.relu: _np_relu}


def numpy_actor(layers: list[Any]) -> list[Any] | None:
    """`_plain_actor`'s ``layers`` with each activation replaced by its in-place numpy kernel
    (`numpy_forward`); the linear layers stay the policy's own parameter tensors (weights trained
    or loaded in place are seen). None when an activation has no numpy kernel here."""
    out: list[Any] = []
    for layer in layers:
        if callable(layer):
            fn = _NUMPY_ACTIVATIONS.get(layer)
            if fn is None:
                return None
            out.append(fn)
        else:
            out.append(layer)
    return out


def numpy_forward(layers: list[Any], x: np.ndarray) -> np.ndarray:
    """``(N, in) -> (N, out)`` float32 (a fresh array): `plain_forward` with numpy activations
    (`numpy_actor`'s ``layers``); call under ``torch.no_grad``. A twin's tick runs its first layer by
    blocks instead (`edgetwin.imitation.split.SplitNetwork`) and the layers after it as here.

    Why: at a twin's sizes (10,000 agents, 64-unit layers) torch's CPU ``tanh`` took half the
    client network's time, and numpy's vectorised float32 ``tanh`` is ~13x faster. The linear
    layers stay torch's (its GEMM gives a row the same bits whatever the other rows, which a
    tick of all agents and `Simulation.respond` on a subset rely on; numpy's BLAS does not), and
    the activation runs in place on the tensor's own memory (no copy either way). The numbers are
    not torch's ``tanh`` to the bit: it differs by at most one ulp on ~30 % of activations
    (~1e-7 relative). Deterministic: the same inputs give the same bits.
    """
    arr = np.ascontiguousarray(x, dtype=np.float32)
    h = th.as_tensor(arr if arr.flags.writeable else arr.copy())
    for layer in layers:
        if callable(layer):
            layer(h.numpy())  # in place: the array is the tensor's memory
        else:
            h = th.nn.functional.linear(h, layer[0], layer[1])
    out: np.ndarray = h.numpy()
    return out


def _plain_actor(pol: ActorCriticPolicy) -> list[Any] | None:
    """The actor of ``pol`` as ``[(weight, bias) | activation, ...]`` when it is a plain MLP on a
    flat Box observation (SB3's default: ``Flatten`` extractor, ``Linear``/``Tanh``/``ReLU``
    policy net, ``Linear`` action net), else None (then the modules are called as they are).

    For such a policy ``preprocess_obs`` is ``obs.float()`` and ``Flatten`` of ``(N, in)`` is a
    view, so applying these layers in order gives exactly the modules' numbers."""
    if not (
        isinstance(pol.pi_features_extractor, FlattenExtractor)
        and isinstance(pol.observation_space, gym.spaces.Box)
        and len(pol.observation_space.shape) == 1
        and type(pol.action_net) is th.nn.Linear
        and isinstance(pol.mlp_extractor.policy_net, th.nn.Sequential)
    ):
        return None
    layers: list[Any] = []
    for m in pol.mlp_extractor.policy_net:
        if type(m) is th.nn.Linear:
            layers.append((m.weight, m.bias))
        elif type(m) in _ACTIVATIONS:
            layers.append(_ACTIVATIONS[type(m)])
        else:
            return None
    layers.append((pol.action_net.weight, pol.action_net.bias))
    return layers


def gaussian_policy(n_in: int, n_out: int, net_arch: list[int], lr: float = 1e-3) -> ActorCriticPolicy:
    """A fresh `ActorCriticPolicy` with Box observation/action spaces in standardised units."""
    return ActorCriticPolicy(
        observation_space=gym.spaces.Box(-np.inf, np.inf, (n_in,), np.float32),
        action_space=gym.spaces.Box(-OUTPUT_CLIP, OUTPUT_CLIP, (n_out,), np.float32),
        lr_schedule=lambda _: lr,
        net_arch=net_arch,
    )


def _quiet_logger() -> imit_logger.HierarchicalLogger:
    # imitation's default logger prints every step's table to stdout; we show tqdm instead. Its
    # HierarchicalLogger still needs a folder for per-context subfolders: remove it with the logger.
    folder = tempfile.mkdtemp(prefix="edgetwin-imitation-")
    logger = imit_logger.configure(folder, format_strs=[])
    weakref.finalize(logger, shutil.rmtree, folder, ignore_errors=True)
    return logger


def behaviour_clone(
    x: np.ndarray,
    y: np.ndarray,
    policy: ActorCriticPolicy,
    epochs: int,
    seed: int,
    batch_size: int = 256,
    max_steps: int | None = None,
    optimizer_state: dict[str, Any] | None = None,
) -> dict[str, float]:
    """Fit ``policy`` to ``(x, y)`` pairs by maximum likelihood with `imitation.algorithms.bc.BC`.

    The budget is ``epochs`` passes over the pairs, but at most ``max_steps`` gradient steps
    (minibatches) when given. Why a cap: the optimisation a small MLP needs does not grow with
    the log, while a fixed number of epochs does (20 epochs over a million rows is 35 times the
    steps of 20 over 29k, and was most of a default fit's time: docs/benchmarks/scale/README.md).
    Below the cap the fit is exactly the ``epochs``-pass fit (same batches, same weights); above
    it, training stops after ``max_steps`` minibatches of the same shuffled sequence (the last
    pass partial), so every row is still seen about equally often.

    For a Gaussian policy this is eq. 7 of seed 004 (squared error to the logged action) with a
    learned variance. The variance ends at its closed-form maximum-likelihood value given the fitted
    mean (the mean squared residual per output): gradient steps move SB3's ``log_std`` (initialised
    at 0, std 1) too slowly to get there in a few epochs, and a twin that samples with a std several
    times the logged residual inflates the mean of every heavy-tailed output (log-normal bias) and
    feeds that back through its state.

    Args:
        x: ``(n, in)`` inputs; y: ``(n, out)`` targets (standardised units).
        epochs: passes over the data (at least 1).
        max_steps: cap on gradient steps (None or 0: no cap).
        optimizer_state: a dict that carries Adam's state from one call to the next on the same
            policy (a federated site's rounds: `edgetwin.federation.twin.fit`): loaded when it
            holds a state, replaced by the state after training. None: a fresh optimiser.

    Returns:
        ``{"neglogp": final mean negative log-likelihood, "mse": final squared error of the mean,
        "steps": gradient steps taken}``.
    """
    y = np.clip(y, -OUTPUT_CLIP, OUTPUT_CLIP).astype(np.float32)
    x = np.asarray(x, np.float32)
    # imitation's data loader collates next_obs/dones even for BC, which ignores them
    demos = itypes.Transitions(
        obs=x, acts=y, next_obs=x, dones=np.zeros(len(x), bool), infos=np.array([{}] * len(x), dtype=object)
    )
    th.manual_seed(seed)
    trainer = bc.BC(
        observation_space=policy.observation_space,
        action_space=policy.action_space,
        rng=np.random.default_rng(seed),
        policy=policy,
        demonstrations=demos,
        batch_size=min(batch_size, len(x)),
        ent_weight=0.0,
        l2_weight=0.0,
        custom_logger=_quiet_logger(),
        # Adam over all the policy's tensors at once instead of a Python loop over them: the same
        # arithmetic element by element (the same weights), ~a sixth of a 256-row step less
        optimizer_kwargs={"foreach": True},
    )
    # the same batches as imitation's DataLoader, gathered by index instead of sample by sample
    trainer._demo_data_loader = ShuffledBatches(x, y, min(batch_size, len(x)))
    if optimizer_state:
        trainer.optimizer.load_state_dict(optimizer_state)
    if policy.share_features_extractor:
        # the same loss and gradients without the terms that weigh 0 (see `NeglogpLoss`)
        trainer.loss_calculator = NeglogpLoss()  # type: ignore[assignment]
    with warnings.catch_warnings():
        # imitation logs a grad-carrying tensor as float each batch (harmless, noisy)
        warnings.filterwarnings("ignore", message="Converting a tensor with requires_grad")
        steps = bc_steps(len(x), epochs, batch_size, max_steps)
        if steps < bc_steps(len(x), epochs, batch_size):
            trainer.train(n_batches=steps, progress_bar=False)
        else:  # the uncapped fit, exactly as before the cap existed
            trainer.train(n_epochs=max(1, epochs), progress_bar=False)
    if optimizer_state is not None:
        optimizer_state.clear()
        optimizer_state.update(trainer.optimizer.state_dict())
    mu = set_maximum_likelihood_std(policy, x, y)
    logp = log_likelihood(policy, x, y)
    return {"neglogp": float(-logp.mean()), "mse": float(((mu - y) ** 2).mean()), "steps": float(steps)}


@th.no_grad()
def log_likelihood(policy: ActorCriticPolicy, x: np.ndarray, y: np.ndarray) -> th.Tensor:
    """``(n,)`` the log-density of each row's ``y (n, out)`` under ``policy`` at ``x (n, in)``,
    `CHUNK_ROWS` rows at a time: `ActorCriticPolicy.evaluate_actions`' log-probabilities to the
    bit (the actor's path is the same; tests/test_scale.py checks it), without the critic's
    forward pass or every row's activations in memory at once."""
    parts = [
        policy.get_distribution(th.as_tensor(np.array(x[i : i + CHUNK_ROWS], np.float32))).log_prob(
            th.as_tensor(np.array(y[i : i + CHUNK_ROWS], np.float32))
        )
        for i in range(0, len(x), CHUNK_ROWS)
    ]
    return th.cat(parts) if parts else th.zeros(0)


def set_maximum_likelihood_std(policy: ActorCriticPolicy, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Set ``policy``'s std to its maximum-likelihood value given its fitted mean: the residual
    RMS per output (floored at `MIN_STD`), as every fit of a Gaussian client ends (see
    `behaviour_clone`). ``x`` ``(n, in)``, ``y`` ``(n, out)`` standardised (``y`` already clipped
    to the output range). Returns the mean ``(n, out)``."""
    mu = GaussianModel(policy).mean(x)
    rms = np.sqrt(((y - mu) ** 2).mean(axis=0))
    with th.no_grad():
        policy.log_std.copy_(th.as_tensor(np.log(np.maximum(rms, MIN_STD)), dtype=policy.log_std.dtype))
    return mu


def bc_steps(n: int, epochs: int, batch_size: int, max_steps: int | None = None) -> int:
    """Gradient steps `behaviour_clone` takes on ``n`` rows: ``max(1, epochs)`` passes of
    ``n // min(batch_size, n)`` full minibatches (a partial last batch is dropped; fewer rows
    than a batch make one batch), at most ``max_steps`` (None or 0: no cap)."""
    full = max(1, epochs) * (n // max(1, min(batch_size, n)))
    return min(full, int(max_steps)) if max_steps else full


def _diag_gaussian_log_prob(mean: th.Tensor, log_std: th.Tensor, actions: th.Tensor) -> th.Tensor:
    """``(n,)`` SB3's `DiagGaussianDistribution` log-density of ``actions (n, out)`` at ``mean (n, out)``
    and ``log_std (out,)``: the same tensor operations in the same order as its
    ``proba_distribution`` and torch's ``Normal.log_prob`` (so the same bits and gradients), without
    building a `torch.distributions.Normal` per minibatch (its argument checks and broadcasting
    were ~7 % of a behaviour-cloning step)."""
    std = th.ones_like(mean) * log_std.exp()
    var = std**2
    log_prob = -((actions - mean) ** 2) / (2 * var) - std.log() - math.log(math.sqrt(2 * math.pi))
    return log_prob.sum(dim=1) if log_prob.dim() > 1 else log_prob.sum()


class NeglogpLoss:
    """imitation's BC loss with ``ent_weight = l2_weight = 0`` (how `behaviour_clone` calls it),
    computed without its zero-weighted parts.

    imitation's `BehaviorCloningLossCalculator` evaluates the whole actor-critic (the value network
    too), the entropy and the squared norm of every parameter at each minibatch, then multiplies
    the last two by 0: on a 64-64 policy that was a third of a behaviour-cloning step's time
    (2.15 -> 1.3-1.5 ms per 256-row step, 1 thread). This runs the
    same actor operations in the same order; the loss is ``-mean(log_prob)`` bit for bit (imitation
    adds ``±0.0`` twice) and each parameter's gradient is the same (imitation adds exact zeros to
    it), so the fitted weights do not change (tests/test_scale.py compares them).
    """

    def __call__(self, policy: ActorCriticPolicy, obs: Any, acts: Any) -> bc.BCTrainingMetrics:
        obs_t = th.as_tensor(obs)
        acts_t = th.as_tensor(acts)
        features = policy.extract_features(obs_t)
        assert isinstance(features, th.Tensor)  # one shared extractor (`behaviour_clone` checks it)
        latent_pi = policy.mlp_extractor.forward_actor(features)
        if type(policy.action_dist) is DiagGaussianDistribution:
            log_prob = _diag_gaussian_log_prob(policy.action_net(latent_pi), policy.log_std, acts_t)
        else:
            log_prob = policy._get_action_dist_from_latent(latent_pi).log_prob(acts_t)
        neglogp = -log_prob.mean()
        zero = th.zeros(())
        with th.no_grad():
            prob_true_act = th.exp(log_prob).mean()
        return bc.BCTrainingMetrics(neglogp=neglogp, entropy=None, ent_loss=zero, prob_true_act=prob_true_act,
                                    l2_norm=zero, l2_loss=zero, loss=neglogp)


class ShuffledBatches:
    """The minibatches imitation's BC reads, as its own `DataLoader` would make them, but fast.

    imitation wraps the demonstrations in a torch `DataLoader` (shuffled, last partial batch
    dropped) whose collate step builds every sample as a Python dict and stacks them: on a large
    log that was most of a twin's fit time (docs/benchmarks/scale/README.md). This yields the same
    batches by indexing two tensors with the same permutations, drawn the same way from torch's
    global generator (per epoch: the loader iterator's base seed, then the sampler's seed, then
    ``randperm`` on a generator seeded with it), so a fit gives the same weights as before
    (tests/test_parallel.py checks the batches against the `DataLoader`'s).

    Args:
        x: ``(n, in)`` float32 inputs; y: ``(n, out)`` float32 targets; batch_size: rows per batch.
    """

    def __init__(self, x: np.ndarray, y: np.ndarray, batch_size: int) -> None:
        # copies: imitation's Transitions froze the arrays, and torch warns on read-only memory
        self.obs = th.from_numpy(np.array(x, np.float32))
        self.acts = th.from_numpy(np.array(y, np.float32))
        self.batch_size = int(batch_size)

    def __iter__(self) -> Iterator[itypes.TransitionMapping]:
        n, b = len(self.obs), self.batch_size
        th.empty((), dtype=th.int64).random_()  # the DataLoader iterator's base seed (no workers: unused)
        generator = th.Generator()
        generator.manual_seed(int(th.empty((), dtype=th.int64).random_().item()))
        perm = th.randperm(n, generator=generator)
        for k in range(n // b):
            idx = perm[k * b : (k + 1) * b]
            # index_select: the rows of advanced indexing, without its generic indexing path
            yield {"obs": th.index_select(self.obs, 0, idx), "acts": th.index_select(self.acts, 0, idx)}


# --------------------------------------------------------------------------- the client's environment
class ClientVecEnv(VecEnv):
    """A simulated world of sites as an SB3 VecEnv whose sub-envs are one scenario's agents.

    Observation: the client inputs ``X`` of `edgetwin.imitation.steps.client_features`.
    Action: the client's standardised outputs (``[response, kpi, reward?, Δstate?]``).
    Reward: 0 (GAIL replaces it with the discriminator's). Every episode lasts ``horizon`` ticks;
    at reset a new population is sampled (same composition, new profiles and initial states).

    Args:
        layout: the twin's layout.
        learner: scenario id whose agents are the sub-envs.
        scenario, site: ``(N,)`` the fixed composition of the world (must contain the learner).
        profiles: samples raw profiles per scenario (GAN-SMMSG).
        initial: initial states matched to profiles.
        engines: per scenario, the engine policy (engine inputs -> standardised actions).
        clients: per scenario, the current client models (used for the non-learner agents).
        horizon: ticks per episode.
        seed: seeds the world's generator.
        transition: per scenario, the site-aware transition model (`fit_transition`), or None to
            move the state by the clients' own ``Δstate``.
        site_model: moves the site-level state columns (`edgetwin.imitation.site_model.SiteStateModel`).
    """

    render_mode = None

    def __init__(
        self,
        layout: Layout,
        learner: int,
        scenario: np.ndarray,
        site: np.ndarray,
        profiles: ProfileSampler,
        initial: InitialStates,
        engines: Mapping[int, GaussianModel],
        clients: Mapping[int, GaussianModel],
        horizon: int,
        seed: int = 0,
        transition: Mapping[int, GaussianModel] | None = None,
        site_model: SiteStateModel | None = None,
    ) -> None:
        self.layout = layout
        self.transition = transition
        self.site_model = site_model
        self.learner = learner
        self.scenario = scenario
        self.site = site
        self.rows = np.flatnonzero(scenario == learner)
        if len(self.rows) == 0:
            raise ValueError(f"the world has no agent of scenario {learner}")
        self.profiles = profiles
        self.initial = initial
        self.engines = engines
        self.clients = clients
        self.horizon = max(1, int(horizon))
        self.rng = np.random.default_rng(seed)
        obs_space = gym.spaces.Box(-np.inf, np.inf, (layout.n_client_inputs,), np.float32)
        act_space = gym.spaces.Box(-OUTPUT_CLIP, OUTPUT_CLIP, (layout.n_model_outputs,), np.float32)
        super().__init__(len(self.rows), obs_space, act_space)
        self.world: World | None = None
        self._x = np.zeros((len(scenario), layout.n_client_inputs), np.float32)
        self._action = np.zeros((len(scenario), len(layout.action)))
        self._pending: np.ndarray | None = None

    # --- world mechanics ------------------------------------------------------------------
    def _new_world(self) -> None:
        lay = self.layout
        profile = np.zeros((len(self.scenario), len(lay.profile)))
        for s in np.unique(self.scenario):
            idx = np.flatnonzero(self.scenario == s)
            profile[idx] = self.profiles(len(idx), lay.scenarios[s], int(self.rng.integers(2**31)))
        state = self.initial.sample(lay, self.scenario, profile, self.rng)
        profile = site_consistent(lay, profile, self.site, "profile")
        state = site_consistent(lay, state, self.site, "state")
        n_sites = int(self.site.max()) + 1
        self.world = World(
            lay, self.scenario, self.site, profile, state, np.zeros((n_sites, lay.n_lag)), site_model=self.site_model
        )
        self._decide()

    def _decide(self) -> None:
        """Engine actions for every agent at the current tick, then everyone's client inputs."""
        assert self.world is not None
        xe = self.world.engine_inputs()
        za = np.zeros((self.world.n, len(self.layout.action)), np.float32)
        for s in np.unique(self.scenario):
            idx = np.flatnonzero(self.scenario == s)
            za[idx] = self.engines[s].sample(xe[idx], self.rng)
        self._action = self.layout.scalers["action"].inverse(za)
        self._x = self.world.client_inputs(self._action)

    # --- VecEnv API -----------------------------------------------------------------------
    def reset(self) -> np.ndarray:
        self._new_world()
        return self._x[self.rows].copy()

    def step_async(self, actions: np.ndarray) -> None:
        self._pending = np.asarray(actions, dtype=np.float32)

    def step_wait(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[dict[str, Any]]]:
        assert self.world is not None and self._pending is not None
        y = np.zeros((self.world.n, self.layout.n_model_outputs), np.float32)
        y[self.rows] = np.clip(self._pending, -OUTPUT_CLIP, OUTPUT_CLIP)
        for s in np.unique(self.scenario):
            if s == self.learner:
                continue
            idx = np.flatnonzero(self.scenario == s)
            y[idx] = self.clients[s].sample(self._x[idx], self.rng)
        self.world.apply(self._action, y, self.transition)
        n = self.num_envs
        rewards = np.zeros(n, np.float32)
        if self.world.t >= self.horizon:
            # terminal obs: the inputs the client would see next, under fresh engine actions
            self._decide()
            terminal = self._x[self.rows].copy()
            self._new_world()
            infos = [{"terminal_observation": terminal[i]} for i in range(n)]
            return self._x[self.rows].copy(), rewards, np.ones(n, bool), infos
        self._decide()
        return self._x[self.rows].copy(), rewards, np.zeros(n, bool), [{} for _ in range(n)]

    def close(self) -> None:
        pass

    def get_attr(self, attr_name: str, indices: Any = None) -> list[Any]:
        return [getattr(self, attr_name)] * len(self._indices(indices))

    def set_attr(self, attr_name: str, value: Any, indices: Any = None) -> None:
        setattr(self, attr_name, value)

    def env_method(self, method_name: str, *args: Any, indices: Any = None, **kwargs: Any) -> list[Any]:
        return [getattr(self, method_name)(*args, **kwargs) for _ in self._indices(indices)]

    def env_is_wrapped(self, wrapper_class: type, indices: Any = None) -> list[bool]:
        return [False] * len(self._indices(indices))

    def _indices(self, indices: Any) -> list[int]:
        if indices is None:
            return list(range(self.num_envs))
        return [indices] if isinstance(indices, int) else list(indices)


# --------------------------------------------------------------------------- training
@dataclass
class MailConfig:
    """Hyper-parameters of MAIL-MMSG (defaults sized for 2 CPU cores).

    Attributes:
        bc_epochs: epochs of behaviour cloning (engine policies and client pre-training).
        bc_max_steps: cap on each behaviour-cloning fit's gradient steps (256-row minibatches;
            0: no cap). ``bc_epochs`` sets the budget on small logs; past
            ``bc_max_steps * 256 / bc_epochs`` rows of a scenario (64,000 at the defaults) the cap
            does, so a fit's cost stops growing with rows x epochs (docs/benchmarks/scale/README.md).
        rounds: adversarial rounds; each is one GAIL round (PPO + discriminator) per scenario.
            0 gives the behaviour-cloned client only.
        world_agents: agents in each scenario's training world (drawn from logged site units).
        n_steps: PPO rollout length per round (ticks).
        learning_rate: PPO learning rate (small: the policy starts from BC and must not forget it).
        net_arch: hidden layers of client and engine policies (seed 004: 2 x 32 for the engine).
        disc_arch: hidden layers of the discriminator (seed 004: a 4-layer MLP).
        demo_batch_size: expert samples per discriminator batch.
        n_disc_updates: discriminator updates per round.
        gamma: discount (seed 004: 0.95).
    """

    bc_epochs: int = 20
    bc_max_steps: int = 5000
    rounds: int = 10
    world_agents: int = 64
    n_steps: int = 32
    learning_rate: float = 1e-4
    net_arch: list[int] = field(default_factory=lambda: [64, 64])
    engine_arch: list[int] = field(default_factory=lambda: [32, 32])
    disc_arch: tuple[int, ...] = (64, 64, 64)
    demo_batch_size: int = 256
    n_disc_updates: int = 4
    gamma: float = 0.95

    @classmethod
    def from_hyper(cls, hyper: Mapping[str, Any]) -> MailConfig:
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in hyper.items() if k in known})


@dataclass
class MailResult:
    """What `fit_mail` learned, per scenario id.

    Attributes:
        clients: client policies (client inputs -> standardised outputs).
        engines: behaviour-cloned engine policies (engine inputs -> standardised actions).
        history: one row per (round, scenario): discriminator loss/accuracy and BC fit.
        transition: the site-aware transition models it trained against, if any.
    """

    clients: dict[int, ActorCriticPolicy]
    engines: dict[int, ActorCriticPolicy]
    history: pd.DataFrame
    transition: dict[int, ActorCriticPolicy] | None = None


def _minibatch(n_batch: int, target: int = 256) -> int:
    """The divisor of the rollout size nearest ``target`` (SB3 warns about ragged minibatches)."""
    divisors = [d for d in range(1, n_batch + 1) if n_batch % d == 0]
    return min(divisors, key=lambda d: abs(d - target))


def fit_engines(steps: StepTable, layout: Layout, cfg: MailConfig, seed: int) -> dict[int, ActorCriticPolicy]:
    """Behaviour-clone the logged platform policy per scenario (eq. 7 of seed 004)."""
    engines: dict[int, ActorCriticPolicy] = {}
    for s in range(len(layout.scenarios)):
        rows = steps.rows(s)
        th.manual_seed(seed + s)
        pol = gaussian_policy(layout.n_engine_inputs, len(layout.action), cfg.engine_arch)
        if len(rows):
            behaviour_clone(steps.x_engine[rows], steps.za[rows], pol, cfg.bc_epochs, seed + s,
                            max_steps=cfg.bc_max_steps)
        engines[s] = pol
    return engines


def fit_transition(
    steps: StepTable, layout: Layout, cfg: MailConfig, seed: int
) -> dict[int, ActorCriticPolicy] | None:
    """Fit the site-aware transition ``Δz(state) | transition_features`` per scenario.

    The client model answers each agent at once, so it only sees its site's *previous* tick. The
    next state, though, is applied at the end of the tick, when every agent's action and output
    is known, and site-level state (a site's load, its reservations) follows the whole site's
    actions of that tick: this model sees them, and the agent's own outputs (so the next state
    agrees with the sampled response). Columns in ``layout.state_absolute`` are predicted as next
    values, the others as changes. Fitted by maximum likelihood like the engine policies
    (`behaviour_clone`); the twin uses its mean.

    Returns:
        per scenario id, a Gaussian policy over `Layout.n_transition_inputs` inputs, or None when
        the spec names a transition function (nothing to learn).
    """
    if not layout.learn_transition or steps.site_now is None:
        return None
    ny = layout.n_outputs
    models: dict[int, ActorCriticPolicy] = {}
    for s in range(len(layout.scenarios)):
        rows = steps.rows(s, need_next=True)
        th.manual_seed(seed + 300 + s)
        pol = gaussian_policy(layout.n_transition_inputs, len(layout.state), cfg.net_arch)
        if len(rows):
            x = transition_features(steps.x_client[rows], steps.y_client[rows, :ny], steps.site_now[rows])
            target = steps.y_client[rows, ny:]
            if any(layout.state_absolute):
                # weakly persistent columns: the next value itself (client inputs hold z(state))
                zs = steps.x_client[rows, len(layout.profile) : len(layout.profile) + len(layout.state)]
                target = np.where(np.asarray(layout.state_absolute, dtype=bool), zs + target, target)
            behaviour_clone(x, target, pol, cfg.bc_epochs, seed + 300 + s, max_steps=cfg.bc_max_steps)
        models[s] = pol
    return models


def client_rows(steps: StepTable, layout: Layout, scenario: int) -> np.ndarray:
    """Rows usable as client targets: all, or only those with a next row when Δstate is learned."""
    return steps.rows(scenario, need_next=layout.learn_transition)


def training_world(
    steps: StepTable, layout: Layout, composition: Composition, cfg: MailConfig, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """One world composition for all scenarios' client envs: ``(scenario (N,), site (N,))`` ids.

    Drawn from the logged site units, large enough to hold every scenario that has client rows (a
    rare scenario missing from the drawn units gets one site of its own).
    """
    rng = np.random.default_rng(seed)
    scen, site = composition.sample(rng, cfg.world_agents)
    for s in range(len(layout.scenarios)):
        if not (scen == s).any() and len(client_rows(steps, layout, s)):
            extra = max(1, int(composition.units[:, s].max()))
            scen = np.concatenate([scen, np.full(extra, s)])
            site = np.concatenate([site, np.full(extra, site.max() + 1)])
    return scen, site


@dataclass
class ClientLearners:
    """Per scenario: the client policy, and where the scenario has agents in the training world,
    its `ClientVecEnv` and the PPO learner that owns the policy (the generator of GAIL).

    ``models`` wraps each policy as a `GaussianModel`; the envs read it for non-learner agents,
    so loading new weights into a policy in place is seen by every env.
    """

    clients: dict[int, ActorCriticPolicy]
    models: dict[int, GaussianModel]
    envs: dict[int, ClientVecEnv]
    ppos: dict[int, PPO]


def client_learners(
    steps: StepTable,
    layout: Layout,
    scen: np.ndarray,
    site: np.ndarray,
    profiles: ProfileSampler,
    initial: InitialStates,
    engine_models: Mapping[int, GaussianModel],
    cfg: MailConfig,
    seed: int,
    transition_models: Mapping[int, GaussianModel] | None = None,
    site_model: SiteStateModel | None = None,
    pretrain: Callable[[int, ActorCriticPolicy], None] | None = None,
) -> ClientLearners:
    """Build each scenario's client policy (a PPO learner's policy where the world has its agents,
    a plain Gaussian policy otherwise), calling ``pretrain(s, policy)`` right after each is built.

    MAIL-MMSG's pre-training is behaviour cloning (`fit_mail`); a federated site instead loads the
    global weights. Seeds: scenario ``s`` draws from ``seed + 100 + s`` (policy) and ``seed + 200 + s``
    (its env).
    """
    out = ClientLearners({}, {}, {}, {})
    for s in range(len(layout.scenarios)):
        th.manual_seed(seed + 100 + s)
        if (scen == s).any():
            out.envs[s] = ClientVecEnv(
                layout,
                s,
                scen,
                site,
                profiles,
                initial,
                engine_models,
                out.models,
                layout.horizon,
                seed + 200 + s,
                transition_models,
                site_model,
            )
            n_batch = cfg.n_steps * out.envs[s].num_envs
            out.ppos[s] = PPO(
                "MlpPolicy",
                out.envs[s],
                n_steps=cfg.n_steps,
                batch_size=_minibatch(n_batch),
                n_epochs=4,
                learning_rate=cfg.learning_rate,
                clip_range=0.1,
                gamma=cfg.gamma,
                ent_coef=0.0,
                policy_kwargs={"net_arch": {"pi": cfg.net_arch, "vf": cfg.net_arch}},
                seed=seed + 100 + s,
                device="cpu",
            )
            policy = out.ppos[s].policy
        else:
            policy = gaussian_policy(layout.n_client_inputs, layout.n_model_outputs, cfg.net_arch)
        if pretrain is not None:
            pretrain(s, policy)
        out.clients[s] = policy
        out.models[s] = GaussianModel(policy)
    return out


def gail_trainers(steps: StepTable, layout: Layout, learners: ClientLearners, cfg: MailConfig) -> dict[int, GAIL]:
    """One `imitation` GAIL trainer per scenario with a PPO learner and >= 2 logged client rows:
    its demonstrations are the scenario's logged client steps, its discriminator a fresh
    `BasicRewardNet` (``cfg.disc_arch``) drawn from torch's global generator."""
    trainers: dict[int, GAIL] = {}
    for s, ppo in learners.ppos.items():
        rows = client_rows(steps, layout, s)
        if len(rows) < 2:
            continue
        env = learners.envs[s]
        obs = steps.x_client[rows]
        # the discriminator sees (obs, act) only (``use_next_state=False``), so next_obs is the
        # obs array itself: `imitation` requires the field, and a copy of the next rows' inputs
        # would be one more table the size of the client inputs in a worker (0.26 GiB at 1M rows)
        demos = itypes.Transitions(
            obs=obs,
            acts=np.clip(steps.y_client[rows], -OUTPUT_CLIP, OUTPUT_CLIP),
            next_obs=obs,
            dones=~steps.has_next[rows],
            infos=np.array([{}] * len(rows), dtype=object),
        )
        n_batch = cfg.n_steps * env.num_envs
        reward_net = BasicRewardNet(
            env.observation_space, env.action_space, use_next_state=False, hid_sizes=cfg.disc_arch
        )
        trainers[s] = GAIL(
            demonstrations=demos,
            demo_batch_size=min(cfg.demo_batch_size, len(rows), n_batch),
            venv=env,
            gen_algo=ppo,
            reward_net=reward_net,
            n_disc_updates_per_round=cfg.n_disc_updates,
            custom_logger=_quiet_logger(),
            allow_variable_horizon=False,
        )
    return trainers


def gail_round(trainer: GAIL, cfg: MailConfig) -> dict[str, float]:
    """One adversarial round of one scenario (Algorithm 2's inner step): a PPO update of the client
    policy on the discriminator's reward over ``trainer.gen_train_timesteps`` steps, then
    ``cfg.n_disc_updates`` discriminator updates. Returns the last update's statistics."""
    trainer.train_gen(trainer.gen_train_timesteps)
    stats: Mapping[str, float] = {}
    for _ in range(cfg.n_disc_updates):
        stats = trainer.train_disc()
    return {
        "disc_loss": float(stats.get("disc_loss", np.nan)),
        "disc_acc": float(stats.get("disc_acc", np.nan)),
        "disc_acc_expert": float(stats.get("disc_acc_expert", np.nan)),
        "disc_acc_gen": float(stats.get("disc_acc_gen", np.nan)),
    }


def fit_mail(
    steps: StepTable,
    layout: Layout,
    profiles: ProfileSampler,
    initial: InitialStates,
    composition: Composition,
    cfg: MailConfig | None = None,
    seed: int = 0,
    progress: bool = False,
    transition: Mapping[int, ActorCriticPolicy] | None = None,
    site_model: SiteStateModel | None = None,
) -> MailResult:
    """Run MAIL-MMSG: BC pre-training, then ``cfg.rounds`` of GAIL per scenario, round-robin.

    The steps are public (`training_world`, `client_learners`, `gail_trainers`, `gail_round`) so
    that a federated fit runs the same rounds on each site's own logs
    (`edgetwin.federation.twin.mail`).

    Args:
        steps: the training log as arrays (`edgetwin.imitation.steps.build_steps`).
        layout: the twin's layout.
        profiles: samples raw profiles of a scenario (the population model ``P^c``).
        initial: initial states matched to profiles.
        composition: logged site units (how many agents of each scenario share a site).
        cfg: hyper-parameters.
        seed: seeds every random choice; the same seed gives the same result.
        progress: show a tqdm bar.
        transition: site-aware transition models (`fit_transition`) that move the training
            worlds' state; None: the clients' own ``Δstate``.
        site_model: moves the training worlds' site-level state columns (as in the twin).
    """
    cfg = cfg or MailConfig()
    transition_models = (
        {s: GaussianModel(p) for s, p in transition.items()} if transition is not None else None
    )
    n_scen = len(layout.scenarios)
    engines = fit_engines(steps, layout, cfg, seed)
    engine_models = {s: GaussianModel(p) for s, p in engines.items()}
    scen, site = training_world(steps, layout, composition, cfg, seed)

    history: list[dict[str, Any]] = []
    bar = tqdm(total=n_scen * (1 + cfg.rounds), desc="MAIL-MMSG", disable=not progress, leave=False)

    def pretrain(s: int, policy: ActorCriticPolicy) -> None:
        rows = client_rows(steps, layout, s)
        fit = (
            behaviour_clone(
                steps.x_client[rows], steps.y_client[rows], policy, cfg.bc_epochs, seed + s,
                max_steps=cfg.bc_max_steps,
            )
            if len(rows)
            else {"neglogp": float("nan"), "mse": float("nan")}
        )
        history.append(
            {"round": 0, "scenario": layout.scenarios[s], "bc_mse": fit["mse"], "bc_neglogp": fit["neglogp"]}
        )
        bar.update(1)

    learners = client_learners(
        steps, layout, scen, site, profiles, initial, engine_models, cfg, seed, transition_models, site_model, pretrain
    )
    if cfg.rounds > 0:
        trainers = gail_trainers(steps, layout, learners, cfg)
        for r in range(1, cfg.rounds + 1):
            for s, trainer in trainers.items():
                history.append({"round": r, "scenario": layout.scenarios[s], **gail_round(trainer, cfg)})
                bar.update(1)
    bar.close()
    return MailResult(
        clients=learners.clients,
        engines=engines,
        history=pd.DataFrame(history),
        transition=dict(transition) if transition is not None else None,
    )
