"""`PopulationModel`: what every population model (GAN-SMMSG and baselines) offers.

A population model learns, per scenario, the joint distribution of the agents' static
``profile.*`` features, plus how often each scenario occurs, and samples new agents from it.

On disk a model is a directory::

    population.json   # format, model name, scenarios and their proportions, hyper-parameters,
                      # transform method, library versions, training-data hash, fit time
    spec.toml         # the twin spec it was fitted with
    transform.npz     # the fitted column encodings (`ProfileTransformer.state`)
    weights.safetensors | gmm.npz   # the model's parameters (torch state dicts / mixture arrays)
    calibration.npz        # only if fitted: the marginal calibration (`MarginalCalibration`)

Every file is data (JSON, TOML, npz read with ``allow_pickle=False``, safetensors): a model
directory may come from anyone (it is inside every twin), so reading it runs no code. Format 1
(``weights.pt``, a torch pickle) is refused with a line that says to refit.
"""

from __future__ import annotations

import hashlib
import json
import platform
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import TwinSpec
from edgetwin.generative.calibration import MarginalCalibration
from edgetwin.generative.transform import Method, ProfileTransformer

FORMAT = "edgetwin.population/2"
#: Formats of older edgetwins, refused with "refit" (format 1 kept GAN weights in a torch pickle).
OLD_FORMATS = ("edgetwin.population/1",)
META_FILE = "population.json"
SPEC_FILE = "spec.toml"
TRANSFORM_FILE = "transform.npz"
CALIBRATION_FILE = "calibration.npz"


def data_hash(profiles: pd.DataFrame, columns: list[str]) -> str:
    """A short hash of the training rows (scenario + profile columns), for provenance."""
    h = hashlib.sha256()
    h.update(pd.util.hash_pandas_object(profiles[columns], index=False).to_numpy().tobytes())
    return h.hexdigest()[:16]


