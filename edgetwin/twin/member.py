"""One member of a twin's ensemble: its fitted client, engine, transition and site-state models."""

from __future__ import annotations

import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from stable_baselines3.common.policies import ActorCriticPolicy

from edgetwin.contract.errors import InputError
from edgetwin.imitation.mail import GaussianModel
from edgetwin.imitation.site_model import SiteStateModel

__all__ = ["Member"]


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

    def save(self, path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        for s, c in self.clients.items():
            if isinstance(c, ActorCriticPolicy):
                c.save(str(path / f"client_{s}.pt"))
            else:
                with open(path / f"client_{s}.pkl", "wb") as fh:
                    pickle.dump(c, fh)
        for s, e in self.engines.items():
            e.save(str(path / f"engine_{s}.pt"))
        for s, tr in (self.transition or {}).items():
            tr.save(str(path / f"transition_{s}.pt"))
        if self.site_model is not None:
            with open(path / "site_model.pkl", "wb") as fh:
                pickle.dump(self.site_model, fh)
        self.history.to_csv(path / "history.csv", index=False)
        (path / "DONE").write_text("ok\n")

    @classmethod
    def load(cls, path: Path, n_scenarios: int) -> Member:
        clients: dict[int, Any] = {}
        engines: dict[int, ActorCriticPolicy] = {}
        for s in range(n_scenarios):
            if (path / f"client_{s}.pt").is_file():
                clients[s] = ActorCriticPolicy.load(str(path / f"client_{s}.pt"), device="cpu")
            else:
                with open(path / f"client_{s}.pkl", "rb") as fh:
                    clients[s] = pickle.load(fh)
            engines[s] = ActorCriticPolicy.load(str(path / f"engine_{s}.pt"), device="cpu")
        transition: dict[int, ActorCriticPolicy] | None = None
        if (path / "transition_0.pt").is_file():
            transition = {
                s: ActorCriticPolicy.load(str(path / f"transition_{s}.pt"), device="cpu")
                for s in range(n_scenarios)
            }
        hist = (
            pd.read_csv(path / "history.csv") if (path / "history.csv").stat().st_size > 1 else pd.DataFrame()
        )
        site_model = None
        if (path / "site_model.pkl").is_file():
            with open(path / "site_model.pkl", "rb") as fh:
                site_model = pickle.load(fh)
            if not hasattr(site_model, "net"):  # the per-agent MLP form before the log-linear one
                raise InputError(
                    f"{path / 'site_model.pkl'}: a site-state model of an older edgetwin (no log-linear "
                    "'net'); refit the twin with --site-model / --site-columns",
                    str(path / "site_model.pkl"),
                )
        return cls(clients, engines, hist, transition, site_model)

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
