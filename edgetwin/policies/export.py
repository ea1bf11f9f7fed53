"""Exported policies: one directory that `load_policy` turns back into ``act(obs) -> actions``.

Layout of an exported policy directory::

    policy.json      format, kind, algorithm, spec hash, training data hash, metrics at promotion,
                     observation/action columns, the action transform, the shield
    spec.toml        the twin spec the policy acts in
    model.safetensors  the SB3 policy network (kind "sb3"): its state dict, and its architecture
                     (spaces, layer sizes, activation) as JSON in the header
                     (`edgetwin.imitation.networks`)
    obs_norm.npz     VecNormalize's observation statistics, when training normalised observations
    MANIFEST.json    sha256 of every file above (and of anything else in the directory, e.g.
                     training checkpoints): `edgetwin.contract.manifest`

`load_policy` verifies the manifest before it reads anything: a policy with a missing manifest,
an added, missing or changed file (``policy.json`` included) is refused with exit 2 naming the
file. Policies exported before manifests existed are refused too; re-export them.

**A policy is data, never code.** A manifest proves a directory intact, not who wrote it, so
nothing in it is unpickled, imported or evaluated: the network's class comes from the fixed
registry of the algorithm's policy classes (:data:`ALGORITHMS`, :func:`network_classes`) and its
weights from safetensors; a heuristic's class from :data:`POLICY_KINDS` by the kind's name (code
registers more with :func:`register_policy_kind`; a file only chooses among them); every array is
read with ``allow_pickle=False``. Policies of format ``edgetwin-policy/1`` (an SB3 ``model.zip``,
which SB3 reads with ``torch.load(weights_only=False)`` and cloudpickle, or a heuristic named by
``module:class``) are refused with a line that says to re-export them.

The loaded object works on raw, per-agent observations ``(N, O)`` in ``spec.observation_columns``
order and returns actions ``(N, A)`` in spec units, exactly as the model acted during training:
observations are normalised with the saved statistics, actions mapped back from the policy's
[-1, 1] box (or from grid indices for discrete policies), and projected by the shield if one was
exported. Heuristic baselines export as their class and configuration (kind "heuristic").
"""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgetwin.contract.errors import InputError
from edgetwin.contract.json_bounds import read_json
from edgetwin.contract.manifest import MANIFEST_FILE, SIGNATURE_FILE, verify_manifest, write_manifest
from edgetwin.contract.spec import TwinSpec

FORMAT = "edgetwin-policy/2"
#: Formats of older edgetwins that are refused with "re-export it" (they held pickles / class paths).
OLD_FORMATS = ("edgetwin-policy/1",)
#: The network file of an "sb3" policy.
MODEL_FILE = "model.safetensors"
#: Files every exported policy has (the manifest must list them).
_REQUIRED = ("policy.json", "spec.toml")
#: The longest ``policy.json`` read (bytes): its normaliser statistics are per column, kilobytes.
_MAX_POLICY_JSON_BYTES = 64 * 1024 * 1024

#: SB3 / sb3-contrib algorithm classes by the name metadata records.
ALGORITHMS: dict[str, str] = {
    "ppo": "stable_baselines3:PPO",
    "a2c": "stable_baselines3:A2C",
    "sac": "stable_baselines3:SAC",
    "td3": "stable_baselines3:TD3",
    "maskable_ppo": "sb3_contrib:MaskablePPO",
    "recurrent_ppo": "sb3_contrib:RecurrentPPO",
    "dual_critic_ppo": "edgetwin.policies.dual_critic:DualCriticPPO",
}


#: Per algorithm, the SB3 policy (network) classes it may hold, by name. A network file names one
#: of these; it cannot add one.
NETWORK_CLASSES: dict[str, tuple[str, ...]] = {
    "ppo": ("stable_baselines3.common.policies:ActorCriticPolicy",
            "edgetwin.policies.regularised:RegularisedActorCriticPolicy",
            "edgetwin.policies.priority:PriorityWeightedPolicy"),
    "a2c": ("stable_baselines3.common.policies:ActorCriticPolicy",
            "edgetwin.policies.regularised:RegularisedActorCriticPolicy",
            "edgetwin.policies.priority:PriorityWeightedPolicy"),
    "sac": ("stable_baselines3.sac.policies:SACPolicy",),
    "td3": ("stable_baselines3.td3.policies:TD3Policy",),
    "maskable_ppo": ("sb3_contrib.common.maskable.policies:MaskableActorCriticPolicy",
                     "edgetwin.policies.priority:MaskablePriorityWeightedPolicy"),
    "recurrent_ppo": ("sb3_contrib.common.recurrent.policies:RecurrentActorCriticPolicy",
                      "edgetwin.policies.regularised:RegularisedRecurrentPolicy"),
    "dual_critic_ppo": ("edgetwin.policies.dual_critic:DualCriticPolicy",),
}

