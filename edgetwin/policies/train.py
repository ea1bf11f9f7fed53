"""Train platform policies in a twin (or any per-agent environment) with SB3 and sb3-contrib.

`train_policy` wires SB3's own pieces together: a vectorised environment (the twin's
one-sub-env-per-agent `VecEnv`, or copies of a Gymnasium env), the safety shield, an action
rescaling to [-1, 1] (or a grid for MaskablePPO), `VecMonitor`, `VecNormalize`, TensorBoard,
`CheckpointCallback` with resume, and early stopping on a held-out validation environment
(`EvalCallback` + `StopTrainingOnNoModelImprovement`), so that a policy that only looks good in the
twin it trains in is caught. The result is exported with `edgetwin.policies.export`.

Against twin error, training in a twin is support-aware by default: every step's reward is
reduced by ``SUPPORT_PENALTY`` x the ensemble's disagreement on it (MOPO-style, Yu et al. 2020:
the members disagree where the logs are thin, so the policy is pulled toward what the twin can
vouch for rather than toward the centre of the action box). Seed 004's action-norm regulariser
(eq. 8, λ = 0.4, `edgetwin.policies.regularised`) stays an option (``action_norm_lambda``); it is
the default only for environments that are not twins (no ensemble to disagree).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import gymnasium as gym
import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import (
    BaseCallback,
    CallbackList,
    CheckpointCallback,
    EvalCallback,
    StopTrainingOnNoModelImprovement,
)
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.logger import HumanOutputFormat, Logger
from stable_baselines3.common.vec_env import VecEnv, VecEnvWrapper, VecMonitor, VecNormalize
from stable_baselines3.common.vec_env.base_vec_env import VecEnvObs

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import RewardFn, TwinSpec
from edgetwin.policies.export import ALGORITHMS, ActionTransform, _import, export_policy
from edgetwin.policies.lagrangian import KPIConstraint, LagrangeMultiplierUpdate, LagrangianReward
from edgetwin.policies.regularised import (
    ACTION_NORM_LAMBDA,
    RegularisedActorCriticPolicy,
    RegularisedRecurrentPolicy,
)
from edgetwin.policies.shield import Shield, ShieldConfig, ShieldVecEnvWrapper

#: Default weight of the ensemble-disagreement penalty when training in a twin (MOPO's λ = 1: the
#: reward minus one unit per unit of the members' mean output standard deviation, in standardised units).
SUPPORT_PENALTY = 1.0

Algo = Literal["ppo", "a2c", "sac", "td3", "maskable_ppo", "recurrent_ppo", "dual_critic_ppo"]
ON_POLICY = ("ppo", "a2c", "maskable_ppo", "recurrent_ppo", "dual_critic_ppo")
EnvSource = Any  # Twin | VecEnv | gym.Env | Callable[[], gym.Env]


def quiet_logger(verbose: int = 0) -> Logger:
    """An SB3 logger that writes no files: stdout when ``verbose`` > 0, else nothing.

    Without a custom logger SB3 creates an empty ``$TMPDIR/SB3-<timestamp>`` folder on every
    ``learn()`` call; agents that learn once per federated round would leave thousands.
    """
    return Logger(folder=None, output_formats=[HumanOutputFormat(sys.stdout)] if verbose > 0 else [])


# ------------------------------------------------------------------------------- action wrappers


class RescaleActionVecEnv(VecEnvWrapper):
    """The agent acts in [-1, 1]^A; the wrapped env receives ``low + (a + 1)/2 (high - low)``."""

    def __init__(self, venv: VecEnv, low: np.ndarray, high: np.ndarray) -> None:
        self.transform = ActionTransform("box", [float(x) for x in low], [float(x) for x in high])
        space = spaces.Box(-1.0, 1.0, (len(low),), np.float32)
        super().__init__(venv, action_space=space)

    def reset(self) -> VecEnvObs:
        return self.venv.reset()

    def step_async(self, actions: np.ndarray) -> None:
        self.venv.step_async(self.transform.apply(np.asarray(actions).reshape(self.num_envs, -1)))

    def step_wait(self) -> Any:
        return self.venv.step_wait()


class GridActionVecEnv(VecEnvWrapper):
    """The agent picks one grid value per action column (MultiDiscrete); for MaskablePPO.

    Discrete spec columns use their allowed values; continuous ones ``bins`` evenly spaced values.
    ``action_masks()`` comes from the shield: residency and migration caps for discrete columns,
    and, for continuous ones, grid values below the SLO guard's lower bound are masked out.
    """

    def __init__(
        self,
        venv: VecEnv,
        spec: TwinSpec,
        low: np.ndarray,
        high: np.ndarray,
        bins: int,
        shield: Shield | None,
    ) -> None:
        grid: list[list[float]] = []
        for j, f in enumerate(spec.by_role("action")):
            vals = f.allowed_values()
            grid.append(
                sorted(float(v) for v in vals)
                if vals is not None
                else np.linspace(low[j], high[j], bins).tolist()
            )
        self.transform = ActionTransform("grid", grid=grid)
        self.shield = shield
        self._obs: np.ndarray | None = None
        # one column -> Discrete (what the priority-weighted softmax needs), else MultiDiscrete
        space = (
            spaces.Discrete(len(grid[0])) if len(grid) == 1 else spaces.MultiDiscrete([len(g) for g in grid])
        )
        super().__init__(venv, action_space=space)

    def reset(self) -> np.ndarray:
        self._obs = np.asarray(self.venv.reset(), dtype=np.float64)
        return self._obs

    def step_async(self, actions: np.ndarray) -> None:
        self.venv.step_async(self.transform.apply(np.asarray(actions).reshape(self.num_envs, -1)))

    def step_wait(self) -> Any:
        obs, rewards, dones, infos = self.venv.step_wait()
        self._obs = np.asarray(obs, dtype=np.float64)
        return obs, rewards, dones, infos

    def action_masks(self) -> np.ndarray:
        assert self._obs is not None
        return self.transform.masks(self._obs, self.shield)

    def has_attr(self, attr_name: str) -> bool:
        return attr_name == "action_masks" or self.venv.has_attr(attr_name)

    def env_method(self, method_name: str, *args: Any, indices: Any = None, **kwargs: Any) -> list[Any]:
        if method_name == "action_masks":
            masks = self.action_masks()
            idx = (
                range(self.num_envs)
                if indices is None
                else ([indices] if isinstance(indices, int) else indices)
            )
            return [masks[i] for i in idx]
        return self.venv.env_method(method_name, *args, indices=indices, **kwargs)


# ------------------------------------------------------------------------------- environments


def _is_twin(x: Any) -> bool:
    return hasattr(x, "make_vec_env") and hasattr(x, "spec") and hasattr(x, "layout")


def spec_of(source: EnvSource, spec: TwinSpec | None = None) -> TwinSpec:
    """The spec of an environment source (a twin's, a cluster env's ``spec_``/``cluster.spec``)."""
    if spec is not None:
        return spec
    if _is_twin(source):
        return source.spec
    for obj in (source, getattr(source, "unwrapped", None), getattr(source, "cluster", None)):
        for attr in ("spec_", "twin_spec"):
            s = getattr(obj, attr, None)
            if isinstance(s, TwinSpec):
                return s
        if obj is not None and isinstance(getattr(obj, "spec", None), TwinSpec):
            return obj.spec
    raise InputError("cannot tell the twin spec of this environment; pass spec=", "env")


def base_vec_env(
    source: EnvSource, n_envs: int, seed: int, reward: RewardFn | None = None, **twin_opts: Any
) -> VecEnv:
    """An SB3 VecEnv from a twin (one sub-env per agent), a VecEnv, a gym env or an env factory."""
    if _is_twin(source):
        venv = source.make_vec_env(seed=seed, **twin_opts)
        if reward is not None:
            # the twin's simulation scores each step's columns with its reward function
            venv.sim._reward_fn = reward
        return venv
    if reward is not None:
        raise InputError("a custom reward needs a twin (its steps expose every column)", "reward")
    if isinstance(source, VecEnv):
        source.seed(seed)
        return source
    if isinstance(source, gym.Env):
        if n_envs != 1:
            raise InputError("pass an env factory (a callable) to train on several copies", "n_envs")
        return make_vec_env(lambda: source, n_envs=1, seed=seed)
    if callable(source):
        return make_vec_env(source, n_envs=n_envs, seed=seed)
    raise InputError(
        f"cannot train on a {type(source).__name__}: expected a Twin, VecEnv, gym.Env or factory", "env"
    )


@dataclass
class EnvChain:
    """A training or evaluation VecEnv with what export needs to reproduce it."""

    venv: VecEnv
    transform: ActionTransform
    normalize: VecNormalize | None
    shield: Shield | None


def build_env(
    source: EnvSource,
    spec: TwinSpec,
    algo: Algo,
    n_envs: int = 4,
    seed: int = 0,
    shield: ShieldConfig | None = None,
    normalize: bool = True,
    training: bool = True,
    grid_bins: int = 5,
    reward: RewardFn | None = None,
    gamma: float = 0.99,
    grid: bool = False,
    **twin_opts: Any,
) -> EnvChain:
    """base -> shield -> action rescaling/grid -> VecMonitor -> VecNormalize."""
    venv = base_vec_env(source, n_envs, seed, reward=reward, **twin_opts)
    box = venv.action_space  # the shield wrapper below keeps this same space
    if not isinstance(box, spaces.Box):
        raise InputError(
            "the environment must take Box actions in spec units (as twins and the cluster do)", "env"
        )
    sh = Shield(spec, shield) if shield is not None else None
    if sh is not None:
        venv = ShieldVecEnvWrapper(venv, sh)
    low = np.asarray(box.low, np.float64)
    high = np.asarray(box.high, np.float64)
    if not (np.isfinite(low).all() and np.isfinite(high).all()):
        raise InputError("the action space must be bounded to rescale it", "env")
    if algo == "maskable_ppo" or grid:
        venv = GridActionVecEnv(venv, spec, low, high, grid_bins, sh)
    else:
        venv = RescaleActionVecEnv(venv, low, high)
    transform = venv.transform
    venv = VecMonitor(venv)
    norm = None
    if normalize:
        norm = VecNormalize(venv, training=training, norm_obs=True, norm_reward=training, gamma=gamma)
        venv = norm
    return EnvChain(venv, transform, norm, sh)


# ------------------------------------------------------------------------------- training


def minibatch_size(buffer: int, target: int = 128) -> int:
    """A mini-batch size for an on-policy rollout of ``buffer`` transitions: ``buffer`` itself when
    it is at most ``target``, else the divisor of ``buffer`` in ``[target/2, 2·target]`` closest
    to ``target`` (SB3 warns, and trains on a truncated last mini-batch, when the size does not
    divide the rollout: a twin's env count is its agents, e.g. 100 agents x 8 steps = 800 is not
    a multiple of 128, but of 100), and ``target`` when no such divisor exists."""
    if buffer <= target:
        return buffer
    near = [d for d in range(target // 2, 2 * target + 1) if buffer % d == 0]
    return min(near, key=lambda d: (abs(d - target), d)) if near else target


#: Small-problem defaults per algorithm (per sub-env rollout lengths scale with the env count).
def default_hyper(algo: Algo, n_envs: int) -> dict[str, Any]:
    if algo == "recurrent_ppo":  # sequences make each epoch costly: fewer, shorter
        n_steps = max(16, 512 // n_envs)
        return {
            "n_steps": n_steps,
            "batch_size": minibatch_size(n_steps * n_envs),
            "n_epochs": 3,
            "learning_rate": 3e-4,
            "gamma": 0.95,
        }
    if algo in ("ppo", "maskable_ppo", "dual_critic_ppo"):
        # short rollouts (~512 transitions) give many updates per step budget on small twins
        n_steps = max(8, 512 // n_envs)
        batch = minibatch_size(n_steps * n_envs)
        return {"n_steps": n_steps, "batch_size": batch, "n_epochs": 5, "learning_rate": 1e-3, "gamma": 0.95}
    if algo == "a2c":
        return {"n_steps": 8, "learning_rate": 1e-3, "gamma": 0.95}
    # off-policy: a few gradient steps per vectorised step, as many as on-policy sees per sample
    return {
        "learning_starts": 256,
        "batch_size": 256,
        "gradient_steps": max(1, n_envs // 8),
        "learning_rate": 1e-3,
        "gamma": 0.95,
        "buffer_size": 200_000,
    }


@dataclass
class TrainResult:
    """What `train_policy` produced."""

    model: BaseAlgorithm
    path: Path
    steps: int
    stopped_early: bool
    best_validation_return: float | None
    metadata: dict[str, Any] = field(default_factory=dict)


class _AuxLossLogger(BaseCallback):
    """Logs the regularisers' running means (``train/action_norm_loss``) after each update."""

    def _on_rollout_start(self) -> None:
        pop = getattr(self.model.policy, "pop_aux_log", None)
        if pop is not None:
            for k, v in pop().items():
                self.logger.record(f"train/{k}", v)

    def _on_step(self) -> bool:
        return True


