"""The `Twin`: a learned, ensembled simulator of an edge-cloud scheduling system, from its logs.

A twin is, per scenario, a population model ``P^c`` (GAN-SMMSG: who shows up), a client model
``π^c`` (MAIL-MMSG: how each agent responds to the platform's action, given its site), the known
or learned transition and the spec's reward. It is an ensemble: each member's client models are
fitted on a bootstrap resample of the logged episodes, and the spread of their predictions is the
twin's uncertainty (`make_env(disagreement_penalty=k)` penalises it).

    twin = Twin.fit(log, spec, members=5, seed=0)
    twin.save("twin/")
    env = twin.make_env()                      # gymnasium.Env, the platform acts per agent
    venv = twin.make_vec_env(n_agents=1000)    # SB3 VecEnv, one sub-env per agent, batched
    df = twin.rollout(policy, episodes=4, seed=1)
    df.attrs["support"]                        # how far the rollout left the logs' support

Dependencies: the twin imports `edgetwin.generative` and `edgetwin.imitation` (which build on the
log contract in this package) and never `policies` or `edge`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import pickle
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch as th
from sklearn.neighbors import NearestNeighbors
from stable_baselines3.common.policies import ActorCriticPolicy
from tqdm.auto import tqdm

from edgetwin.contract.errors import InputError
from edgetwin.contract.logs import ordered_columns
from edgetwin.contract.policy import PlatformPolicy
from edgetwin.contract.spec import REWARD_COLUMN, TwinSpec
from edgetwin.contract.validate import load_valid_log
from edgetwin.imitation.baselines import ClonedPlatformPolicy, SupervisedResponseModel
from edgetwin.imitation.mail import (
    GaussianModel,
    MailConfig,
    client_rows,
    fit_engines,
    fit_mail,
    fit_transition,
)
from edgetwin.imitation.world import (
    Composition,
    InitialStates,
    Layout,
    SiteStateModel,
    World,
    build_steps,
)

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
RESPONSE_MODELS = ("mail", "bc", "supervised")
TRANSITION_MODELS = ("site", "client")


# ------------------------------------------------------------------------------------ helpers
def data_sha256(df: pd.DataFrame) -> str:
    """sha256 of a table's content (row order and column order included)."""
    h = hashlib.sha256()
    h.update(json.dumps([str(c) for c in df.columns]).encode())
    h.update(pd.util.hash_pandas_object(df, index=False).to_numpy().tobytes())
    return h.hexdigest()