class PopulationModel(ABC):
    """Base class: a fitted model of who shows up, per scenario.

    Attributes:
        spec: the twin spec; ``spec.names("profile")`` are the generated columns, in order.
        scenarios: scenario labels seen in training, sorted.
        proportions: ``(S,)`` share of each scenario in the training rows (sums to 1).
        transformer: the fitted column encodings shared by all models.
        hyper: hyper-parameters the model was fitted with (saved with it).
        meta: provenance (data hash, fit seconds, rows, versions).
        calibration: the marginal calibration applied to the raw samples, or None (see
            `fit_calibration`).
    """

    name: ClassVar[str] = "base"
    #: every model class by its `name`, filled as the subclasses are defined, so that `load` can
    #: dispatch on a saved model's name without this module importing its subclasses.
    registry: ClassVar[dict[str, type[PopulationModel]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        PopulationModel.registry[cls.name] = cls

    def __init__(
        self,
        spec: TwinSpec,
        scenarios: list[str],
        proportions: np.ndarray,
        transformer: ProfileTransformer,
        hyper: dict[str, Any] | None = None,
        meta: dict[str, Any] | None = None,
    ) -> None:
        self.spec = spec
        self.scenarios = list(scenarios)
        self.proportions = np.asarray(proportions, dtype=np.float64)
        self.transformer = transformer
        self.hyper = dict(hyper or {})
        self.meta = dict(meta or {})
        self.calibration: MarginalCalibration | None = None

    @property
    def columns(self) -> list[str]:
        """The generated columns: ``["scenario", *spec.names("profile")]``."""
        return ["scenario", *self.spec.names("profile")]

    # ------------------------------------------------------------------------------- sampling
    def sample(self, n: int, scenario: str | None = None, seed: int = 0) -> pd.DataFrame:
        """Sample ``n`` new agents.

        Args:
            n: number of agents (rows).
            scenario: generate only this scenario; None mixes scenarios in the learned
                proportions (a multinomial draw, seeded).
            seed: same seed (and same model) -> same rows.

        Returns:
            DataFrame with columns ``["scenario", *spec.names("profile")]`` and ``n`` rows; discrete
            columns only take their allowed values and every column is within its spec bounds.
        """
        idx, prof = self._draw(n, scenario, seed)
        cols = {c: prof[:, j] for j, c in enumerate(self.spec.names("profile"))}
        return pd.DataFrame({"scenario": np.asarray(self.scenarios, dtype=object)[idx], **cols})

    def sample_profiles(self, n: int, scenario: str | None = None, seed: int = 0) -> np.ndarray:
        """`sample`'s profile columns as one float64 array ``(n, P)`` in ``spec.names("profile")``'s
        order: the same draws and values as ``sample(n, scenario, seed)[spec.names("profile")]``.

        Why: a twin's episode reset draws its population with a few of these calls (one per
        scenario and the redraws outside the support); building `sample`'s DataFrame column by
        column was ~60 % of the reset (issue 47), more than the generator itself.
        """
        return self._draw(n, scenario, seed)[1]

    def _draw(self, n: int, scenario: str | None, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """``(scenario indices (n,), profiles (n, P) float64)``: `sample`'s draws, seeded by ``seed``."""
        if isinstance(n, bool) or not isinstance(n, int | np.integer) or n < 0:
            raise InputError(f"n must be a non-negative integer, got {n!r}", "n")
        rng = np.random.default_rng(seed)
        if scenario is None:
            idx = rng.choice(len(self.scenarios), size=int(n), p=self.proportions)
        else:
            if scenario not in self.scenarios:
                raise InputError(
                    f"unknown scenario {scenario!r}; the model knows {self.scenarios}", "scenario"
                )
            idx = np.full(int(n), self.scenarios.index(scenario), dtype=np.int64)
        width = len(self.spec.names("profile"))
        prof = self._sample_profiles(idx, rng, seed) if n else np.zeros((0, width))
        return idx, np.asarray(prof, dtype=np.float64)

    # ---------------------------------------------------------------------------- calibration
    def fit_calibration(
        self, profiles: pd.DataFrame, seed: int = 0, samples_per_scenario: int = 50_000
    ) -> MarginalCalibration:
        """Fit the marginal calibration layer on the TRAINING rows and switch it on.

        Draws ``samples_per_scenario`` raw samples of each scenario from the uncalibrated model
        (seeded) and fits `MarginalCalibration` from them to ``profiles`` in the same encoding.
        Replaces any earlier calibration.

        Args:
            profiles: the training rows (``scenario`` and every profile column).
            seed: seeds the model's sample and the dequantisation of the training rows.
            samples_per_scenario: generator rows per scenario that estimate its quantiles.
        """
        self.calibration = None
        rng = np.random.default_rng([seed, 0xCA1])
        n = int(samples_per_scenario)
        idx = np.repeat(np.arange(len(self.scenarios)), n)
        raw = self._sample_raw(idx, rng)
        target, quantile_cols, blocks = self._calibration_target(profiles, rng)
        labels = profiles["scenario"].astype(str).to_numpy()
        pos = {s: i for i, s in enumerate(self.scenarios)}
        t_idx = np.array([pos.get(s, -1) for s in labels], dtype=np.int64)
        self.calibration = MarginalCalibration.fit(
            raw, idx, target, t_idx, len(self.scenarios), quantile_cols, blocks
        )
        return self.calibration

    @abstractmethod
    def _sample_raw(self, scenario_idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Raw (uncalibrated) samples ``(N, D)`` in the encoding the calibration maps; subclass hook."""

    @abstractmethod
    def _calibration_target(
        self, profiles: pd.DataFrame, rng: np.random.Generator
    ) -> tuple[np.ndarray, list[int], list[tuple[int, int]]]:
        """Training rows in the raw encoding, the quantile-mapped columns, the logit blocks; hook."""

    @abstractmethod
    def _sample_profiles(self, scenario_idx: np.ndarray, rng: np.random.Generator, seed: int) -> np.ndarray:
        """Profiles ``(N, P)`` (``spec.names("profile")``'s order) for agents whose scenario
        indices are ``scenario_idx (N,)``; subclass hook."""

    # ---------------------------------------------------------------------------- persistence
    def save(self, path: str | Path) -> Path:
        """Write the model directory (see the module docstring); returns its path."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.spec.save(path / SPEC_FILE)
        # the numpy stub lets **kwds fill `allow_pickle: bool`: a false arg-type error
        np.savez(path / TRANSFORM_FILE, **self.transformer.state())  # type: ignore[arg-type]
        self._save_params(path)
        cal = path / CALIBRATION_FILE
        if self.calibration is not None:
            # the numpy stub lets **kwds fill `allow_pickle: bool`: a false arg-type error
            np.savez(cal, **self.calibration.state())  # type: ignore[arg-type]
        elif cal.exists():  # a stale file from an earlier model in the same directory
            cal.unlink()
        meta = {
            "format": FORMAT,
            "model": self.name,
            "scenarios": self.scenarios,
            "proportions": self.proportions.tolist(),
            "transform": self.transformer.method,
            "hyper": self.hyper,
            "spec_hash": self.spec.hash(),
            "meta": self.meta,
        }
        (path / META_FILE).write_text(json.dumps(meta, indent=2, default=_json_default))
        return path

    @abstractmethod
    def _save_params(self, path: Path) -> None:
        """Write the model's own parameters into ``path``."""

    @abstractmethod
    def _load_params(self, path: Path) -> None:
        """Read what `_save_params` wrote."""

    @classmethod
    def load(cls, path: str | Path) -> PopulationModel:
        """Load a saved model; ``cls.load`` on the base class dispatches on the saved model name."""
        path = Path(path)
        meta_path = path / META_FILE
        if not meta_path.is_file():
            raise InputError(f"not a population model directory (no {META_FILE})", str(path))
        try:
            meta = json.loads(meta_path.read_text())
        except json.JSONDecodeError as e:
            raise InputError(f"{META_FILE} is not valid JSON ({e})", str(meta_path)) from None
        if meta.get("format") in OLD_FORMATS:
            raise InputError(
                f"population format {meta.get('format')!r} was written by an older edgetwin (a torch pickle); "
                f"this edgetwin reads {FORMAT!r}, where every file is data: refit it (`edgetwin population fit` "
                "or `edgetwin fit`)",
                str(meta_path),
            )
        if meta.get("format") != FORMAT:
            raise InputError(f"unknown format {meta.get('format')!r}, expected {FORMAT!r}", str(meta_path))
        model_cls = PopulationModel.registry.get(meta.get("model", ""))
        if model_cls is None:
            raise InputError(f"unknown model {meta.get('model')!r}", str(meta_path))
        if cls is not PopulationModel and not issubclass(model_cls, cls):
            raise InputError(f"{path} holds a {meta['model']!r} model, not {cls.name!r}", str(path))
        spec = TwinSpec.load(path / SPEC_FILE)
        method: Method = meta["transform"]
        with np.load(path / TRANSFORM_FILE, allow_pickle=False) as z:
            transformer = ProfileTransformer.from_state(spec, method, {k: z[k] for k in z.files})
        model = model_cls(
            spec=spec,
            scenarios=meta["scenarios"],
            proportions=np.asarray(meta["proportions"]),
            transformer=transformer,
            hyper=meta.get("hyper", {}),
            meta=meta.get("meta", {}),
        )
        model._load_params(path)
        if (path / CALIBRATION_FILE).is_file():
            with np.load(path / CALIBRATION_FILE, allow_pickle=False) as z:
                model.calibration = MarginalCalibration.from_state({k: z[k] for k in z.files})
        return model

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(model={self.name!r}, scenarios={self.scenarios}, "
            f"columns={self.spec.names('profile')})"
        )


def versions() -> dict[str, str]:
    import sklearn
    import torch

    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "pandas": pd.__version__,
        "torch": torch.__version__,
        "sklearn": sklearn.__version__,
    }


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")