_CKPT = re.compile(r"ckpt_(\d+)_steps\.zip$")


class _DataCheckpoint(CheckpointCallback):
    """SB3's checkpoints, resumable as data: the model's zip (of which `train_policy` reads only the
    tensors, with ``weights_only=True``: never the pickled ``data`` entry) and VecNormalize's
    statistics as npz. The replay buffer (a pickle in SB3) is not kept: an off-policy run resumes
    with its weights and an empty buffer. A checkpoint directory ends up inside the exported policy,
    which travels; so nothing in it may be code."""

    def _on_step(self) -> bool:
        if self.n_calls % self.save_freq == 0:
            save_checkpoint(self.model, Path(self.save_path), self.name_prefix)
        return True


def save_checkpoint(model: BaseAlgorithm, directory: Path, prefix: str = "ckpt") -> Path:
    """``model`` as a resumable checkpoint at its ``num_timesteps``: ``<prefix>_<steps>_steps.zip``
    and, with VecNormalize, its statistics as ``<prefix>_vecnormalize_<steps>_steps.npz`` (SB3's
    `CheckpointCallback` names). Returns the zip's path.

    Also called once when training ends (`train_policy`): SB3 calls a callback's ``_on_step``
    while it collects a rollout, before the update that rollout feeds, so the last periodic
    checkpoint holds the weights one update short of the run's end under the run's final step
    count; a run repeated in its directory resumed it and exported another policy than the run it
    repeats (the same seed, a different result). The end's checkpoint replaces it."""
    steps = int(model.num_timesteps)
    path = directory / f"{prefix}_{steps}_steps.zip"
    model.save(path)
    norm = model.get_vec_normalize_env()
    if norm is not None:
        arrays = {f"{which}.{k}": np.asarray(getattr(getattr(norm, which), k), np.float64)
                  for which in ("obs_rms", "ret_rms") for k in ("mean", "var", "count")}  # fmt: skip
        with open(directory / f"{prefix}_vecnormalize_{steps}_steps.npz", "wb") as f:
            np.savez(f, **arrays)  # type: ignore[arg-type]  # the stub lets **kwds fill allow_pickle
    return path