def library_versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for pkg in (
        "edgetwin",
        "torch",
        "stable-baselines3",
        "imitation",
        "scikit-learn",
        "numpy",
        "pandas",
        "gymnasium",
    ):
        try:
            out[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            out[pkg] = "absent"
    return out


def load_log(
    log: str | Path | pd.DataFrame, spec: str | Path | TwinSpec | None
) -> tuple[pd.DataFrame, TwinSpec]:
    """A usable log table and its spec, validated (`edgetwin.contract.validate.load_valid_log`)."""
    df, sp, _ = load_valid_log(log, spec)
    return df, sp


class EmpiricalPopulation:
    """Resamples logged profiles per scenario (the "database sampling" baseline of seed 004)."""

    def __init__(self, profiles: pd.DataFrame, columns: list[str]) -> None:
        self.columns = columns
        self.table = profiles[["scenario", *columns]].reset_index(drop=True)
        self.table["scenario"] = self.table["scenario"].astype(str)

    def sample(self, n: int, scenario: str | None = None, seed: int = 0) -> pd.DataFrame:
        rng = np.random.default_rng(seed)
        pool = self.table if scenario is None else self.table[self.table["scenario"] == scenario]
        if len(pool) == 0:
            raise InputError(f"no logged agent of scenario {scenario!r}", "scenario")
        return pool.iloc[rng.integers(len(pool), size=n)].reset_index(drop=True)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.table.to_parquet(path / "empirical.parquet", index=False)
        return path


@dataclass
class SupportIndex:
    """How far ``[profile, state, action]`` rows are from the logs (standardised units).

    A row is *out of support* when its nearest logged neighbour is farther than the 99th
    percentile of logged rows' nearest-other-row distances.
    """

    bank: np.ndarray
    threshold: float
    nn: NearestNeighbors | None = None

    @classmethod
    def fit(
        cls, z: np.ndarray, seed: int = 0, max_rows: int = 20_000, quantile: float = 0.99
    ) -> SupportIndex:
        rng = np.random.default_rng(seed)
        bank = z[rng.choice(len(z), size=min(max_rows, len(z)), replace=False)] if len(z) else z
        idx = cls(bank=bank.astype(np.float32), threshold=float("inf"))
        if len(bank) >= 3:
            d, _ = idx._nn().kneighbors(bank, n_neighbors=2)
            idx.threshold = float(np.quantile(d[:, 1], quantile))
        return idx

    def _nn(self) -> NearestNeighbors:
        if self.nn is None:
            self.nn = NearestNeighbors(n_neighbors=1).fit(self.bank)
        return self.nn

    def distance(self, z: np.ndarray) -> np.ndarray:
        if len(self.bank) == 0 or len(z) == 0:
            return np.zeros(len(z))
        return self._nn().kneighbors(z.astype(np.float32), n_neighbors=1)[0][:, 0]


class ProfileSupport:
    """Whether generated profiles lie in the logs' support, per scenario (standardised units).

    A profile is *in support* when its nearest logged profile of the same scenario is no farther
    than the ``quantile`` of logged profiles' nearest-other-profile distances. A generative
    population model puts some mass between and beyond the logged agents; the client models have
    never seen such agents, so `Simulation` redraws them (see ``Twin.profile_retries``).
    """

    def __init__(self, zprofiles: list[np.ndarray], quantile: float = 0.99) -> None:
        self.nn: list[NearestNeighbors | None] = []
        self.threshold: list[float] = []
        for z in zprofiles:
            if len(z) < 3 or z.shape[1] == 0:
                self.nn.append(None)
                self.threshold.append(float("inf"))
                continue
            nn = NearestNeighbors(n_neighbors=2).fit(z)
            d, _ = nn.kneighbors(z)
            self.nn.append(nn)
            self.threshold.append(float(np.quantile(d[:, 1], quantile)))

    def inside(self, scenario: int, zp: np.ndarray) -> np.ndarray:
        """``(n,)`` bool: rows of ``zp (n, P)`` within scenario ``scenario``'s support."""
        nn = self.nn[scenario]
        if nn is None or len(zp) == 0:
            return np.ones(len(zp), dtype=bool)
        d = nn.kneighbors(zp, n_neighbors=1)[0][:, 0]
        return d <= self.threshold[scenario]


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


class _Constant:
    """A classifier that always answers one scenario (the logs have only one)."""

    def __init__(self, label: int) -> None:
        self.label = label

    def predict(self, x: np.ndarray) -> np.ndarray:
        return np.full(len(x), self.label, dtype=np.int64)


# ------------------------------------------------------------------------------------ the twin
class Twin:
    """A learned simulator of the logged system; build with `Twin.fit` or `Twin.load`.

    Attributes:
        layout: roles, scalers and horizon.
        members: the ensemble.
        population: the population model (``.sample(n, scenario, seed) -> DataFrame``).
        composition: logged site units; initial: logged initial states; support: the logs' support.
        action_low, action_high: ``(A,)`` finite action bounds (spec, else logged range).
        meta: seed, hyper-parameters, library versions, sha256 of the training data, timings.
    """

    def __init__(
        self,
        layout: Layout,
        members: list[Member],
        population: Any,
        composition: Composition,
        initial: InitialStates,
        support: SupportIndex,
        action_low: np.ndarray,
        action_high: np.ndarray,
        meta: dict[str, Any],
    ) -> None:
        self.layout = layout
        self.members = members
        self.population = population
        self.composition = composition
        self.initial = initial
        self.support = support
        self.action_low = action_low
        self.action_high = action_high
        self.meta = meta
        self._models = [m.models() for m in members]
        self._transitions = [m.transition_models() for m in members]
        #: how many times a simulation redraws a generated profile that is out of the logs'
        #: support (`ProfileSupport`) before keeping it; 0 keeps every generated profile
        self.profile_retries = 4
        self._profile_support: ProfileSupport | None = None

    @property
    def profile_support(self) -> ProfileSupport:
        """The logged profiles' support (built on first use from the logged initial profiles)."""
        if self._profile_support is None:
            self._profile_support = ProfileSupport(self.initial.zprofiles)
        return self._profile_support

    @property
    def spec(self) -> TwinSpec:
        return self.layout.spec

    @property
    def n_members(self) -> int:
        return len(self.members)

    # --- fitting ------------------------------------------------------------------------------
    @classmethod
    def fit(
        cls,
        log: str | Path | pd.DataFrame,
        spec: str | Path | TwinSpec | None = None,
        seed: int = 0,
        members: int = 5,
        progress: bool = True,
        checkpoint_dir: str | Path | None = None,
        response_model: str = "mail",
        population_model: str = "gan-smmsg",
        population_hyper: Mapping[str, Any] | None = None,
        use_time: bool = True,
        transition_model: str = "client",
        site_model: bool | Sequence[str] = False,
        **hyper: Any,
    ) -> Twin:
        """Learn a twin from a log.

        Args:
            log: the log table or its path (validated; unusable rows are quarantined).
            spec: its twin spec (default: beside the log, else inferred).
            seed: the same seed and data give the same twin.
            members: ensemble size; each member fits the client models on a bootstrap resample
                of the episodes (with ``members=1``, on all of them).
            progress: show tqdm bars.
            checkpoint_dir: save each finished member there and skip members already finished
                (resumes an interrupted fit).
            response_model: ``"mail"`` (MAIL-MMSG), ``"bc"`` (its behaviour-cloning pre-training
                only) or ``"supervised"`` (one-step MLP regression baseline).
            population_model: a model of `edgetwin.generative.MODELS`, or ``"empirical"`` (resample
                logged profiles).
            population_hyper: hyper-parameters of the population model (e.g. ``{"steps": 500}``).
            use_time: give the client model time-of-day inputs.
            transition_model: when the spec names no transition, how the next state is learned:
                ``"client"`` (default: the client model's own ``Δstate``) or ``"site"`` (a
                separate model that also sees the agent's own outputs and its site's actions and
                outputs of the tick, `edgetwin.imitation.mail.fit_transition`; on the emulated
                cluster it ranked policies worse, see docs/benchmarks.md).
            site_model: when the log has site-level state columns (one value per site and tick),
                move them by a `SiteStateModel` that sees the whole site's tick (every agent's
                action and output): True for all of them, or a list of those column names;
                False (default): by the mean of the agents' own predictions. Off by default: on
                the emulated cluster it did not rank policies better on every seed
                (docs/benchmarks.md, "Paired quick checks").
            **hyper: `edgetwin.imitation.mail.MailConfig` fields (``rounds``, ``bc_epochs``, ...).

        Raises:
            InputError: unusable log/spec, an unknown option or hyper-parameter.
        """
        if members < 1:
            raise InputError(f"members must be >= 1, got {members}", "--members")
        if response_model not in RESPONSE_MODELS:
            raise InputError(
                f"unknown response model {response_model!r}; expected one of {RESPONSE_MODELS}",
                "response_model",
            )
        if transition_model not in TRANSITION_MODELS:
            raise InputError(
                f"unknown transition model {transition_model!r}; expected one of {TRANSITION_MODELS}",
                "transition_model",
            )
        known = set(MailConfig.__dataclass_fields__)
        unknown = sorted(set(hyper) - known)
        if unknown:
            raise InputError(f"unknown hyper-parameter(s) {unknown}; known: {sorted(known)}", "hyper")
        cfg = MailConfig.from_hyper(hyper)
        if response_model == "bc":
            cfg.rounds = 0
        t_start = time.perf_counter()
        df, spec = load_log(log, spec)
        df = df.sort_values(["episode", "t", "agent"], kind="stable").reset_index(drop=True)
        layout = Layout.fit(df, spec, use_time=use_time)
        if not isinstance(site_model, bool):
            site_model = list(site_model)
            SiteStateModel.select_columns(layout, site_model)  # bad names fail before any fitting
        sha = data_sha256(df)
        ckpt = Path(checkpoint_dir) if checkpoint_dir is not None else None
        if ckpt is not None:
            ckpt.mkdir(parents=True, exist_ok=True)
            stamp = ckpt / "fit.json"
            ident = {
                "data_sha256": sha,
                "seed": seed,
                "response_model": response_model,
                "transition_model": transition_model,
                "site_model": site_model,
                "hyper": cfg.__dict__,
            }
            if stamp.is_file() and json.loads(stamp.read_text()) != json.loads(
                json.dumps(ident, default=str)
            ):
                raise InputError(
                    "checkpoint belongs to a different fit (data, seed or options differ)", str(ckpt)
                )
            stamp.write_text(json.dumps(ident, default=str))

        population = cls._fit_population(
            df, spec, population_model, seed, progress, dict(population_hyper or {})
        )
        composition = Composition.fit(df, layout)
        initial = InitialStates.fit(df, layout)

        def sampler(n: int, scenario: str, s: int) -> np.ndarray:
            return population.sample(n, scenario=scenario, seed=s)[layout.profile].to_numpy(np.float64)

        episodes = df["episode"].unique()
        ep_rows = df.groupby("episode", sort=False).indices
        fitted: list[Member] = []
        bar = tqdm(range(members), desc="twin members", disable=not progress)
        for m in bar:
            mdir = ckpt / f"member_{m}" if ckpt is not None else None
            if mdir is not None and (mdir / "DONE").is_file():
                fitted.append(Member.load(mdir, len(layout.scenarios)))
                continue
            rng = np.random.default_rng([seed, m])
            if members == 1:
                sub = df
            else:  # bootstrap over episodes; a repeated episode becomes a distinct one
                pick = rng.choice(len(episodes), size=len(episodes), replace=True)
                parts = []
                for k, e in enumerate(pick):
                    part = df.iloc[ep_rows[episodes[e]]].copy()
                    part["episode"] = f"{episodes[e]}#{k}"
                    parts.append(part)
                sub = pd.concat(parts, ignore_index=True)
            member = cls._fit_member(
                sub,
                layout,
                response_model,
                cfg,
                sampler,
                initial,
                composition,
                seed * 1000 + m,
                progress,
                transition_model,
                site_model,
            )
            if mdir is not None:
                if mdir.exists():
                    shutil.rmtree(mdir)
                member.save(mdir)
            fitted.append(member)
        steps_all = build_steps(df, layout)
        z_support = np.concatenate(
            [steps_all.x_engine, steps_all.za], axis=1
        )  # [profile, state, action] standardised
        support = SupportIndex.fit(z_support, seed=seed)
        a_low, a_high = spec.bounds("action")
        logged = df[layout.action].to_numpy(np.float64)
        a_low = np.where(np.isfinite(a_low), a_low, logged.min(axis=0))
        a_high = np.where(np.isfinite(a_high), a_high, logged.max(axis=0))
        meta = {
            "format_version": FORMAT_VERSION,
            "seed": seed,
            "members": members,
            "response_model": response_model,
            "transition_model": transition_model,
            "site_model": site_model,
            "population_model": population_model,
            "hyper": cfg.__dict__,
            "data_sha256": sha,
            "n_rows": len(df),
            "n_episodes": len(episodes),
            "spec_hash": spec.hash(),
            "versions": library_versions(),
            "fit_seconds": time.perf_counter() - t_start,
        }
        return cls(layout, fitted, population, composition, initial, support, a_low, a_high, meta)

    @staticmethod
    def _fit_population(
        df: pd.DataFrame, spec: TwinSpec, model: str, seed: int, progress: bool, hyper: dict[str, Any]
    ) -> Any:
        from edgetwin.generative import agent_profiles, fit_population

        profiles = agent_profiles(df, spec) if spec.names("profile") else df[["scenario"]].drop_duplicates()
        if model == "empirical" or not spec.names("profile"):
            return EmpiricalPopulation(profiles, spec.names("profile"))
        return fit_population(profiles, spec, model=model, seed=seed, progress=progress, **hyper)

    @staticmethod
    def _fit_member(
        sub: pd.DataFrame,
        layout: Layout,
        response_model: str,
        cfg: MailConfig,
        sampler: Any,
        initial: InitialStates,
        composition: Composition,
        seed: int,
        progress: bool,
        transition_model: str = "client",
        site_model: bool | list[str] = False,
    ) -> Member:
        steps = build_steps(sub, layout)
        transition = fit_transition(steps, layout, cfg, seed) if transition_model == "site" else None
        sites = (
            SiteStateModel.fit(
                steps, layout, seed=seed + 400, columns=None if site_model is True else site_model
            )
            if site_model
            else None
        )
        if response_model == "supervised":
            clients: dict[int, Any] = {}
            for s in range(len(layout.scenarios)):
                rows = client_rows(steps, layout, s)
                clients[s] = SupervisedResponseModel(tuple(cfg.net_arch), seed=seed + s).fit(
                    steps.x_client[rows], steps.y_client[rows]
                )
            return Member(clients, fit_engines(steps, layout, cfg, seed), pd.DataFrame(), transition, sites)
        res = fit_mail(
            steps,
            layout,
            sampler,
            initial,
            composition,
            cfg,
            seed=seed,
            progress=progress,
            transition=transition,
            site_model=sites,
        )
        return Member(dict(res.clients), res.engines, res.history, transition, sites)

    # --- persistence ----------------------------------------------------------------------------
    def save(self, path: str | Path) -> Path:
        """Write the twin to a directory (weights, spec, scalers, versions, data sha256)."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        self.spec.save(path / "spec.toml")
        (path / "layout.json").write_text(json.dumps(self.layout.to_dict(), indent=1))
        (path / "meta.json").write_text(json.dumps(self.meta, indent=1, default=str))
        # the numpy stub lets **kwds fill `allow_pickle: bool`: a false arg-type error
        np.savez(
            path / "arrays.npz",
            units=self.composition.units,
            support_bank=self.support.bank,
            support_threshold=np.array(self.support.threshold),
            action_low=self.action_low,
            action_high=self.action_high,
            **self.initial.to_arrays(),  # type: ignore[arg-type]
        )
        pop_dir = path / "population"
        if pop_dir.exists():
            shutil.rmtree(pop_dir)
        self.population.save(pop_dir)
        (path / "population.kind").write_text(
            "empirical" if isinstance(self.population, EmpiricalPopulation) else "model"
        )
        for i, m in enumerate(self.members):
            mdir = path / f"member_{i}"
            if mdir.exists():
                shutil.rmtree(mdir)
            m.save(mdir)
        return path

    @classmethod
    def load(cls, path: str | Path) -> Twin:
        """Read a twin written by `save`.

        Raises:
            InputError: the directory is not a twin.
        """
        path = Path(path)
        if not (path / "meta.json").is_file() or not (path / "layout.json").is_file():
            raise InputError("not a twin directory (no meta.json / layout.json)", str(path))
        meta = json.loads((path / "meta.json").read_text())
        layout = Layout.from_dict(json.loads((path / "layout.json").read_text()))
        arr = np.load(path / "arrays.npz")
        n_scen = len(layout.scenarios)
        if (path / "population.kind").read_text().strip() == "empirical":
            table = pd.read_parquet(path / "population" / "empirical.parquet")
            population: Any = EmpiricalPopulation(table, layout.profile)
        else:
            from edgetwin.generative import load_population

            population = load_population(path / "population")
        members = [Member.load(path / f"member_{i}", n_scen) for i in range(int(meta["members"]))]
        return cls(
            layout,
            members,
            population,
            Composition(units=arr["units"]),
            InitialStates.from_arrays(arr, n_scen),
            SupportIndex(bank=arr["support_bank"], threshold=float(arr["support_threshold"])),
            arr["action_low"],
            arr["action_high"],
            meta,
        )

    # --- sampling --------------------------------------------------------------------------------
    def sample_population(self, n: int, scenario: str | None = None, seed: int = 0) -> pd.DataFrame:
        """``n`` virtual agents: DataFrame ``[scenario, profile.*]`` from the population model."""
        if scenario is not None and scenario not in self.layout.scenarios:
            raise InputError(
                f"unknown scenario {scenario!r}; the twin knows {self.layout.scenarios}", "scenario"
            )
        return self.population.sample(n, scenario=scenario, seed=seed)

    def simulation(
        self, n_agents: int | None = None, seed: int = 0, stochastic: bool = True, member: int | None = None
    ) -> Simulation:
        """A batched simulation (the engine under every environment and `rollout`)."""
        return Simulation(self, n_agents=n_agents, seed=seed, stochastic=stochastic, member=member)

    def logging_policy(self, seed: int = 0, stochastic: bool = True, member: int = 0) -> ClonedPlatformPolicy:
        """The behaviour clone of the logging platform policy, one engine per scenario.

        Observations carry no scenario label, so each row's scenario is recognised from its
        profile by a 5-nearest-neighbour classifier over the logged agents' profiles.
        """
        banks = [(s, z) for s, z in enumerate(self.initial.zprofiles) if len(z)]
        scenario_of = None
        if len(banks) > 1 and self.layout.profile:
            from sklearn.neighbors import KNeighborsClassifier

            z = np.concatenate([b for _, b in banks])
            labels = np.concatenate([np.full(len(b), s) for s, b in banks])
            scenario_of = KNeighborsClassifier(n_neighbors=min(5, len(z))).fit(z, labels)
        elif len(banks) == 1:
            scenario_of = _Constant(banks[0][0])
        return ClonedPlatformPolicy(
            self.layout, self.members[member].engines, stochastic=stochastic, seed=seed, scenario_of=scenario_of
        )

    # --- environments ------------------------------------------------------------------------------
    def make_env(self, **opts: Any) -> Any:
        """A `gymnasium.Env` where the platform acts per agent, round-robin over a tick's agents.

        See `edgetwin.twin.envs.TwinEnv` for the options (``n_agents``, ``steps``,
        ``disagreement_penalty``, ``stochastic``, ``seed``).
        """
        from edgetwin.twin.envs import TwinEnv

        return TwinEnv(self, **opts)

    def make_vec_env(self, n_agents: int | None = None, **opts: Any) -> Any:
        """An SB3 `VecEnv` with one sub-env per agent, all stepped in one batch (the fast path)."""
        from edgetwin.twin.envs import TwinVecEnv

        return TwinVecEnv(self, n_agents=n_agents, **opts)

    def make_parallel_env(self, **opts: Any) -> Any:
        """A PettingZoo `ParallelEnv` with one platform agent per scenario."""
        from edgetwin.twin.envs import TwinParallelEnv

        return TwinParallelEnv(self, **opts)

    # --- rollouts ----------------------------------------------------------------------------------
    def rollout(
        self,
        policy: PlatformPolicy,
        episodes: int = 1,
        seed: int = 0,
        n_agents: int | None = None,
        steps: int | None = None,
        stochastic: bool = True,
        progress: bool = False,
        all_members: bool = False,
    ) -> pd.DataFrame:
        """Run ``policy`` in the twin and return a log in the input format.

        Args:
            policy: acts on ``(N, P+S)`` raw observations ``[profile.*, state.*]``.
            episodes: independent episodes (each a fresh population and ensemble member).
            seed: the same seed gives the same table.
            n_agents: agents per episode (default: one logged site unit's worth).
            steps: ticks per episode (default: the logs' typical episode length).
            stochastic: sample client responses (True) or use their mean.
            all_members: run every episode once per ensemble member (same population and
                seed), so that mean returns are the ensemble's mean rather than one member's;
                episodes are then labelled ``twin-<seed>-<episode>-m<member>``.

        Returns:
            One row per ``(episode, t, agent)`` with the contract's columns and ``reward``;
            ``df.attrs["support"]`` = ``{"out_of_support": fraction of sampled steps whose
            [profile, state, action] is beyond the logs' 99th-percentile nearest-neighbour
            distance, "median_distance": ..., "disagreement": mean ensemble disagreement,
            "profile_redrawn": share of generated profiles redrawn because they were out of the
            logged profiles' support, "profile_outside": share still outside after the redraws}``.
        """
        records = []
        runs = [(e, m) for e in range(episodes) for m in (range(self.n_members) if all_members else [None])]
        for e, m in tqdm(runs, desc="rollout", disable=not progress, leave=False):
            sim = self.simulation(
                n_agents=n_agents,
                seed=int(np.random.default_rng([seed, e]).integers(2**31)),
                stochastic=stochastic,
                member=m,
            )
            name = f"twin-{seed}-{e}" if m is None else f"twin-{seed}-{e}-m{m}"
            records.append(sim.run(policy, steps=steps, episode=name))
        return RolloutRecord.concat(records, self.support.threshold)


# ------------------------------------------------------------------------------------ simulation
@dataclass
class StepResult:
    """One tick of a `Simulation`: raw arrays, row-aligned with the simulation's agents."""

    obs: np.ndarray
    action: np.ndarray
    outputs: np.ndarray
    next_state: np.ndarray
    reward: np.ndarray
    disagreement: np.ndarray


@dataclass
class RolloutRecord:
    frame: pd.DataFrame
    support: dict[str, float]

    @staticmethod
    def concat(records: list[RolloutRecord], threshold: float) -> pd.DataFrame:
        """One log table of several runs; ``attrs["support"]`` = their support reports averaged."""
        df = pd.concat([r.frame for r in records], ignore_index=True)
        keys = ("out_of_support", "median_distance", "disagreement", "profile_redrawn", "profile_outside")
        df.attrs["support"] = {k: float(np.mean([r.support[k] for r in records])) for k in keys}
        df.attrs["support"]["threshold"] = threshold
        return df


class Simulation:
    """A twin world of agents on sites, stepped in one batch per tick.

    Args:
        twin: the twin.
        n_agents: agents (default: one logged site unit's worth, drawn at each reset).
        seed: seeds population, initial states, acting member and response noise.
        stochastic: sample responses from the client models' Gaussians (else their means).
        member: fix the acting ensemble member (default: drawn per reset).
    """

    def __init__(
        self,
        twin: Twin,
        n_agents: int | None = None,
        seed: int = 0,
        stochastic: bool = True,
        member: int | None = None,
    ) -> None:
        self.twin = twin
        self.layout = twin.layout
        self.n_agents = n_agents
        self.stochastic = stochastic
        self.fixed_member = member
        self.rng = np.random.default_rng(seed)
        self._reward_fn = (
            twin.spec.reward_fn() if (twin.spec.reward_weights or twin.spec.reward_function) else None
        )
        self.world: World
        self.member = 0
        self.site_names: list[str] = []
        self.agent_names: list[str] = []
        self.reset()

    @property
    def n(self) -> int:
        return self.world.n

    def reset(self, seed: int | None = None) -> np.ndarray:
        """New agents and initial states; returns the observations ``(N, P+S)``."""
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        lay = self.layout
        scen, site = self.twin.composition.sample(self.rng, self.n_agents)
        profile = np.zeros((len(scen), len(lay.profile)))
        retries = self.twin.profile_retries if lay.profile else 0
        redrawn, outside = 0, 0
        for s in np.unique(scen):
            idx = np.flatnonzero(scen == s)
            for attempt in range(retries + 1):
                pop = self.twin.population.sample(
                    len(idx), scenario=lay.scenarios[s], seed=int(self.rng.integers(2**31))
                )
                profile[idx] = lay.scalers["profile"].legalise(pop[lay.profile].to_numpy(np.float64))
                if retries == 0:
                    break
                ok = self.twin.profile_support.inside(int(s), lay.scalers["profile"].transform(profile[idx]))
                if attempt == 0:
                    redrawn += int((~ok).sum())
                idx = idx[~ok]
                if len(idx) == 0:
                    break
            outside += len(idx) if retries else 0
        profile = lay.scalers["profile"].legalise(profile)
        #: share of this population's first-drawn profiles that were out of support (and redrawn),
        #: and of its final profiles still out of support after ``profile_retries`` redraws
        self.profile_redrawn = redrawn / max(1, len(scen))
        self.profile_outside = outside / max(1, len(scen))
        state = self.twin.initial.sample(lay, scen, profile, self.rng)
        n_sites = int(site.max()) + 1
        self.member = (
            self.fixed_member
            if self.fixed_member is not None
            else int(self.rng.integers(self.twin.n_members))
        )
        self.place(World(lay, scen, site, profile, state, np.zeros((n_sites, lay.n_lag))))
        self.site_names = [f"site{k}" for k in range(n_sites)]
        self.agent_names = [f"agent{i}" for i in range(len(scen))]
        return self.obs()

    def place(self, world: World) -> None:
        """Run this simulation on ``world`` (e.g. agents and states taken from a log) from its tick.

        The world gets the acting member's site-state model, and the tick's pending responses are
        cleared. Agent and site names are kept when their counts still match.
        """
        world.site_model = self.twin.members[self.member].site_model if self.twin.members else None
        self.world = world
        self._pending_y = np.zeros((world.n, self.layout.n_model_outputs), np.float32)
        self._pending_a = np.zeros((world.n, len(self.layout.action)))
        if len(self.agent_names) != world.n:
            self.agent_names = [f"agent{i}" for i in range(world.n)]
        if len(self.site_names) != world.n_sites:
            self.site_names = [f"site{k}" for k in range(world.n_sites)]

    def obs(self) -> np.ndarray:
        """``(N, P+S)`` raw ``[profile.*, state.*]``: what the platform policy sees."""
        return np.concatenate([self.world.profile, self.world.state], axis=1).astype(np.float32)

    def legal_action(self, action: np.ndarray) -> np.ndarray:
        """Raw actions ``(n, A)`` clipped to the twin's action bounds, discrete ones snapped."""
        action = np.asarray(action, dtype=np.float64).reshape(-1, len(self.layout.action))
        return self.layout.scalers["action"].legalise(
            np.clip(action, self.twin.action_low, self.twin.action_high)
        )

    def respond(
        self, rows: np.ndarray, action: np.ndarray, with_disagreement: bool = True
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The responses of agents ``rows`` to raw actions ``(len(rows), A)`` at this tick.

        The client model is causal per agent, so this needs no other agent's action of the tick.
        The responses are kept until `end_tick` applies them.

        Returns:
            ``(raw outputs (n, Y), reward (n,), disagreement (n,))``.
        """
        lay, w = self.layout, self.world
        rows = np.asarray(rows, dtype=np.int64)
        action = self.legal_action(np.asarray(action).reshape(len(rows), -1))
        x = w.client_inputs(action, rows)
        y = np.zeros((len(rows), lay.n_model_outputs), np.float32)
        disagreement = np.zeros(len(rows))
        models = self.twin._models
        scen = w.scenario[rows]
        for s in np.unique(scen):
            idx = np.flatnonzero(scen == s)
            if with_disagreement and len(models) > 1:
                means = np.stack([m[s].mean(x[idx]) for m in models])  # (M, n_s, out)
                mu = means[self.member]
                disagreement[idx] = means.std(axis=0).mean(axis=1)
            else:
                mu = models[self.member][s].mean(x[idx])
            if self.stochastic:
                # noise on the outputs only: the client's Gaussian has one std per output for all
                # inputs, and fed into Δstate it compounds into drift far beyond the logged noise
                ny = lay.n_outputs
                std = np.asarray(models[self.member][s].std, dtype=np.float32)[:ny]
                mu = mu.copy()
                mu[:, :ny] = np.clip(mu[:, :ny] + std * self.rng.standard_normal((len(idx), ny)), -10.0, 10.0)
            y[idx] = mu
        self._pending_y[rows] = y
        self._pending_a[rows] = action
        ny = lay.n_outputs
        outputs = lay.scalers["outputs"].inverse(y[:, :ny]) if ny else np.zeros((len(rows), 0))
        reward = self.reward_of(rows, w.state[rows], action, outputs)
        return outputs, reward, disagreement

    @property
    def pending_action(self) -> np.ndarray:
        """``(N, A)`` the legal actions of this tick so far (what `end_tick` will apply); a copy."""
        return self._pending_a.copy()

    def override_outputs(self, rows: np.ndarray, outputs: np.ndarray) -> None:
        """Replace the pending raw outputs ``(len(rows), Y)`` of agents ``rows`` at this tick.

        `end_tick` then moves the world by them: the next tick's site aggregates and the
        site-level state see the replaced outputs (a what-if that perturbs responses).
        """
        rows = np.asarray(rows, dtype=np.int64)
        ny = self.layout.n_outputs
        if ny:
            legal = self.layout.scalers["outputs"].legalise(np.asarray(outputs, np.float64).reshape(len(rows), ny))
            self._pending_y[rows, :ny] = self.layout.scalers["outputs"].transform(legal)

    def end_tick(self) -> np.ndarray:
        """Apply the tick's responses: every agent moves to its next state. Returns it ``(N, S)``."""
        _, nxt = self.world.apply(self._pending_a, self._pending_y, self.twin._transitions[self.member])
        return nxt

    def step(self, action: np.ndarray, with_disagreement: bool = True) -> StepResult:
        """Apply raw platform actions ``(N, A)`` for all agents at this tick and advance."""
        obs = self.obs()
        rows = np.arange(self.n)
        outputs, reward, disagreement = self.respond(rows, action, with_disagreement)
        legal = self._pending_a.copy()
        nxt = self.end_tick()
        return StepResult(obs, legal, outputs, nxt, reward, disagreement)

    def reward_of(
        self, rows: np.ndarray, state: np.ndarray, action: np.ndarray, outputs: np.ndarray
    ) -> np.ndarray:
        """The spec's reward ``(n,)`` of agents ``rows`` given raw state, action and outputs.

        Uses the spec's reward function or weights when it has one, else the predicted ``reward``
        output (zeros when there is neither).
        """
        lay = self.layout
        cols: dict[str, np.ndarray] = {}
        for j, c in enumerate(lay.profile):
            cols[c] = self.world.profile[rows, j]
        for j, c in enumerate(lay.state):
            cols[c] = state[:, j]
        for j, c in enumerate(lay.action):
            cols[c] = action[:, j]
        for j, c in enumerate(lay.outputs):
            cols[c] = outputs[:, j]
        if self._reward_fn is not None:
            return np.asarray(self._reward_fn(cols), dtype=np.float64).reshape(-1)
        if REWARD_COLUMN in cols:
            return cols[REWARD_COLUMN].astype(np.float64)
        return np.zeros(len(action))

    def run(self, policy: PlatformPolicy, steps: int | None = None, episode: str = "twin-0") -> RolloutRecord:
        """Roll ``policy`` from the current state for ``steps`` ticks; a log table + support report."""
        lay = self.layout
        steps = lay.horizon if steps is None else int(steps)
        cols = ordered_columns(lay.spec, [REWARD_COLUMN])
        blocks: list[dict[str, np.ndarray]] = []
        dis = []
        for t in range(steps):
            obs = self.obs()
            act = np.asarray(policy.act(obs), dtype=np.float64)
            res = self.step(act)
            blk: dict[str, Any] = {"t": np.full(self.n, t)}
            for j, c in enumerate(lay.profile):
                blk[c] = self.world.profile[:, j]
            for j, c in enumerate(lay.state):
                blk[c] = res.obs[:, len(lay.profile) + j].astype(np.float64)
            for j, c in enumerate(lay.action):
                blk[c] = res.action[:, j]
            for j, c in enumerate(lay.outputs):
                blk[c] = res.outputs[:, j]
            blk[REWARD_COLUMN] = res.reward
            blocks.append(blk)
            dis.append(float(res.disagreement.mean()))
        frame = pd.DataFrame({k: np.concatenate([b[k] for b in blocks]) for k in blocks[0]})
        frame.insert(0, "episode", episode)
        frame.insert(2, "agent", np.tile(self.agent_names, steps))
        frame.insert(3, "scenario", np.tile(np.asarray(lay.scenarios)[self.world.scenario], steps))
        frame.insert(4, "site", np.tile(np.asarray(self.site_names)[self.world.site], steps))
        frame = frame[[c for c in cols if c in frame.columns]]
        support = self.support_of(frame)
        support["disagreement"] = float(np.mean(dis)) if dis else 0.0
        support["profile_redrawn"] = self.profile_redrawn
        support["profile_outside"] = self.profile_outside
        return RolloutRecord(frame, support)

    def support_of(self, frame: pd.DataFrame, max_rows: int = 5000) -> dict[str, float]:
        lay = self.layout
        sub = frame.sample(min(max_rows, len(frame)), random_state=0) if len(frame) > max_rows else frame
        z = np.concatenate(
            [
                lay.scalers["profile"].transform(sub[lay.profile].to_numpy(np.float64)),
                lay.scalers["state"].transform(sub[lay.state].to_numpy(np.float64)),
                lay.scalers["action"].transform(sub[lay.action].to_numpy(np.float64)),
            ],
            axis=1,
        )
        d = self.twin.support.distance(z)
        return {
            "out_of_support": float((d > self.twin.support.threshold).mean()) if len(d) else 0.0,
            "median_distance": float(np.median(d)) if len(d) else 0.0,
        }


def set_torch_threads(n: int = 1) -> None:
    """Small MLPs on 2 shared cores run fastest single-threaded."""
    th.set_num_threads(n)