#: Exportable non-network policies ("heuristic" kind) by the name ``policy.json`` records: edgetwin's
#: heuristics and candidates. `register_policy_kind` adds more, from code only.
POLICY_KINDS: dict[str, str] = {
    "RoundRobin": "edgetwin.policies.heuristics:RoundRobin",
    "LeastLoaded": "edgetwin.policies.heuristics:LeastLoaded",
    "BestFit": "edgetwin.policies.heuristics:BestFit",
    "ShortestJobFirst": "edgetwin.policies.heuristics:ShortestJobFirst",
    "LongestJobFirst": "edgetwin.policies.heuristics:LongestJobFirst",
    "GreedyLowestCarbon": "edgetwin.policies.heuristics:GreedyLowestCarbon",
    "UniformRandom": "edgetwin.policies.heuristics:UniformRandom",
    "ConstantPolicy": "edgetwin.policies.candidates:ConstantPolicy",
}
_REGISTERED: dict[str, type] = {}


def _import(ref: str) -> Any:
    """The object a *fixed* reference of this module names (never one read from a file)."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


def register_policy_kind(cls: type, name: str | None = None) -> str:
    """Make ``cls`` (with ``act(obs)``, ``to_config()`` and ``cls(spec, **config)``) exportable and
    loadable as a "heuristic" policy under ``name`` (default: its class name), in this process.

    This is how code outside edgetwin (an operator's own rule, a test's) becomes a policy kind: the
    loader of a policy directory chooses among registered kinds by name and never imports a class
    a file names.

    Raises:
        ValueError: ``name`` is already a different kind.
    """
    key = name or cls.__name__
    known = _REGISTERED.get(key) or (_import(POLICY_KINDS[key]) if key in POLICY_KINDS else None)
    if known is not None and known is not cls:
        raise ValueError(f"policy kind {key!r} is already {known.__module__}.{known.__qualname__}")
    _REGISTERED[key] = cls
    return key


def _policy_kind(name: Any) -> type | None:
    if not isinstance(name, str):
        return None
    if name in _REGISTERED:
        return _REGISTERED[name]
    return _import(POLICY_KINDS[name]) if name in POLICY_KINDS else None


def _kind_name(cls: type) -> str | None:
    for key, known in _REGISTERED.items():
        if known is cls:
            return key
    key = cls.__name__
    return key if key in POLICY_KINDS and _import(POLICY_KINDS[key]) is cls else None


def network_classes(algorithm: str) -> dict[str, type]:
    """The policy network classes an ``algorithm`` of :data:`ALGORITHMS` may hold, by class name."""
    return {ref.rpartition(":")[2]: _import(ref) for ref in NETWORK_CLASSES[algorithm]}


#: Classes of edgetwin's own a network's arguments may name besides the torch / SB3 ones of
#: `edgetwin.imitation.networks.SAFE_CLASSES`: the regularised policies' optimiser, and the
#: priority-weighted policies' scores (a frozen dataclass of column indices and weights).
_SAFE_EXTRA = {
    "AuxLossAdam": "edgetwin.policies.regularised:AuxLossAdam",
    "PriorityScores": "edgetwin.policies.priority:PriorityScores",
}


def _safe_extra() -> dict[str, type]:
    return {k: _import(v) for k, v in _SAFE_EXTRA.items()}


class ExportedNetwork:
    """An exported SB3 policy network, rebuilt from data: ``predict`` as the algorithm's
    ``model.predict`` (which only delegates to its policy), and the ``policy`` itself."""

    def __init__(self, policy: Any) -> None:
        self.policy = policy

    def predict(self, observation: np.ndarray, **kwargs: Any) -> tuple[np.ndarray, Any]:
        return self.policy.predict(observation, **kwargs)  # type: ignore[no-any-return]


def algorithm_name(model: Any) -> str:
    """The key of :data:`ALGORITHMS` for an SB3 model instance."""
    for name, ref in ALGORITHMS.items():
        if type(model) is _import(ref):
            return name
    raise InputError(f"cannot export a {type(model).__name__}: not one of {sorted(ALGORITHMS)}", "policy")


@dataclass
class ActionTransform:
    """How the model's raw action maps to spec units.

    ``kind="box"``: ``low + (a + 1) / 2 · (high - low)`` (the policy acts in [-1, 1]);
    ``kind="grid"``: ``a`` holds an index per column into ``grid[j]``; ``kind="identity"``.
    """

    kind: str = "identity"
    low: list[float] | None = None
    high: list[float] | None = None
    grid: list[list[float]] | None = None

    def apply(self, a: np.ndarray) -> np.ndarray:
        a = np.asarray(a, dtype=np.float64)
        if self.kind == "box":
            low, high = np.asarray(self.low), np.asarray(self.high)
            return low + (np.clip(a, -1.0, 1.0) + 1.0) * 0.5 * (high - low)
        if self.kind == "grid":
            assert self.grid is not None
            idx = a.astype(np.int64).reshape(a.shape[0], -1)
            return np.stack([np.asarray(g)[idx[:, j]] for j, g in enumerate(self.grid)], axis=1)
        return a

    def masks(self, obs: np.ndarray, shield: Any = None) -> np.ndarray:
        """(N, Σ len(grid[j])) bool: which grid values are allowed (``kind="grid"`` only).

        Without a shield everything is allowed. With one, discrete spec columns take the shield's
        masks (residency, migration caps); on continuous columns, values below the SLO guard's
        lower bound are masked (if the guard is above the whole grid, its largest value stays).
        """
        assert self.kind == "grid" and self.grid is not None
        obs = np.atleast_2d(np.asarray(obs, dtype=np.float64))
        n = obs.shape[0]
        if shield is None:
            return np.ones((n, sum(len(g) for g in self.grid)), dtype=bool)
        discrete = [v is not None for v in shield.values]
        sizes = [len(g) for g, d in zip(self.grid, discrete, strict=True) if d]
        disc = iter(np.split(shield.action_masks(obs), np.cumsum(sizes)[:-1], axis=1)) if sizes else iter(())
        lo = shield.lower_bounds(obs)
        blocks = []
        for j, (g, d) in enumerate(zip(self.grid, discrete, strict=True)):
            if d:
                blocks.append(next(disc))
            else:
                ok = np.asarray(g)[None, :] >= lo[:, j : j + 1] - 1e-9
                ok[~ok.any(axis=1), -1] = True
                blocks.append(ok)
        return np.concatenate(blocks, axis=1)

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "low": self.low, "high": self.high, "grid": self.grid}


@dataclass
class PolicyMetadata:
    """What travels with an exported policy (the registry and promotion gate read it)."""

    algorithm: str
    spec_hash: str
    training_data_sha256: str | None = None
    metrics: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


class LoadedPolicy:
    """A policy loaded from an export directory: ``act(obs (N, O)) -> (N, A)`` in spec units.

    Attributes:
        spec: the twin spec; ``metadata``: the ``policy.json`` document.
    """

    def __init__(self, path: Path, doc: dict[str, Any], spec: TwinSpec, impl: Any) -> None:
        self.path = path
        self.metadata = doc
        self.spec = spec
        self._impl = impl
        self.kind = doc["kind"]
        self.transform = ActionTransform(**doc.get("action_transform") or {})
        self.obs_norm: dict[str, np.ndarray] | None = None
        if doc.get("obs_norm"):
            with np.load(path / doc["obs_norm"], allow_pickle=False) as z:
                self.obs_norm = {k: z[k] for k in z.files}
        self.shield = None
        if doc.get("shield") is not None:
            from edgetwin.policies.shield import Shield, ShieldConfig

            self.shield = Shield(spec, ShieldConfig.from_dict(doc["shield"]))
        self._recurrent_state: Any = None
        self._episode_start: np.ndarray | None = None
        self._actor = _gaussian_actor(impl) if doc["kind"] == "sb3" and doc.get("algorithm") in ("ppo", "a2c") else None

    @property
    def algorithm(self) -> str:
        return str(self.metadata.get("algorithm"))

    def reset(self) -> None:
        """Start new episodes (recurrent policies forget their memory; the shield its history)."""
        self._recurrent_state = None
        self._episode_start = None
        if self.shield is not None:
            self.shield.reset()

    def normalise(self, obs: np.ndarray) -> np.ndarray:
        if self.obs_norm is None:
            return obs
        n = self.obs_norm
        z = (obs - n["mean"]) / np.sqrt(n["var"] + float(n["epsilon"]))
        return np.clip(z, -float(n["clip"]), float(n["clip"]))

    def act(self, obs: np.ndarray) -> np.ndarray:
        """Deterministic actions ``(N, A)`` (float64, spec units) for raw observations ``(N, O)``.

        The observations are copied into one C-contiguous layout first: a request whose columns came
        in another order (reindexed by the decision wire), a Fortran-ordered or a strided array would
        otherwise reach the network's GEMM with other strides, which BLAS may sum in another order
        (actions differing in the last bits, 1e-9, on some CPUs). The same values give the same bits."""
        obs = np.ascontiguousarray(np.atleast_2d(np.asarray(obs, dtype=np.float64)))
        width = len(self.spec.observation_columns)
        if obs.shape[1] != width:
            raise InputError(
                f"expected observations with {width} columns {self.spec.observation_columns}, got {obs.shape[1]}",
                "obs",
            )
        if self.kind == "heuristic":
            actions = np.asarray(self._impl.act(obs), dtype=np.float64)
        else:
            x = np.ascontiguousarray(self.normalise(obs), dtype=np.float32)
            kwargs: dict[str, Any] = {"deterministic": True}
            if self.algorithm == "maskable_ppo" and self.transform.kind == "grid":
                kwargs["action_masks"] = self.transform.masks(obs, self.shield)
            if self.algorithm == "recurrent_ppo":
                if self._episode_start is None or len(self._episode_start) != len(obs):
                    self._recurrent_state, self._episode_start = None, np.ones(len(obs), dtype=bool)
                raw, self._recurrent_state = self._impl.predict(
                    x, state=self._recurrent_state, episode_start=self._episode_start, **kwargs
                )
                self._episode_start = np.zeros(len(obs), dtype=bool)
            elif self._actor is not None:
                raw = self._actor(x)
            else:
                raw, _ = self._impl.predict(x, **kwargs)
            actions = self.transform.apply(np.asarray(raw).reshape(len(obs), -1))
        if self.shield is not None:
            actions = self.shield.project(obs, actions)
        return actions

    def __repr__(self) -> str:
        return f"LoadedPolicy({self.algorithm}, {self.path})"


class _GaussianActor:
    """The deterministic action of an SB3 actor-critic policy with a diagonal Gaussian over a Box
    (PPO / A2C without gSDE) whose actor is a plain MLP on a flat Box observation: what
    ``model.predict(x, deterministic=True)`` returns — the Gaussian's mean, clipped to the action
    space — computed directly (the same torch kernels on the same weights, so the same numbers),
    without SB3's per-call checks, distribution objects and module hooks, which cost more than
    the network for one observation at the edge."""

    def __init__(self, layers: list[Any], low: np.ndarray, high: np.ndarray, shape: tuple[int, ...]) -> None:
        self.layers, self.low, self.high, self.shape = layers, low, high, shape

    def __call__(self, x: np.ndarray) -> np.ndarray:
        import torch as th

        with th.no_grad():
            h = th.as_tensor(np.array(x, dtype=np.float32, order="C"))
            for layer in self.layers:
                h = layer(h) if callable(layer) else th.nn.functional.linear(h, layer[0], layer[1])
        return np.clip(h.numpy().reshape((-1, *self.shape)), self.low, self.high)


def _gaussian_actor(model: Any) -> _GaussianActor | None:
    """A `_GaussianActor` for ``model`` (an SB3 algorithm) when its policy is of that form, else None."""
    import torch as th
    from gymnasium import spaces
    from stable_baselines3.common.distributions import DiagGaussianDistribution
    from stable_baselines3.common.policies import ActorCriticPolicy
    from stable_baselines3.common.torch_layers import FlattenExtractor

    pol = getattr(model, "policy", None)
    if not (
        type(pol) is ActorCriticPolicy
        and type(pol.action_dist) is DiagGaussianDistribution
        and not pol.use_sde
        and not pol.squash_output
        and isinstance(pol.action_space, spaces.Box)
        and isinstance(pol.observation_space, spaces.Box)
        and len(pol.observation_space.shape) == 1
        and type(pol.pi_features_extractor) is FlattenExtractor
        and type(pol.action_net) is th.nn.Linear
        and isinstance(pol.mlp_extractor.policy_net, th.nn.Sequential)
    ):
        return None
    activations = {th.nn.Tanh: th.tanh, th.nn.ReLU: th.relu}
    layers: list[Any] = []
    for m in pol.mlp_extractor.policy_net:
        if type(m) is th.nn.Linear:
            layers.append((m.weight, m.bias))
        elif type(m) in activations:
            layers.append(activations[type(m)])
        else:
            return None
    layers.append((pol.action_net.weight, pol.action_net.bias))
    shape = pol.action_space.shape
    assert shape is not None
    return _GaussianActor(layers, pol.action_space.low, pol.action_space.high, tuple(shape))


def export_policy(
    model_or_policy: Any,
    path: str | Path,
    spec: TwinSpec,
    metadata: PolicyMetadata | Mapping[str, Any] | None = None,
    obs_norm: Any = None,
    action_transform: ActionTransform | None = None,
    shield: Any = None,
) -> Path:
    """Write a policy directory that :func:`load_policy` reads back.

    Args:
        model_or_policy: an SB3 model (any of :data:`ALGORITHMS`), or a heuristic with ``act`` and
            ``to_config()`` (reconstructed as ``cls(spec, **config)``).
        path: the directory (created; existing files are replaced).
        spec: the spec it acts in (its hash goes in the metadata).
        metadata: algorithm, training data hash, metrics at promotion, anything else (JSON).
        obs_norm: a VecNormalize (its ``obs_rms``) or a dict ``mean``, ``var``, ``clip``, ``epsilon``.
        action_transform: how the model's actions map to spec units.
        shield: a `Shield` or `ShieldConfig` applied after the model, at the edge too.

    Returns:
        The directory.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    meta = metadata if isinstance(metadata, PolicyMetadata) else None
    extra = dict(metadata) if isinstance(metadata, Mapping) else {}
    doc: dict[str, Any] = {
        "format": FORMAT,
        "spec_hash": spec.hash(),
        "observation_columns": spec.observation_columns,
        "action_columns": spec.action_columns,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    spec.save(path / "spec.toml")
    if hasattr(model_or_policy, "save") and hasattr(model_or_policy, "policy"):
        from edgetwin.imitation.networks import save_network

        doc["kind"] = "sb3"
        doc["algorithm"] = algo = algorithm_name(model_or_policy)
        try:
            save_network(model_or_policy.policy, path / MODEL_FILE, network_classes(algo),
                         extra=dict(getattr(model_or_policy, "policy_kwargs", None) or {}), safe=_safe_extra())  # fmt: skip
        except ValueError as e:
            raise InputError(f"cannot export the {algo} policy as data ({e})", "policy") from None
        doc["model"] = MODEL_FILE
    elif hasattr(model_or_policy, "act") and hasattr(model_or_policy, "to_config"):
        doc["kind"] = "heuristic"
        cls = type(model_or_policy)
        name = _kind_name(cls)
        if name is None:
            raise InputError(
                f"cannot export a {cls.__qualname__}: not a policy kind edgetwin knows ({sorted(POLICY_KINDS)}); "
                "register it with edgetwin.policies.export.register_policy_kind",
                "policy",
            )
        doc["algorithm"] = getattr(model_or_policy, "name", cls.__name__)
        doc["heuristic"] = {"kind": name, "config": model_or_policy.to_config()}
    else:
        raise InputError(
            f"cannot export {type(model_or_policy).__name__}: need an SB3 model or a heuristic with to_config()",
            "policy",
        )
    if obs_norm is not None:
        stats = obs_norm
        if hasattr(obs_norm, "obs_rms"):
            stats = {
                "mean": obs_norm.obs_rms.mean,
                "var": obs_norm.obs_rms.var,
                "clip": obs_norm.clip_obs,
                "epsilon": obs_norm.epsilon,
            }
        arrays = {k: np.asarray(v, dtype=np.float64) for k, v in stats.items()}
        # numpy's stub lets **kwds also match ``allow_pickle: bool``
        np.savez(path / "obs_norm.npz", **arrays)  # type: ignore[arg-type]
        doc["obs_norm"] = "obs_norm.npz"
    doc["action_transform"] = (action_transform or ActionTransform()).to_dict()
    if shield is not None:
        cfg = getattr(shield, "config", shield)
        doc["shield"] = cfg.to_dict()
    if meta is not None:
        doc["algorithm"] = meta.algorithm or doc["algorithm"]
        doc["training_data_sha256"] = meta.training_data_sha256
        doc["metrics"] = meta.metrics
        doc.update(meta.extra)
    else:
        doc["training_data_sha256"] = extra.pop("training_data_sha256", None)
        doc["metrics"] = extra.pop("metrics", {})
        doc.update(extra)
    (path / "policy.json").write_text(json.dumps(doc, indent=2, default=_json_default))
    (path / SIGNATURE_FILE).unlink(missing_ok=True)  # a signature of what was here before no longer holds
    write_manifest(path, "policy", require=_REQUIRED)  # last: seals every file, policy.json included
    return path


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)


