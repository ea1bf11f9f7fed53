"""SB3 policy networks as data: a safetensors file of the state dict, its architecture in the header.

SB3's own ``policy.save`` / ``model.save`` pickle the constructor arguments (spaces, classes, the
learning-rate schedule) and read them back with ``torch.load(weights_only=False)`` or cloudpickle:
whoever can swap such a file (and re-seal the manifest, which proves integrity, not authorship)
runs code in the loader. Here a network is written as

* its tensors: the ``state_dict`` in `safetensors` (``safetensors.torch.save_model``, which also
  handles the tensors SB3 shares between its actor and critic modules), and
* its architecture: the policy's constructor arguments as JSON in the safetensors header's
  metadata (key ``edgetwin``): spaces as their bounds, classes (activation, feature extractor,
  optimiser) as names from :data:`SAFE_CLASSES` (or the caller's ``safe`` classes, which may
  also be frozen configuration dataclasses, saved as their JSON fields), everything else JSON
  numbers, strings, lists and objects.

Loading rebuilds the network from a class the *caller* allows (``classes``: the caller's fixed
registry of edgetwin's own kinds, never a name that the file can add to) and these arguments, and
then copies the tensors in (``strict``: a missing, extra or misshapen tensor is refused). Nothing in
the file is imported, unpickled or evaluated. The optimiser is rebuilt fresh with SB3's
``_dummy_schedule`` learning rate, as SB3's own ``load`` does; its state is not saved.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from edgetwin.contract.json_bounds import loads_bounded

__all__ = ["NETWORK_FORMAT", "SAFE_CLASSES", "load_network", "network_header", "save_network"]

#: The format a network file's header names; other values are refused.
NETWORK_FORMAT = "edgetwin-network/1"
#: The longest header read (bytes of JSON in the safetensors metadata): a network's arguments are a
#: few hundred bytes; anything near this is not one (`edgetwin.contract.json_bounds`).
MAX_HEADER_BYTES = 1024 * 1024


def _safe_classes() -> dict[str, type]:
    import torch as th
    from stable_baselines3.common.sb2_compat.rmsprop_tf_like import RMSpropTFLike
    from stable_baselines3.common.torch_layers import FlattenExtractor

    return {
        # activations
        "Tanh": th.nn.Tanh,
        "ReLU": th.nn.ReLU,
        "ELU": th.nn.ELU,
        "LeakyReLU": th.nn.LeakyReLU,
        "GELU": th.nn.GELU,
        "SiLU": th.nn.SiLU,
        "Sigmoid": th.nn.Sigmoid,
        "Identity": th.nn.Identity,
        # feature extractors
        "FlattenExtractor": FlattenExtractor,
        # optimisers
        "Adam": th.optim.Adam,
        "AdamW": th.optim.AdamW,
        "RMSprop": th.optim.RMSprop,
        "SGD": th.optim.SGD,
        "RMSpropTFLike": RMSpropTFLike,
    }


#: Classes a network's arguments may name (by these keys): activations, feature extractors and
#: optimisers of torch and SB3. Built on first use (importing torch is slow).
SAFE_CLASSES: dict[str, type] = {}


def _classes() -> dict[str, type]:
    if not SAFE_CLASSES:
        SAFE_CLASSES.update(_safe_classes())
    return SAFE_CLASSES


def _encode_space(space: Any) -> dict[str, Any]:
    from gymnasium import spaces

    if isinstance(space, spaces.Box):
        return {"space": "Box", "low": space.low.tolist(), "high": space.high.tolist(),
                "shape": list(space.shape), "dtype": str(space.dtype)}  # fmt: skip
    if isinstance(space, spaces.Discrete):
        return {"space": "Discrete", "n": int(space.n), "start": int(space.start)}
    if isinstance(space, spaces.MultiDiscrete):
        return {"space": "MultiDiscrete", "nvec": space.nvec.tolist(), "dtype": str(space.dtype)}
    if isinstance(space, spaces.MultiBinary):
        return {"space": "MultiBinary", "n": np.asarray(space.n).tolist()}
    raise ValueError(f"cannot save a {type(space).__name__} space as data")


_DTYPES = ("float16", "float32", "float64", "int8", "int16", "int32", "int64", "uint8")


def _decode_space(d: Mapping[str, Any]) -> Any:
    from gymnasium import spaces

    kind = d.get("space")
    if kind == "Box":
        dtype = d["dtype"]
        if dtype not in _DTYPES:
            raise ValueError(f"Box dtype {dtype!r} is not one of {_DTYPES}")
        shape = tuple(int(x) for x in d["shape"])
        low = np.asarray(d["low"], dtype=dtype).reshape(shape)
        high = np.asarray(d["high"], dtype=dtype).reshape(shape)
        return spaces.Box(low, high, shape, dtype)
    if kind == "Discrete":
        return spaces.Discrete(int(d["n"]), start=int(d.get("start", 0)))
    if kind == "MultiDiscrete":
        dtype = d.get("dtype", "int64")
        if dtype not in _DTYPES:
            raise ValueError(f"MultiDiscrete dtype {dtype!r} is not one of {_DTYPES}")
        return spaces.MultiDiscrete(np.asarray(d["nvec"], dtype=np.int64), dtype=dtype)
    if kind == "MultiBinary":
        n = d["n"]
        return spaces.MultiBinary(n if isinstance(n, int) else [int(x) for x in n])
    raise ValueError(f"unknown space {kind!r}")


def _encode(value: Any, where: str, safe: Mapping[str, type]) -> Any:
    """A constructor argument as JSON: spaces and allowed classes tagged, primitives as they are."""
    from gymnasium import spaces

    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, spaces.Space):
        return {"__space__": _encode_space(value)}
    if isinstance(value, type):
        for name, cls in {**_classes(), **safe}.items():
            if cls is value:
                return {"__class__": name}
        raise ValueError(f"{where}: class {value.__qualname__} is not one edgetwin can save as data")
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for name, cls in safe.items():
            if type(value) is cls:
                fields = {f.name: _encode(getattr(value, f.name), f"{where}.{f.name}", safe)
                          for f in dataclasses.fields(value)}  # fmt: skip
                return {"__object__": name, "fields": fields}
        raise ValueError(f"{where}: a {type(value).__qualname__} is not one edgetwin can save as data")
    if isinstance(value, list | tuple):
        return [_encode(v, where, safe) for v in value]
    if isinstance(value, Mapping):
        if not all(isinstance(k, str) for k in value):
            raise ValueError(f"{where}: a mapping with non-string keys cannot be saved as data")
        if "__class__" in value or "__space__" in value or "__object__" in value:
            raise ValueError(f"{where}: reserved key in a mapping")
        return {k: _encode(v, f"{where}.{k}", safe) for k, v in value.items()}
    raise ValueError(f"{where}: a {type(value).__name__} cannot be saved as data")


def _decode(value: Any, safe: Mapping[str, type]) -> Any:
    if isinstance(value, list):
        return [_decode(v, safe) for v in value]
    if isinstance(value, dict):
        if set(value) == {"__class__"}:
            name, allowed = value["__class__"], {**_classes(), **safe}
            if not isinstance(name, str) or name not in allowed:
                raise ValueError(f"class {name!r} is not one of {sorted(allowed)}")
            return allowed[name]
        if set(value) == {"__space__"}:
            return _decode_space(value["__space__"])
        if set(value) == {"__object__", "fields"}:
            # a frozen dataclass of the caller's ``safe`` classes, rebuilt from JSON fields (lists as
            # tuples: such configuration dataclasses hold tuples)
            name, fields = value["__object__"], value["fields"]
            if not isinstance(name, str) or name not in safe or not dataclasses.is_dataclass(safe[name]):
                raise ValueError(f"object {name!r} is not one of {sorted(safe)}")
            if not isinstance(fields, dict):
                raise ValueError(f"object {name!r}: fields are not an object")
            return safe[name](**{str(k): _as_tuples(_decode(v, safe)) for k, v in fields.items()})
        return {str(k): _decode(v, safe) for k, v in value.items()}
    return value


def _as_tuples(v: Any) -> Any:
    return tuple(_as_tuples(x) for x in v) if isinstance(v, list) else v


def save_network(
    policy: Any,
    path: str | Path,
    classes: Mapping[str, type],
    extra: Mapping[str, Any] | None = None,
    safe: Mapping[str, type] | None = None,
) -> Path:
    """Write ``policy`` (an SB3 ``BasePolicy``) as one safetensors file.

    Args:
        policy: the network; its class must be one of ``classes`` (by identity).
        path: the file (``.safetensors``).
        classes: the kinds the reader will accept, by name (e.g. ``{"ActorCriticPolicy": ...}``).
        extra: constructor arguments that override the policy's own ``_get_constructor_parameters``
            (an algorithm's ``policy_kwargs``, which some sb3-contrib policies leave out of them).
        safe: classes the arguments may name besides :data:`SAFE_CLASSES` (the caller's own, e.g.
            an optimiser of a higher layer), by name; the reader must pass the same.

    Raises:
        ValueError: the class is not in ``classes``, or an argument is not JSON, a space or one of
            :data:`SAFE_CLASSES` (the file would not be loadable as data, so none is written).
    """
    from safetensors.torch import save_model

    name = next((n for n, c in classes.items() if c is type(policy)), None)
    if name is None:
        raise ValueError(f"cannot save a {type(policy).__name__} as data: not one of {sorted(classes)}")
    kwargs = dict(policy._get_constructor_parameters())
    kwargs.update(extra or {})
    kwargs.pop("lr_schedule", None)  # a function: rebuilt as SB3's _dummy_schedule, as SB3's load does
    header = {"format": NETWORK_FORMAT, "class": name, "kwargs": _encode(kwargs, name, safe or {})}
    path = Path(path)
    save_model(policy, str(path), metadata={"edgetwin": json.dumps(header)}, force_contiguous=True)
    return path


def network_header(path: str | Path) -> dict[str, Any]:
    """The ``edgetwin`` header of a network file (format, class name, JSON arguments).

    Raises:
        ValueError: not a safetensors file, or no (or a malformed) ``edgetwin`` header.
    """
    from safetensors import safe_open

    with safe_open(str(path), framework="pt", device="cpu") as f:
        meta = f.metadata() or {}
    raw = meta.get("edgetwin")
    if raw is None:
        raise ValueError("no edgetwin header in the safetensors metadata")
    header = loads_bounded(raw, max_bytes=MAX_HEADER_BYTES)
    if not isinstance(header, dict) or header.get("format") != NETWORK_FORMAT:
        raise ValueError(f"network format {header.get('format') if isinstance(header, dict) else None!r}, "
                         f"expected {NETWORK_FORMAT!r}")  # fmt: skip
    return header


def load_network(path: str | Path, classes: Mapping[str, type], safe: Mapping[str, type] | None = None) -> Any:
    """Rebuild the network written by :func:`save_network`, on the CPU.

    Args:
        path: the safetensors file.
        classes: the kinds the caller accepts; the file's class name must be one of them.
        safe: as in :func:`save_network`.

    Raises:
        ValueError: the class is not one of ``classes``, an argument names a class outside
            :data:`SAFE_CLASSES` or an unknown space, or the tensors do not fit the rebuilt network
            (missing, extra, other shapes). Other errors of torch or safetensors pass through; the
            callers turn every one into an `InputError` naming the file.
    """
    from safetensors.torch import load_model
    from stable_baselines3.common.policies import BasePolicy

    header = network_header(path)
    name = header.get("class")
    if not isinstance(name, str) or name not in classes:
        raise ValueError(f"network class {name!r} is not one of {sorted(classes)}")
    kwargs = _decode(header.get("kwargs") or {}, safe or {})
    if not isinstance(kwargs, dict):
        raise ValueError("network arguments are not an object")
    _check_shapes(path, kwargs)
    policy = classes[name](lr_schedule=BasePolicy._dummy_schedule, **kwargs)
    try:
        load_model(policy, str(path), strict=True, device="cpu")
    except RuntimeError as e:  # torch's message spans lines: the CLI prints one
        raise ValueError(" ".join(str(e).split())) from None
    return policy



def _check_shapes(path: str | Path, kwargs: dict[str, Any]) -> None:
    """Refuse a header that claims a larger network than the file holds weights for, before
    building it.

    Why: the header's arguments decide how much memory the network takes (``net_arch [12000,
    12000]`` is 2.7 GB of weights and Adam state), the file's tensors what it holds, and an unsigned
    artifact can be resealed with any header. Every network here is an SB3 MLP (or an LSTM in front
    of one): each hidden layer of width ``w`` after one of width ``v`` holds ``v * w`` weights, so
    the chain ``[observation size, *net_arch]`` (per head for a ``{"pi": .., "vf": ..}`` arch) gives
    a lower bound of the weights any honest file holds; the file's own count comes from the
    safetensors index (shapes only, nothing loaded). A network that is built is then never larger
    than the file that carries its weights, whatever the header says. (Building it on torch's
    ``meta`` device to compare exact shapes does not work: SB3 moves its layers to the CPU while
    building them.)

    Raises:
        ValueError: the header's layers need more weights than the file's tensors hold, or a
            width that is not a positive integer.
    """
    from safetensors import safe_open

    with safe_open(str(path), framework="pt", device="cpu") as f:
        stored = sum(int(np.prod(f.get_slice(k).get_shape(), dtype=np.float64)) for k in f.keys())  # noqa: SIM118 (a safe_open handle is not iterable)
    space = kwargs.get("observation_space")
    n_in = int(np.prod(getattr(space, "shape", None) or (1,), dtype=np.float64))
    arch = kwargs.get("net_arch")
    heads = list(arch.values()) if isinstance(arch, dict) else [arch] if arch is not None else []
    claimed = 0.0
    lstm = kwargs.get("lstm_hidden_size")
    head_in = n_in  # what the MLP heads read: the observation, or the LSTM's output in front of them
    if isinstance(lstm, int) and lstm > 0:
        claimed += 4.0 * lstm * (n_in + lstm)
        head_in = lstm
    for widths in heads:
        if not isinstance(widths, (list, tuple)) or not all(isinstance(w, int) and w > 0 for w in widths):
            raise ValueError(f"net_arch must list positive integer widths, got {widths!r}")
        chain = [head_in, *widths]
        claimed += float(sum(a * b for a, b in zip(chain[:-1], chain[1:], strict=False)))
    if claimed > stored:
        raise ValueError(
            f"the header's network needs at least {claimed:,.0f} weights, the file holds {stored:,} "
            "(a header resealed onto other weights); refusing to build it"
        )
