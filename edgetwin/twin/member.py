"""One member of a twin's ensemble: its fitted client, engine, transition and site-state models."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from stable_baselines3.common.policies import ActorCriticPolicy

from edgetwin.contract.errors import InputError
from edgetwin.imitation.baselines import SupervisedResponseModel
from edgetwin.imitation.causal import CausalResponseModel
from edgetwin.imitation.layout import Layout
from edgetwin.imitation.mail import GaussianModel
from edgetwin.imitation.networks import load_network, save_network
from edgetwin.imitation.noise import OutputNoise, noise_from_json, noise_to_json
from edgetwin.imitation.site_model import SiteStateModel
from edgetwin.twin.logdata import MappedLog

__all__ = ["NETWORK_CLASSES", "NOISE_SOURCES", "Member"]

#: the member's output noise model (`edgetwin.imitation.noise`), when it has one
NOISE_FILE = "output_noise.json"
#: at most this many rows (whole episodes) are read to fit a member's output noise model: a
#: binned quantile per output needs thousands, not a million-row log's rows
NOISE_MAX_ROWS = 100_000
#: which episodes a member's output noise model is read on (`Member.fit_output_noise`)
NOISE_SOURCES = ("training", "held-out")

#: The only network classes a member's files may name (clients, engines and transitions are all
#: SB3 actor-critic policies): a file chooses among these, never adds to them.
NETWORK_CLASSES: dict[str, type] = {"ActorCriticPolicy": ActorCriticPolicy}


def _save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    # the numpy stub lets **kwds fill `allow_pickle: bool`: a false arg-type error
    np.savez(path, **arrays)  # type: ignore[arg-type]


def _load_npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def _read(path: Path, read: Callable[[Path], Any]) -> Any:
    """``read(path)``, any failure an `InputError` naming ``path`` (one line)."""
    try:
        return read(path)
    except InputError:
        raise
    except Exception as e:  # numpy / safetensors / torch each raise their own kinds
        msg = " ".join(str(e).split())
        raise InputError(f"cannot read it ({type(e).__name__}: {msg})", str(path)) from None


@dataclass
class Member:
    """One ensemble member: per-scenario client models, cloned engine policies and, when the
    transition is learned by a site-aware model, its per-scenario transition models, and the model
    of the site-level state columns (`SiteStateModel`) when there is one."""

    clients: dict[int, Any]
    engines: dict[int, ActorCriticPolicy]
    history: pd.DataFrame = field(default_factory=pd.DataFrame)
    transition: dict[int, ActorCriticPolicy] | None = None
    site_model: SiteStateModel | None = None
    noise: dict[int, OutputNoise] | None = None
    #: which rows the noise model's residuals came from ("held-out episodes" / "training episodes")
    noise_source: str = ""

    def save(self, path: Path) -> None:
        """Write the member as data: networks in safetensors (`edgetwin.imitation.networks`),
        other models as npz, the history as CSV; no pickle (see `load`)."""
        from safetensors.torch import save_file

        path.mkdir(parents=True, exist_ok=True)
        for s, c in self.clients.items():
            if isinstance(c, ActorCriticPolicy):
                save_network(c, path / f"client_{s}.safetensors", NETWORK_CLASSES)
            elif isinstance(c, SupervisedResponseModel):
                _save_npz(path / f"client_{s}.npz", c.to_arrays())
            elif isinstance(c, CausalResponseModel):
                _save_npz(path / f"client_{s}.causal.npz", c.to_arrays())
            else:
                raise TypeError(f"cannot save a {type(c).__name__} client model as data")
        for s, e in self.engines.items():
            save_network(e, path / f"engine_{s}.safetensors", NETWORK_CLASSES)
        for s, tr in (self.transition or {}).items():
            save_network(tr, path / f"transition_{s}.safetensors", NETWORK_CLASSES)
        if self.site_model is not None:
            arrays, tensors = self.site_model.to_data()
            _save_npz(path / "site_model.npz", arrays)
            save_file(tensors, str(path / "site_model.safetensors"))
        if self.noise is not None:
            (path / NOISE_FILE).write_text(noise_to_json(self.noise, self.noise_source))
        self.history.to_csv(path / "history.csv", index=False)
        (path / "DONE").write_text("ok\n")

    @classmethod
    def load(cls, path: Path, n_scenarios: int) -> Member:
        """Read a member written by `save`. Only data is read: a network's class is one of
        :data:`NETWORK_CLASSES` and its tensors come from safetensors, other arrays from npz with
        ``allow_pickle=False``. A member written by an edgetwin that pickled its models (``.pt`` /
        ``.pkl`` files) is refused: refit the twin.

        Raises:
            InputError: an old-format member, or a file that is not what it should be (naming it).
        """
        from safetensors.torch import load_file

        old = sorted(p.name for p in path.iterdir() if p.suffix in (".pt", ".pkl"))
        if old:
            raise InputError(
                f"{old[0]} is a pickle written by an older edgetwin; artifacts are data now (safetensors, JSON, "
                "npz) and pickles are never loaded: refit the twin with `edgetwin fit` (into a new directory, or "
                "after removing this old fit's checkpoint)",
                str(path / old[0]),
            )

        def network(name: str) -> ActorCriticPolicy:
            f = path / name
            try:
                net: ActorCriticPolicy = load_network(f, NETWORK_CLASSES)
            except FileNotFoundError:
                raise InputError("missing network file", str(f)) from None
            except Exception as e:  # safetensors / torch / a rebuilt network that does not fit
                raise InputError(f"cannot read it as a network ({type(e).__name__}: {e})", str(f)) from None
            return net

        clients: dict[int, Any] = {}
        engines: dict[int, ActorCriticPolicy] = {}
        for s in range(n_scenarios):
            if (path / f"client_{s}.npz").is_file():
                clients[s] = _read(path / f"client_{s}.npz", lambda p: SupervisedResponseModel.from_arrays(_load_npz(p)))
            elif (path / f"client_{s}.causal.npz").is_file():
                clients[s] = _read(path / f"client_{s}.causal.npz", lambda p: CausalResponseModel.from_arrays(_load_npz(p)))
            else:
                clients[s] = network(f"client_{s}.safetensors")
            engines[s] = network(f"engine_{s}.safetensors")
        transition: dict[int, ActorCriticPolicy] | None = None
        if (path / "transition_0.safetensors").is_file():
            transition = {s: network(f"transition_{s}.safetensors") for s in range(n_scenarios)}
        hist = (
            pd.read_csv(path / "history.csv") if (path / "history.csv").stat().st_size > 1 else pd.DataFrame()
        )
        site_model = None
        if (path / "site_model.npz").is_file():
            arrays = _read(path / "site_model.npz", _load_npz)
            tensors = _read(path / "site_model.safetensors", lambda p: load_file(str(p), device="cpu"))
            site_model = _read(path / "site_model.safetensors", lambda _: SiteStateModel.from_data(arrays, tensors))
        noise, source = None, ""
        if (path / NOISE_FILE).is_file():
            noise, source = _read(path / NOISE_FILE, lambda p: noise_from_json(p.read_text(), n_scenarios))
        return cls(clients, engines, hist, transition, site_model, noise, source)

    def fit_output_noise(
        self, log: pd.DataFrame | MappedLog, episodes: np.ndarray, pick: np.ndarray | None, layout: Layout,
        seed: int, kind: str = "quantile", match_raw: bool = False, source: str = "training",
    ) -> Member:
        """Fit `noise` (per scenario, `OutputNoise.fit`) on this member's residuals; returns self.

        ``source="training"`` (the default): the residuals are read on the episodes the member was
        fitted on (the distinct episodes of its bootstrap draw ``pick``; every episode when ``pick``
        is None). ``source="held-out"``: on the episodes its draw left out when there are any (else
        on its training episodes); `noise_source` says which rows were used. At most
        `NOISE_MAX_ROWS` rows are read: whole episodes drawn with ``seed``.

        Why the training episodes (issue 44): the noise model is a per-row, independent draw (a
        row's noise depends on its own prediction and normal draw only), so it must hold the
        member's per-row spread, not its error on a whole day it never saw. Residuals on the days a
        bootstrap left out carry that day's regime as well (seed 0's 6 random-logged days: day 4
        overloaded, mean task time 20 s against 0.7-1.4 s on four others; a member fitted without
        it and its noise table read on it drew the overload day's residuals on every row of every
        day, and in ``log1p`` space their ``expm1`` put its task time 5.3 times the logged mean one
        step ahead and its mean reward 1.5 below the cluster's: `benchmarks/_twin_offset.py`,
        docs/benchmarks/twin_fidelity/offset.json). What
        a member does not know of the days it did not see is the ensemble's spread between its
        members (each fitted on its own draw) and the twin's calibration on held-out logs, not
        extra per-row noise. The training residuals understate the per-row spread by the model's
        own fitting error (small for MAIL-MMSG's few behaviour-cloning epochs and adversarial rounds;
        a single member fitted on every episode has always used them).

        Args:
            log: the twin's log (or a pool worker's memory-mapped copy of it), ``episodes``: its episode ids, ``pick``: the member's draw of
                their indices (None: all of them).
            kind: ``"quantile"`` or ``"gaussian"`` (`OutputNoise.fit`).
            match_raw: mean-match the bins of the log-scaled outputs in raw units (`OutputNoise.fit`'s
                ``match``: their ``expm1`` mean is made in a tail a table cannot hold).
            source: ``"training"`` or ``"held-out"`` (the residuals' episodes, above).

        Raises:
            ValueError: an unknown ``source``.
        """
        from edgetwin.imitation.steps import build_steps

        if source not in NOISE_SOURCES:
            raise ValueError(f"unknown noise source {source!r} (one of {', '.join(NOISE_SOURCES)})")
        ny = layout.n_outputs
        if ny == 0 or len(episodes) == 0:
            return self
        every = np.arange(len(episodes))
        trained = every if pick is None else np.unique(pick)
        held = np.setdiff1d(every, trained) if source == "held-out" else np.zeros(0, np.int64)
        use, self.noise_source = (held, "held-out episodes") if len(held) else (trained, "training episodes")
        rng = np.random.default_rng(seed)
        per_episode = max(1, len(log) // len(episodes))
        keep = rng.permutation(use)[: max(1, NOISE_MAX_ROWS // per_episode)]
        chosen = episodes[np.sort(keep)]
        # a pool worker's log is the fit's memory-mapped copy (`edgetwin.twin.logdata.MappedLog`)
        sub = log.rows_of(chosen) if isinstance(log, MappedLog) else log[log["episode"].isin(chosen)]
        steps = build_steps(sub, layout)
        models = self.models()
        noise: dict[int, OutputNoise] = {}
        for s, model in models.items():
            rows = steps.rows(s)
            if len(rows) == 0:
                continue
            mu = np.asarray(model.mean(steps.x_client[rows]))[:, :ny]
            sc = layout.scalers["outputs"]
            noise[s] = OutputNoise.fit(mu, steps.y_client[rows, :ny], kind=kind, raw=sc.inverse_column,
                                       match=sc.log if match_raw else None)
        self.noise = noise or None
        return self

    def models(self) -> dict[int, Any]:
        """Client models with ``mean(x)`` / ``sample(x, rng)`` (SB3 policies wrapped)."""
        return {
            s: GaussianModel(c) if isinstance(c, ActorCriticPolicy) else c for s, c in self.clients.items()
        }

    def transition_models(self) -> dict[int, GaussianModel] | None:
        """The site-aware transition models, wrapped (None: the clients' ``Δstate`` moves the state)."""
        if self.transition is None:
            return None
        return {s: GaussianModel(p) for s, p in self.transition.items()}