def load_policy(path: str | Path) -> LoadedPolicy:
    """Load an exported policy directory, after checking it against its manifest.

    Args:
        path: the directory written by :func:`export_policy`.

    Raises:
        InputError: not a policy directory; its manifest is missing or a file is missing, added or
            altered (`ArtifactTampered`, naming the file); an unknown format, kind or algorithm; an
            action transform outside the spec's action bounds; a model file that cannot be read.
    """
    path = Path(path)
    if not (path / "policy.json").is_file() and not (path / MANIFEST_FILE).is_file():
        raise InputError("not an exported policy (no policy.json)", str(path))
    manifest = verify_manifest(path, "policy", require=_REQUIRED)
    doc_path = path / "policy.json"
    try:
        doc = read_json(doc_path, max_bytes=_MAX_POLICY_JSON_BYTES)
    except (OSError, ValueError) as e:
        raise InputError(f"policy.json is not valid JSON ({e})", str(doc_path)) from None
    if not isinstance(doc, dict):
        raise InputError("policy.json is not a JSON object", str(doc_path))
    if doc.get("format") in OLD_FORMATS:
        raise InputError(
            f"policy format {doc.get('format')!r} was written by an older edgetwin (an SB3 pickle or a class path); "
            f"this edgetwin reads {FORMAT!r}, where a policy is data: re-export it (`edgetwin train`, or "
            "export_policy) with this edgetwin",
            str(doc_path),
        )
    if doc.get("format") != FORMAT:
        raise InputError(f"unknown policy format {doc.get('format')!r}; expected {FORMAT!r}", str(doc_path))
    spec = TwinSpec.load(path / "spec.toml")
    if spec.hash() != doc.get("spec_hash"):
        raise InputError("spec.toml does not match the policy's spec hash", str(path / "spec.toml"))
    _check_transform(doc.get("action_transform"), spec, doc_path)
    for key in ("obs_norm",):
        name = doc.get(key)
        if name is not None and (not isinstance(name, str) or name not in manifest["files"]):
            raise InputError(f"{key} names {name!r}, which the manifest does not list", str(doc_path))
    kind = doc.get("kind")
    if kind == "sb3":
        from edgetwin.imitation.networks import load_network

        algo = doc.get("algorithm")
        if algo not in ALGORITHMS:
            raise InputError(f"unknown algorithm {algo!r}", str(doc_path))
        model = path / MODEL_FILE
        if MODEL_FILE not in manifest["files"] or doc.get("model") != MODEL_FILE:
            raise InputError(f"an sb3 policy needs {MODEL_FILE}, which the manifest or policy.json does not list",
                             str(model))  # fmt: skip
        try:
            impl: Any = ExportedNetwork(load_network(model, network_classes(algo), safe=_safe_extra()))
        except Exception as e:  # not safetensors, another class, tensors that do not fit the network
            raise InputError(f"cannot load the network ({type(e).__name__}: {e})", str(model)) from None
    elif kind == "heuristic":
        h = doc.get("heuristic")
        h = h if isinstance(h, dict) else {}
        cls = _policy_kind(h.get("kind"))
        if cls is None:
            raise InputError(
                f"unknown heuristic kind {h.get('kind')!r}; known: {sorted({*POLICY_KINDS, *_REGISTERED})} "
                "(a policy's class is never imported from the file; code registers kinds with register_policy_kind)",
                str(doc_path),
            )
        config = h.get("config")
        if not isinstance(config, dict):
            raise InputError("heuristic config is not an object", str(doc_path))
        try:
            impl = cls(spec, **config)
        except (TypeError, KeyError, ValueError, InputError) as e:
            raise InputError(f"cannot rebuild heuristic {h.get('kind')} ({e})", str(doc_path)) from None
    else:
        raise InputError(f"unknown policy kind {kind!r}", str(doc_path))
    try:
        return LoadedPolicy(path, doc, spec, impl)
    except (OSError, ValueError, TypeError, KeyError) as e:
        raise InputError(f"cannot load the policy ({type(e).__name__}: {e})", str(doc_path)) from None