def _load_checkpoint_weights(model: BaseAlgorithm, path: Path) -> None:
    """Copy a checkpoint's tensors into a freshly built ``model``: its state dicts (networks and
    optimisers, ``exact_match``: exactly the model's own) and its torch variables (e.g. SAC's
    entropy coefficient), read by ``torch.load(weights_only=True)``; the zip's pickled ``data`` is
    never read (`load_from_zip_file(load_data=False)`).

    Raises:
        InputError: the checkpoint is not one of this model (naming it).
    """
    from stable_baselines3.common.save_util import load_from_zip_file
    from stable_baselines3.common.utils import get_device

    try:
        _, params, variables = load_from_zip_file(path, load_data=False, device=get_device("cpu"))
        model.set_parameters(params, exact_match=True, device="cpu")
        for name in model._get_torch_save_params()[1]:
            if variables is not None and name in variables:
                target = model
                *parents, last = name.split(".")
                for part in parents:
                    target = getattr(target, part)
                getattr(target, last).data.copy_(variables[name].data)
    except Exception as e:  # a checkpoint of another run, algorithm or SB3
        raise InputError(f"cannot resume from this checkpoint ({type(e).__name__}: {e})", str(path)) from None


def _checkpoint_steps(path: Path, default: int) -> int:
    """The ``num_timesteps`` a checkpoint zip records, read from its JSON ``data`` as plain JSON
    (SB3 writes it as a number; nothing there is unpickled); ``default`` if absent."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            value = json.loads(z.read("data")).get("num_timesteps")
    except (OSError, KeyError, ValueError, zipfile.BadZipFile):
        return default
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else default


def _load_normalize_stats(norm: VecNormalize, path: Path) -> None:
    """VecNormalize's running statistics from a checkpoint's npz (no pickle), when it has one."""
    if not path.is_file():
        return
    with np.load(path, allow_pickle=False) as z:
        for which in ("obs_rms", "ret_rms"):
            rms = getattr(norm, which)
            rms.mean, rms.var = z[f"{which}.mean"], z[f"{which}.var"]
            rms.count = float(z[f"{which}.count"])


def latest_checkpoint(directory: Path) -> tuple[Path, int] | None:
    """The newest ``ckpt_<steps>_steps.zip`` in ``directory``, with its step count."""
    found = [(int(m.group(1)), p) for p in directory.glob("ckpt_*_steps.zip") if (m := _CKPT.search(p.name))]
    if not found:
        return None
    steps, path = max(found)
    return path, steps


@dataclass(frozen=True)
class TrainConfig:
    """Everything `train_policy` is told besides where it trains: a typed config, as SB3's
    keyword arguments and RL Zoo's hyperparameter files are, that a user can keep in a TOML
    beside their logs (`TrainConfig.from_toml`) and override per call.

    Attributes:
        algo: ``ppo``, ``a2c``, ``sac``, ``td3``, ``maskable_ppo`` (on a grid of actions with the
            shield's masks), ``recurrent_ppo`` or ``dual_critic_ppo``.
        steps: total environment steps (transitions, summed over sub-envs).
        seed: the same seed gives the same policy (on the same machine and library versions).
        out: the exported policy directory; checkpoints go to ``out/checkpoints``.
        tensorboard_dir: TensorBoard logs, if given.
        checkpoint_every: steps between checkpoints (0 = none).
        resume: continue from the newest checkpoint in ``out/checkpoints`` if there is one and it was
            written by the same run (`run_identity`: the same environment or twin, seed, algorithm and
            settings; only ``steps`` may grow); checkpoints of another run are removed, with a warning.
        action_norm_lambda: λ of seed 004 eq. 8 for the on-policy algorithms (0 = off). Default:
            0 when training in a twin (the support-aware penalty regularises instead), else
            ``ACTION_NORM_LAMBDA`` (0.4).
        early_stop_on: a held-out validation env/twin; training stops after ``patience``
            evaluations (every ``eval_every`` steps) without a new best, and the best model on it
            is exported instead of the last.
        n_envs: copies for a gym env factory (a twin uses one sub-env per agent; ``twin_opts``
            such as ``n_agents`` and ``steps`` go to ``make_vec_env``).
        spec: the spec (inferred from a twin or the cluster env).
        shield: rules projected onto every action in training and exported with the policy.
        reward: a `RewardFn` over each step's columns replacing the spec's reward (twins only).
        constraints: `KPIConstraint` s (`edgetwin.policies.lagrangian`; e.g. ``constraints_from_log(spec,
            log)``: every guarded KPI held within its margin of the logging policy's mean): train the
            constrained objective by Lagrange multipliers (PPO-Lagrangian; twins only). None: the reward.
        dual_lr: the multipliers' dual-ascent step per rollout (with ``constraints``).
        normalize: VecNormalize observations and rewards (statistics are exported).
        hyper: algorithm keyword arguments over :func:`default_hyper`.
        policy_kwargs: SB3 ``policy_kwargs``.
        priority: `PriorityScores`: use the priority-weighted softmax of seed 001 eq. 10 (β = 2)
            over a grid of ``grid_bins`` values of the spec's single action column (ppo, a2c,
            maskable_ppo); the scores read the observation after normalisation.
        twin_opts: options of the twin's VecEnv (``n_agents``, ``steps``, ``disagreement_penalty``).
        metadata: extra metadata to export (``training_data_sha256``, ``metrics``, ...).
        progress: show a progress bar.
        verbose: SB3's verbosity.
    """

    algo: Algo = "ppo"
    steps: int = 10_000
    seed: int = 0
    out: str | Path = "policy"
    tensorboard_dir: str | Path | None = None
    checkpoint_every: int = 10_000
    resume: bool = True
    action_norm_lambda: float | None = None
    early_stop_on: EnvSource | None = None
    eval_every: int = 5_000
    patience: int = 3
    n_envs: int = 4
    spec: TwinSpec | None = None
    shield: ShieldConfig | None = None
    reward: RewardFn | None = None
    constraints: Sequence[KPIConstraint] | None = None
    dual_lr: float = 0.5
    normalize: bool = True
    hyper: Mapping[str, Any] | None = None
    policy_kwargs: Mapping[str, Any] | None = None
    priority: Any = None
    grid_bins: int = 5
    twin_opts: Mapping[str, Any] | None = None
    metadata: Mapping[str, Any] | None = None
    progress: bool = False
    verbose: int = 0

    #: the fields a TOML file may set: plain values and tables (objects such as a shield, a reward
    #: function or a validation twin are given in code; a config file is data, never code)
    FROM_FILE: ClassVar[dict[str, tuple[type, ...]]] = {
        "algo": (str,), "steps": (int,), "seed": (int,), "out": (str,), "tensorboard_dir": (str,),
        "checkpoint_every": (int,), "resume": (bool,), "action_norm_lambda": (int, float), "eval_every": (int,),
        "patience": (int,), "n_envs": (int,), "normalize": (bool,), "hyper": (dict,), "policy_kwargs": (dict,),
        "grid_bins": (int,), "twin_opts": (dict,), "progress": (bool,), "verbose": (int,), "dual_lr": (int, float),
    }  # fmt: skip

    def replace(self, **overrides: Any) -> TrainConfig:
        """This config with ``overrides`` (an unknown name is a `TypeError`, as a bad keyword is)."""
        import dataclasses

        return dataclasses.replace(self, **overrides)

    @classmethod
    def from_toml(cls, path: str | Path, section: str = "train") -> TrainConfig:
        """A config from the ``[train]`` table of a TOML file (or the whole file without one).

        Unknown keys and keys that name objects (``shield``, ``reward``, ...) are refused with an
        `InputError` naming the file and the key.
        """
        import tomllib

        path = Path(path)
        try:
            doc = tomllib.loads(path.read_text())
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
            raise InputError(f"cannot read the training config: {e}", str(path)) from None
        table = doc.get(section, doc)
        if not isinstance(table, dict):
            raise InputError(f"[{section}] must be a table", str(path))
        bad = sorted(set(table) - set(cls.FROM_FILE))
        if bad:
            raise InputError(f"unknown or code-only key(s) {bad}; a file may set {list(cls.FROM_FILE)}", str(path))
        for key, value in table.items():
            kinds = cls.FROM_FILE[key]
            if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
                want = " or ".join(k.__name__ for k in kinds)
                raise InputError(f"{section}.{key} must be {want}, got {value!r}", str(path))
        return cls(**table)


def train_policy(
    env_or_twin: EnvSource, config: TrainConfig | Algo | None = None, /, **overrides: Any
) -> TrainResult:
    """Train a platform policy and export it to ``config.out``.

    Args:
        env_or_twin: a `Twin` (trained on its one-sub-env-per-agent VecEnv), a VecEnv, a gym env
            or a factory of gym envs (``n_envs`` copies). Actions are Box in spec units.
        config: a `TrainConfig`, or just the algorithm's name (the older call
            ``train_policy(twin, "ppo", steps=...)`` keeps working).
        overrides: any `TrainConfig` field by name, over ``config``.

    Returns:
        A :class:`TrainResult` (the model, the export path, steps done, whether it stopped early).
    """
    if isinstance(config, str):
        overrides = {"algo": config, **overrides}
        config = None
    c = (config or TrainConfig()).replace(**overrides)
    algo, steps, seed, hyper, priority, grid_bins = c.algo, c.steps, c.seed, c.hyper, c.priority, c.grid_bins
    reward, shield, normalize, verbose, n_envs = c.reward, c.shield, c.normalize, c.verbose, c.n_envs
    _check_train_args(algo, steps, priority)
    spec = spec_of(env_or_twin, c.spec)
    out = Path(c.out)
    out.mkdir(parents=True, exist_ok=True)
    ckpt_dir = out / "checkpoints"
    hp = default_hyper(algo, n_envs)
    hp.update(hyper or {})
    topts, action_norm_lambda = _twin_defaults(env_or_twin, c.twin_opts, c.action_norm_lambda)
    grid = priority is not None
    lagrangian = None
    if c.constraints:
        if not _is_twin(env_or_twin):
            raise InputError("constraints act through the twin's per-step reward: train in a twin", "constraints")
        lagrangian = LagrangianReward(reward if reward is not None else spec.reward_fn(), c.constraints)
        reward = lagrangian
    chain = build_env(
        env_or_twin,
        spec,
        algo,
        n_envs,
        seed,
        shield,
        normalize,
        True,
        grid_bins,
        reward,
        gamma=hp.get("gamma", 0.99),
        grid=grid,
        **topts,
    )
    venv = chain.venv
    if _is_twin(env_or_twin):
        n_envs = venv.num_envs
        hp = {**default_hyper(algo, n_envs), **(hyper or {})}

    cls = _import(ALGORITHMS[algo])
    policy, pk = _policy_and_kwargs(algo, venv, priority, c.policy_kwargs, action_norm_lambda, hp)

    identity = run_identity(env_or_twin, spec, c, hp)
    found = _own_checkpoint(ckpt_dir, identity, c.resume, record=c.checkpoint_every > 0)
    model = cls(
        policy,
        venv,
        seed=seed,
        device="cpu",
        verbose=verbose,
        policy_kwargs=pk or None,
        tensorboard_log=None if c.tensorboard_dir is None else str(c.tensorboard_dir),
        **hp,
    )
    resumed_from = _resume_from(model, chain, ckpt_dir, found)
    if c.tensorboard_dir is None:
        model.set_logger(quiet_logger(verbose))

    callbacks: list[BaseCallback] = [_AuxLossLogger()]
    duals = None if lagrangian is None else LagrangeMultiplierUpdate(lagrangian, c.dual_lr)
    if duals is not None:
        callbacks.append(duals)
    if c.checkpoint_every > 0:
        callbacks.append(
            _DataCheckpoint(
                save_freq=max(c.checkpoint_every // venv.num_envs, 1),
                save_path=str(ckpt_dir),
                name_prefix="ckpt",
            )
        )
    eval_cb = None
    if c.early_stop_on is not None:
        eval_cb = _early_stop_callback(
            c.early_stop_on, spec, algo, n_envs, seed, shield, normalize, grid_bins,
            reward if lagrangian is None else lagrangian.scorer(), hp, grid, topts,
            train_envs=venv.num_envs, eval_every=c.eval_every, patience=c.patience, out=out, verbose=verbose,
        )  # fmt: skip
        callbacks.append(eval_cb)

    remaining = max(0, steps - model.num_timesteps)
    if remaining > 0:
        model.learn(
            total_timesteps=remaining,
            callback=CallbackList(callbacks),
            reset_num_timesteps=found is None,
            tb_log_name=algo,
            progress_bar=c.progress,
        )
        if c.checkpoint_every > 0:  # the end's weights under the end's step count (`save_checkpoint`)
            save_checkpoint(model, ckpt_dir)
    trained_steps = int(model.num_timesteps)
    stopped_early = trained_steps < steps
    best = _restore_best(model, eval_cb, out)

    meta = dict(c.metadata or {})
    meta.setdefault("metrics", {})
    meta.update(
        algorithm=algo,
        seed=seed,
        steps=trained_steps,
        best_model_steps=int(model.num_timesteps),
        stopped_early=stopped_early,
        action_norm_lambda=action_norm_lambda if algo in ON_POLICY else None,
        support_penalty=topts.get("disagreement_penalty"),
        best_validation_return=best,
        resumed_from=resumed_from,
        hyper=_jsonable(hp),
    )
    if _is_twin(env_or_twin):
        meta.setdefault("training_data_sha256", env_or_twin.meta.get("data_sha256"))
    if duals is not None:
        meta["constraints"] = [
            {"column": k.column, "limit": k.limit, "higher_is_better": k.higher_is_better, "lambda": float(lam),
             "last_violation": float(duals.history[-1][0][i]) if duals.history else None}
            for i, (k, lam) in enumerate(zip(duals.reward.constraints, duals.reward.lambdas, strict=True))
        ]  # fmt: skip
    export_policy(
        model,
        out,
        spec,
        metadata=meta,
        obs_norm=chain.normalize,
        action_transform=chain.transform,
        shield=chain.shield,
    )
    return TrainResult(model, out, trained_steps, stopped_early, best, meta)


def _check_train_args(algo: str, steps: int, priority: Any) -> None:
    """`train_policy`'s argument checks, before anything is built or written: one-line
    `InputError`s naming the flag, so a bad command fails before minutes of setup."""
    if algo not in ALGORITHMS:
        raise InputError(f"unknown algorithm {algo!r}; expected one of {sorted(ALGORITHMS)}", "--algo")
    if steps < 1:
        raise InputError(f"steps must be >= 1, got {steps}", "--steps")
    if priority is not None and algo not in ("ppo", "a2c", "maskable_ppo"):
        raise InputError(
            f"the priority-weighted softmax works with ppo, a2c and maskable_ppo, not {algo}", "--algo"
        )


def _twin_defaults(
    env_or_twin: EnvSource, twin_opts: Mapping[str, Any] | None, action_norm_lambda: float | None
) -> tuple[dict[str, Any], float]:
    """The regulariser defaults, which depend on what is trained in.

    In a twin the support-aware disagreement penalty regularises (on when the twin has more than
    one member) and the action-norm λ defaults to 0; elsewhere λ defaults to
    ``ACTION_NORM_LAMBDA``. Separate because both the training and the validation env use the
    resulting ``twin_opts``, and the λ goes into the policy and the exported metadata.

    Returns:
        (the ``make_vec_env`` options, the action-norm λ).
    """
    topts = dict(twin_opts or {})
    if _is_twin(env_or_twin):
        topts.setdefault("disagreement_penalty", SUPPORT_PENALTY if env_or_twin.n_members > 1 else 0.0)
        if action_norm_lambda is None:
            action_norm_lambda = 0.0
    elif action_norm_lambda is None:
        action_norm_lambda = ACTION_NORM_LAMBDA
    return topts, action_norm_lambda


def _policy_and_kwargs(
    algo: str,
    venv: Any,
    priority: Any,
    policy_kwargs: Mapping[str, Any] | None,
    action_norm_lambda: float,
    hp: dict[str, Any],
) -> tuple[Any, dict[str, Any]]:
    """The SB3 policy class and its ``policy_kwargs`` for ``algo``.

    The priority-weighted softmax (seed 001) when ``priority`` is given, the action-norm
    regularised actor-critics (seed 004 eq. 8) for the on-policy algorithms, SB3's MlpPolicy
    otherwise; dual-critic PPO takes λ as an algorithm argument, so it goes into ``hp`` (updated
    in place). Separate because this is the one place where the algorithm decides the network.
    """
    pk = dict(policy_kwargs or {})
    # small networks suit per-agent observations of tens of columns on a CPU
    if algo in ("sac", "td3"):
        pk.setdefault("net_arch", [64, 64])
    if algo == "recurrent_ppo":
        pk.setdefault("lstm_hidden_size", 64)
    policy: Any = "MlpPolicy"
    if priority is not None:
        if not isinstance(venv.action_space, spaces.Discrete):
            raise InputError(
                "the priority-weighted softmax needs a spec with one action column (options)", "priority"
            )
        from edgetwin.policies.priority import MaskablePriorityWeightedPolicy, PriorityWeightedPolicy

        policy = MaskablePriorityWeightedPolicy if algo == "maskable_ppo" else PriorityWeightedPolicy
        pk.setdefault("priority", priority)
    elif algo in ("ppo", "a2c"):
        policy = RegularisedActorCriticPolicy
        pk.setdefault("action_norm_lambda", action_norm_lambda)
    elif algo == "recurrent_ppo":
        policy = RegularisedRecurrentPolicy
        pk.setdefault("action_norm_lambda", action_norm_lambda)
    elif algo == "dual_critic_ppo":
        hp.setdefault("action_norm_lambda", action_norm_lambda)
    return policy, pk


def _stable(value: Any) -> Any:
    """``value`` as JSON the same in every process: callables and other objects by their qualified
    name (never a ``repr`` with a memory address)."""
    if isinstance(value, Mapping):
        return {str(k): _stable(v) for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))}
    if isinstance(value, (list, tuple)):
        return [_stable(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if is_dataclass(value) and not isinstance(value, type):
        return {"type": _stable(type(value)), **{f.name: _stable(getattr(value, f.name)) for f in fields(value)}}
    if isinstance(value, np.ndarray):
        return hashlib.sha256(np.ascontiguousarray(value).tobytes()).hexdigest() + str(value.shape)
    kind = value if isinstance(value, type) or callable(value) and hasattr(value, "__qualname__") else type(value)
    return f"{getattr(kind, '__module__', '')}.{getattr(kind, '__qualname__', type(kind).__name__)}"


def run_identity(env_or_twin: Any, spec: TwinSpec, c: TrainConfig, hyper: Mapping[str, Any]) -> str:
    """sha256 of what makes a training run this run, apart from its length: the environment (a twin
    by its metadata: data, spec, seed and settings, without its timings; a gym env factory by its
    name), the spec, algorithm, seed and settings.

    Why: a checkpoint left in ``out/checkpoints`` by another run (another twin, seed or setting;
    ``edgetwin demo --out`` an existing directory) must not be resumed: the policy would silently
    continue someone else's training, and the same seed would no longer give the same policy.
    """
    if _is_twin(env_or_twin):
        env: Any = {k: v for k, v in env_or_twin.meta.items() if "seconds" not in k and k != "versions"}
    else:
        env = _stable(env_or_twin)
    key = {"env": env, "spec": spec.hash(), "algo": c.algo, "seed": c.seed, "hyper": hyper, "n_envs": c.n_envs,
           "normalize": c.normalize, "shield": c.shield, "reward": c.reward, "constraints": c.constraints,
           "policy_kwargs": c.policy_kwargs, "priority": c.priority, "grid_bins": c.grid_bins,
           "action_norm_lambda": c.action_norm_lambda, "twin_opts": c.twin_opts}  # fmt: skip
    return hashlib.sha256(json.dumps(_stable(key), sort_keys=True, default=str).encode()).hexdigest()


#: The file in a checkpoint directory naming the run that wrote its checkpoints.
RUN_FILE = "run.json"


def _own_checkpoint(ckpt_dir: Path, identity: str, resume: bool, record: bool) -> tuple[Path, int] | None:
    """The newest checkpoint to resume, if ``resume`` and it is this run's (`run_identity`); the
    checkpoints of another run (or of one that did not record its identity) are removed with a
    warning, so that a later resume cannot mix two runs; with ``record`` (checkpoints will be
    written) the directory then names this run."""
    found = latest_checkpoint(ckpt_dir) if ckpt_dir.is_dir() else None
    try:
        recorded = json.loads((ckpt_dir / RUN_FILE).read_text()).get("identity")
    except (OSError, ValueError, AttributeError):
        recorded = None
    if found is not None and recorded != identity:
        stale = [*ckpt_dir.glob("ckpt_*_steps.zip"), *ckpt_dir.glob("ckpt_vecnormalize_*_steps.npz")]
        logging.getLogger("edgetwin.train").warning(
            "%s: %d checkpoint(s) of another run (other twin, seed or settings) removed, not resumed",
            ckpt_dir, len(stale))  # fmt: skip
        for f in stale:
            f.unlink()
        found = None
    if record:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        (ckpt_dir / RUN_FILE).write_text(json.dumps({"identity": identity}) + "\n")
    return found if resume else None


def _resume_from(model: Any, chain: Any, ckpt_dir: Path, found: tuple[Path, int] | None) -> str | None:
    """Load the newest checkpoint's weights, VecNormalize statistics and step count into the
    freshly built ``model``, if there is one; returns its path (for the metadata) or None.

    Separate because resuming is the only path where a model's state comes from disk before
    training; the weights are read from data files, never unpickled.
    """
    if found is None:
        return None
    path, done = found
    if chain.normalize is not None:
        _load_normalize_stats(chain.normalize, ckpt_dir / f"ckpt_vecnormalize_{done}_steps.npz")
    _load_checkpoint_weights(model, path)
    model.num_timesteps = done
    return str(path)


def _early_stop_callback(
    early_stop_on: EnvSource,
    spec: TwinSpec,
    algo: Algo,
    n_envs: int,
    seed: int,
    shield: ShieldConfig | None,
    normalize: bool,
    grid_bins: int,
    reward: RewardFn | None,
    hp: Mapping[str, Any],
    grid: bool,
    topts: Mapping[str, Any],
    *,
    train_envs: int,
    eval_every: int,
    patience: int,
    out: Path,
    verbose: int,
) -> BaseCallback:
    """The validation callback: the held-out env built like the training one (seed
    ``seed + 10_007``, statistics not updated), evaluated every ``eval_every`` steps, saving the
    best model to ``out/best`` and stopping after ``patience`` evaluations without a new best.

    Separate because the held-out env is a second env chain with its own seed; the maskable
    algorithm needs SB3-contrib's evaluator to apply the masks.
    """
    eval_chain = build_env(
        early_stop_on,
        spec,
        algo,
        n_envs,
        seed + 10_007,
        shield,
        normalize,
        False,
        grid_bins,
        reward,
        gamma=hp.get("gamma", 0.99),
        grid=grid,
        **topts,
    )
    stop = StopTrainingOnNoModelImprovement(
        max_no_improvement_evals=patience, min_evals=1, verbose=verbose
    )
    eval_cls = EvalCallback
    if algo == "maskable_ppo":
        from sb3_contrib.common.maskable.callbacks import MaskableEvalCallback

        eval_cls = MaskableEvalCallback
    return eval_cls(
        eval_chain.venv,
        callback_after_eval=stop,
        n_eval_episodes=max(eval_chain.venv.num_envs, 2),
        eval_freq=max(eval_every // train_envs, 1),
        best_model_save_path=str(out / "best"),
        deterministic=True,
        verbose=verbose,
    )


def _restore_best(model: Any, eval_cb: Any, out: Path) -> float | None:
    """With early stopping, swap the best model on the validation env back into ``model`` (with
    the step count it was saved at); returns its mean validation return, or None.

    Separate because what is exported is then the best model, not the last one trained.
    """
    if eval_cb is None or not (out / "best" / "best_model.zip").is_file():
        return None
    best = float(eval_cb.best_mean_reward)
    _load_checkpoint_weights(model, out / "best" / "best_model.zip")
    model.num_timesteps = _checkpoint_steps(out / "best" / "best_model.zip", model.num_timesteps)
    return best


def _jsonable(d: Mapping[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(dict(d), default=str))


def set_torch_threads(n: int = 1) -> None:
    """Small MLPs on shared cores run fastest single-threaded."""
    th.set_num_threads(n)


__all__ = [
    "EnvChain",
    "GridActionVecEnv",
    "SUPPORT_PENALTY",
    "RescaleActionVecEnv",
    "TrainResult",
    "build_env",
    "default_hyper",
    "minibatch_size",
    "latest_checkpoint",
    "run_identity",
    "spec_of",
    "train_policy",
]