def check_policy_spec(policy: LoadedPolicy, spec: TwinSpec, where: str, *, against: str = "the twin") -> None:
    """Refuse a policy exported for another spec than the one it is about to act in.

    Same columns are not enough: a policy trained on a twin whose spec has other bounds, kinds or
    reward acted in another world; evaluating or promoting it there would compare the wrong things.

    Raises:
        InputError: the spec hashes differ (both are named).
    """
    have, want = policy.metadata.get("spec_hash"), spec.hash()
    if have != want:
        raise InputError(
            f"the policy was exported for spec {have} ({policy.spec.name!r}), but {against} has spec {want} "
            f"({spec.name!r}); same columns are not the same spec — retrain or re-export it for this one",
            where,
        )


def _check_transform(raw: Any, spec: TwinSpec, doc_path: Path) -> None:
    """A box or grid action transform must map into the spec's action bounds (finite, low <= high).

    The manifest already refuses an edited ``policy.json``; this refuses a policy whose writer put
    actions outside what the spec allows, which no gate downstream would notice.
    """
    if raw is None:
        return
    if not isinstance(raw, dict):
        raise InputError("action_transform is not an object", str(doc_path))
    low, high = spec.bounds("action")
    n = len(low)
    kind = raw.get("kind", "identity")
    where = str(doc_path)
    try:
        if kind == "box":
            lo = np.asarray(raw.get("low"), dtype=np.float64)
            hi = np.asarray(raw.get("high"), dtype=np.float64)
            if lo.shape != (n,) or hi.shape != (n,):
                raise InputError(f"action_transform low/high must have {n} values (the spec's actions)", where)
            if not (np.isfinite(lo).all() and np.isfinite(hi).all()) or (lo > hi).any():
                raise InputError("action_transform low/high must be finite with low <= high", where)
            outside = (lo < low - 1e-9) | (hi > high + 1e-9)
        elif kind == "grid":
            grid = raw.get("grid")
            if not isinstance(grid, list) or len(grid) != n:
                raise InputError(f"action_transform grid must have {n} value lists (the spec's actions)", where)
            g = [np.asarray(v, dtype=np.float64) for v in grid]
            if any(v.ndim != 1 or not len(v) or not np.isfinite(v).all() for v in g):
                raise InputError("action_transform grid values must be non-empty lists of finite numbers", where)
            outside = np.array([bool((v < lo_ - 1e-9).any() or (v > hi_ + 1e-9).any()) for v, lo_, hi_ in zip(g, low, high, strict=True)])
        elif kind == "identity":
            return
        else:
            raise InputError(f"unknown action_transform kind {kind!r}", where)
    except (TypeError, ValueError) as e:
        raise InputError(f"malformed action_transform ({e})", where) from None
    if outside.any():
        cols = [c for c, o in zip(spec.action_columns, outside, strict=True) if o]
        raise InputError(f"action_transform maps outside the spec's bounds of {', '.join(cols)}", where)
