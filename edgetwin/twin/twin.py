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
log contract, `edgetwin.contract`) and never `policies`, `emulator`, `edge` or `federation`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch as th
from tqdm.auto import tqdm

from edgetwin.contract.errors import InputError
from edgetwin.contract.json_bounds import read_json
from edgetwin.contract.manifest import MANIFEST_FILE, SIGNATURE_FILE, verify_manifest, write_manifest
from edgetwin.contract.policy import PlatformPolicy
from edgetwin.contract.spec import TwinSpec
from edgetwin.imitation.baselines import ClonedPlatformPolicy, SupervisedResponseModel
from edgetwin.imitation.causal import CausalResponseModel, InvarianceChoice, choose_invariance
from edgetwin.imitation.layout import Layout
from edgetwin.imitation.mail import (
    MailConfig,
    client_rows,
    fit_engines,
    fit_mail,
    fit_transition,
)
from edgetwin.imitation.overlap import overlap_report
from edgetwin.imitation.site_model import SiteStateModel
from edgetwin.imitation.steps import build_steps
from edgetwin.imitation.world import Composition, InitialStates
from edgetwin.twin.envs import TwinEnv, TwinParallelEnv, TwinVecEnv
from edgetwin.twin.intervals import LEVEL, Calibration, interval
from edgetwin.twin.logdata import (
    MappedLog,
    bootstrap_episodes,
    data_sha256,
    episode_hash_columns,
    episode_hashes,
    library_versions,
    load_log,
)
from edgetwin.twin.member import Member
from edgetwin.twin.parallel import check_ray, resolve_workers, run_tasks
from edgetwin.twin.simulation import RolloutRecord, Simulation
from edgetwin.twin.support import ProfileSupport, SupportIndex

log = logging.getLogger(__name__)

#: 2: every file is data (networks in safetensors, other models npz, metadata JSON / TOML); twins
#: of format 1 pickled their models and are refused (`Twin.load`).
FORMAT_VERSION = 2
#: The longest ``meta.json`` / ``layout.json`` read (bytes); a twin's are kilobytes.
_MAX_JSON_BYTES = 64 * 1024 * 1024
RESPONSE_MODELS = ("mail", "bc", "supervised", "causal")
TRANSITION_MODELS = ("site", "client")


# ------------------------------------------------------------------------------------ helpers
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


class PopulationSampler:
    """``(n, scenario, seed) -> raw profiles (n, P)`` from a population model: the profile sampler
    MAIL-MMSG's training worlds draw from (a class, not a closure, so a pool worker can unpickle it)."""

    def __init__(self, population: Any, profile: list[str]) -> None:
        self.population = population
        self.profile = profile

    def __call__(self, n: int, scenario: str, seed: int) -> np.ndarray:
        return self.population.sample(n, scenario=scenario, seed=seed)[self.profile].to_numpy(np.float64)


def _fit_member_task(
    df: pd.DataFrame | MappedLog,
    episodes: np.ndarray,
    layout: Layout,
    response_model: str,
    cfg: MailConfig,
    sampler: PopulationSampler,
    initial: InitialStates,
    composition: Composition,
    progress: bool,
    transition_model: str,
    site_model: bool | list[str],
    invariances: Mapping[int, InvarianceChoice] | None,
    m: int,
    pick: np.ndarray | None,
    seed: int,
) -> Member:
    """One ensemble member from the log, its bootstrap draw ``pick`` and its seed: a task of
    `edgetwin.twin.parallel.run_tasks` (serial, pool or Ray give the same member), with its output
    noise model fitted on the episodes of its draw (`Member.fit_output_noise`: its own per-row spread;
    the days a draw left out carry their day's regime too, issue 44)."""
    member = Twin._fit_member(
        df.draw(episodes, pick) if isinstance(df, MappedLog) else bootstrap_episodes(df, episodes, pick),
        layout,
        response_model,
        cfg,
        sampler,
        initial,
        composition,
        seed,
        progress,
        transition_model,
        site_model,
        invariances,
    )
    return member.fit_output_noise(df, episodes, pick, layout, seed + 700)


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
        self.member_models = [m.models() for m in members]
        self.member_transitions = [m.transition_models() for m in members]
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
        response_model: str = "auto",
        population_model: str = "gan-smmsg",
        population_hyper: Mapping[str, Any] | None = None,
        use_time: bool = True,
        transition_model: str = "client",
        site_model: bool | Sequence[str] = False,
        workers: int | None = 1,
        ray_address: str | None = None,
        beside: Executor | None = None,
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
                only), ``"supervised"`` (one-step MLP regression baseline), ``"causal"``
                (`edgetwin.imitation.causal.CausalResponseModel`: one-step regression whose residuals
                are invariant across the log's ``policy`` ids, so it learns the actions' effects, not
                the logging policies' habits) or ``"auto"``: ``"causal"`` when the log holds
                at least two policies and its actions vary independently of the context
                (`edgetwin.imitation.overlap.overlap_report`, kept in ``twin.meta["overlap"]``), else
                ``"mail"``; the default. The causal model chooses its invariance weight by
                cross-fitting on the log (`edgetwin.imitation.causal.select_invariance`), once per
                scenario on the whole log, and every member fits at it. Why ``"auto"``
                is the default: on the causal-twin benchmark's logs with several policies
                (docs/benchmarks/causal_twin/README.md, two regimes and 1-3 randomized canary rounds)
                the causal model ranks unseen policies better than MAIL-MMSG on every log (quick run,
                generated ρ 0.75-0.95 vs 0.27-0.75) with 19-60 % less error; on the second system's
                two-regime log it ranks better but errs more (the page says by how much). On a log of
                one policy (the demo's, most operators' today) ``"auto"`` is ``"mail"``: such a log
                cannot tell effects from habits, and the causal model would be plain regression.
            population_model: a model of `edgetwin.generative.MODELS`, or ``"empirical"`` (resample
                logged profiles).
            population_hyper: hyper-parameters of the population model (e.g. ``{"steps": 500}``).
            use_time: give the client model time-of-day inputs.
            transition_model: when the spec names no transition, how the next state is learned:
                ``"client"`` (default: the client model's own ``Δstate``) or ``"site"`` (a
                separate model that also sees the agent's own outputs and its site's actions and
                outputs of the tick, `edgetwin.imitation.mail.fit_transition`; on the emulated
                cluster it ranked policies worse, see docs/benchmarks/CHANGELOG.md).
            site_model: when the log has site-level state columns (one value per site and tick),
                move them by a `SiteStateModel` that sees the whole site's tick (every agent's
                action and output): True for all of them, or a list of those column names;
                False (default): by the mean of the agents' own predictions. Off by default: on
                the emulated cluster it did not rank policies better on every seed
                (docs/benchmarks/twin_site_state/README.md; docs/benchmarks/CHANGELOG.md).
            workers: fit the ensemble members on a local process pool of this many processes
                (``None``/0: one per core; 1: serially, in this process). The twin does not depend
                on it: each member's data and seed are drawn before any is fitted
                (`edgetwin.twin.parallel`).
            ray_address: fit the members as tasks on this Ray cluster instead (``"local"`` starts
                one here; needs ``pip install -e ".[ray]"``); the same twin again.
            beside: a process pool already running (the demo's warm worker on its second core): the
                members are fitted by this process and it together, instead of ``workers``
                (`edgetwin.twin.parallel.run_tasks`); the same twin again.
            **hyper: `edgetwin.imitation.mail.MailConfig` fields (``rounds``, ``bc_epochs``, ...).
                Behaviour cloning runs ``bc_epochs`` passes, at most ``bc_max_steps`` gradient
                steps per model (default 5,000: it binds past ~64k rows of a scenario, so a
                million-row fit does not cost 35 times a 29k-row one; 0: no cap).

        Raises:
            InputError: unusable log/spec, an unknown option or hyper-parameter.
        """
        cfg = _check_fit_args(members, response_model, transition_model, hyper, workers, ray_address)
        t_start = time.perf_counter()
        df, spec = load_log(log, spec)
        df = df.sort_values(["episode", "t", "agent"], kind="stable").reset_index(drop=True)
        # beside a running pool (the demo's spare core, idle until the members start) the overlap
        # report, which needs the log only, is computed there while the population model is fitted
        # here; it decides nothing before the members (without a checkpoint to stamp)
        later = beside.submit(overlap_report, df, spec, seed) if beside is not None and checkpoint_dir is None else None
        overlap = overlap_report(df, spec, seed=seed) if later is None else None
        if overlap is not None:
            response_model = _response_model(overlap, response_model, cfg)
        layout = Layout.fit(df, spec, use_time=use_time)
        if not isinstance(site_model, bool):
            site_model = list(site_model)
            SiteStateModel.select_columns(layout, site_model)  # bad names fail before any fitting
        sha = data_sha256(df)
        ckpt = _stamp_checkpoint(
            checkpoint_dir,
            {
                "data_sha256": sha,
                "seed": seed,
                "response_model": response_model,
                "transition_model": transition_model,
                "site_model": site_model,
                "hyper": cfg.__dict__,
            },
        )

        population = cls._fit_population(
            df, spec, population_model, seed, progress, dict(population_hyper or {})
        )
        if later is not None:
            overlap = later.result()
            response_model = _response_model(overlap, response_model, cfg)
        assert overlap is not None
        composition = Composition.fit(df, layout)
        initial = InitialStates.fit(df, layout)

        sampler = PopulationSampler(population, layout.profile)
        # the causal model's invariance weight, chosen once per scenario on the whole log for every member
        invariances = _choose_invariances(df, layout, cfg, seed) if response_model == "causal" else None
        episodes = df["episode"].unique()
        fitted, tasks = _plan_members(members, seed, len(episodes), ckpt, len(layout.scenarios))
        (support, a_low, a_high), hashes = _members_then_tail(
            fitted, tasks, ckpt, (df, layout, spec, seed), workers=workers, ray_address=ray_address, progress=progress,
            beside=beside,
            data=(df, episodes, layout, response_model, cfg, sampler, initial, composition),
            options=(transition_model, site_model, invariances),
        )  # fmt: skip
        fitted_list = [fitted[m] for m in range(members)]
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
            # per-episode hashes: the gate refuses to calibrate on episodes the twin was fitted on
            "episode_hash_columns": episode_hash_columns(layout),
            "episode_sha256": hashes,
            "n_rows": len(df),
            "n_episodes": len(episodes),
            "overlap": overlap.to_dict(),
            "spec_hash": spec.hash(),
            "versions": library_versions(),
            "fit_seconds": time.perf_counter() - t_start,
        }
        return cls(layout, fitted_list, population, composition, initial, support, a_low, a_high, meta)

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
        invariances: Mapping[int, InvarianceChoice] | None = None,
    ) -> Member:
        steps = build_steps(sub, layout)
        del sub  # the steps hold what the fit needs; a bootstrap copy of a large log would stay resident
        transition = fit_transition(steps, layout, cfg, seed) if transition_model == "site" else None
        sites = (
            SiteStateModel.fit(
                steps, layout, seed=seed + 400, columns=None if site_model is True else site_model
            )
            if site_model
            else None
        )
        if response_model in ("supervised", "causal"):
            clients: dict[int, Any] = {}
            policy = steps.policy_ids()
            # an agent's day: its rows are not independent, so the causal model's cross-fitted choice
            # of its invariance keeps them in one fold (where it is not chosen already: ``invariances``)
            agent_day = steps.agent_days()
            for s in range(len(layout.scenarios)):
                rows = client_rows(steps, layout, s)
                if response_model == "causal":
                    clients[s] = CausalResponseModel(tuple(cfg.net_arch), seed=seed + s).fit(
                        steps.x_client[rows], steps.y_client[rows], None if policy is None else policy[rows],
                        groups=agent_day[rows], chosen=None if invariances is None else invariances.get(s),
                    )
                else:
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

    def update(
        self,
        new_logs: str | Path | pd.DataFrame,
        old_logs: Sequence[str | Path | pd.DataFrame],
        seed: int = 0,
        **options: Any,
    ) -> Twin:
        """A new twin that also learned from ``new_logs`` (a canary's rows) without a refit: see
        `edgetwin.twin.update.update_twin` (``old_logs``: this twin's training data)."""
        from edgetwin.twin.update import update_twin

        return update_twin(self, new_logs, old_logs, seed=seed, **options)  # type: ignore[no-any-return]

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
            unit_sites=self.composition.unit_sites,
            unit_profile=self.composition.unit_profile,
            unit_state=self.composition.unit_state,
            action_low=self.action_low,
            action_high=self.action_high,
            **self.support.to_arrays(),  # type: ignore[arg-type]
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
        # last: seal every file (metadata included; a fit's checkpoint too) against later edits; a
        # signature of what was here before no longer holds
        (path / SIGNATURE_FILE).unlink(missing_ok=True)
        write_manifest(path, "twin", require=_TWIN_FILES)
        return path

    @classmethod
    def load(cls, path: str | Path) -> Twin:
        """Read a twin written by `save`, after checking every file against its manifest.

        Raises:
            InputError: the directory is not a twin, its manifest is missing or a file is missing,
                added or altered (`ArtifactTampered`, naming the file), or a sealed file cannot be
                read (naming it).
        """
        path = Path(path)
        if not (path / "meta.json").is_file() and not (path / MANIFEST_FILE).is_file():
            raise InputError("not a twin directory (no meta.json / layout.json)", str(path))
        manifest = verify_manifest(path, "twin", require=_TWIN_FILES)
        meta = _read_sealed(path / "meta.json", lambda p: read_json(p, max_bytes=_MAX_JSON_BYTES))
        version = meta.get("format_version") if isinstance(meta, dict) else None
        if version != FORMAT_VERSION:
            raise InputError(
                f"twin format {version!r}, this edgetwin reads format {FORMAT_VERSION} (artifacts are data: "
                "safetensors, JSON, npz; older twins pickled their models and are never loaded): refit it "
                "with `edgetwin fit`",
                str(path / "meta.json"),
            )
        layout = _read_sealed(path / "layout.json", lambda p: Layout.from_dict(read_json(p, max_bytes=_MAX_JSON_BYTES)))
        spec = _read_sealed(path / "spec.toml", TwinSpec.load)
        if spec.hash() != layout.spec.hash():
            raise InputError("spec.toml is not the spec the twin was fitted with", str(path / "spec.toml"))

        def arrays(p: Path) -> dict[str, np.ndarray]:
            with np.load(p, allow_pickle=False) as z:
                return {k: z[k] for k in z.files}

        arr = _read_sealed(path / "arrays.npz", arrays)
        n_scen = len(layout.scenarios)
        kind = _read_sealed(path / "population.kind", lambda p: p.read_text().strip())
        if kind == "empirical":
            table = _read_sealed(path / "population" / "empirical.parquet", pd.read_parquet)
            population: Any = EmpiricalPopulation(table, layout.profile)
        else:
            from edgetwin.generative import load_population

            population = _read_sealed(path / "population", load_population)
        n_members = meta.get("members") if isinstance(meta, dict) else None
        if not isinstance(n_members, int) or n_members < 1:
            raise InputError(f"'members' must be a positive integer, got {n_members!r}", str(path / "meta.json"))
        for i in range(n_members):
            if not any(f.startswith(f"member_{i}/") for f in manifest["files"]):
                raise InputError(f"member_{i} is missing (meta.json says {n_members} members)", str(path / f"member_{i}"))
        members = [
            _read_sealed(path / f"member_{i}", lambda p: Member.load(p, n_scen)) for i in range(n_members)
        ]
        try:
            return cls(
                layout,
                members,
                population,
                Composition(
                    units=arr["units"],
                    **{k: arr[k] for k in ("unit_sites", "unit_profile", "unit_state") if k in arr},
                ),
                InitialStates.from_arrays(arr, n_scen),
                SupportIndex.from_arrays(arr),
                arr["action_low"],
                arr["action_high"],
                meta,
            )
        except (KeyError, ValueError, TypeError, IndexError) as e:
            raise InputError(f"inconsistent twin arrays ({type(e).__name__}: {e})", str(path / "arrays.npz")) from None

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
        return TwinEnv(self, **opts)

    def make_vec_env(self, n_agents: int | None = None, **opts: Any) -> Any:
        """An SB3 `VecEnv` with one sub-env per agent, all stepped in one batch (the fast path)."""
        return TwinVecEnv(self, n_agents=n_agents, **opts)

    def make_parallel_env(self, **opts: Any) -> Any:
        """A PettingZoo `ParallelEnv` with one platform agent per scenario."""
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
        calibration: Calibration | None = None,
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
            calibration: the twin's calibration on held-out logs (`edgetwin.twin.calibration.calibrate`),
                to widen the summary's intervals by the twin's measured error (default: none, the
                intervals then cover only what the members and episodes disagree on).

        Returns:
            One row per ``(episode, t, agent)`` with the contract's columns and ``reward``;
            ``df.attrs["support"]`` = ``{"out_of_support": fraction of sampled steps outside the
            logs' support (`edgetwin.twin.support.SupportIndex`: a context or an action-in-context
            farther from the logs than 99 % of an unseen logged day's steps), "median_distance": the
            median of that distance in units of its threshold, "disagreement": mean ensemble disagreement,
            "profile_redrawn": share of generated profiles redrawn because they were out of the
            logged profiles' support, "profile_outside": share still outside after the redraws}``;
            ``df.attrs["summary"]`` = per column (``reward``, ``response.*``, ``kpi.*``) ``{"mean",
            "low", "high", "level": 0.9, "calibrated"}``: the mean over every agent-step and its 90 %
            interval (`edgetwin.twin.intervals.interval`: two-level bootstrap over members x
            episodes, widened by ``calibration`` when given).
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
        df = RolloutRecord.concat(records, self.support.threshold)
        df.attrs["summary"] = self._summary(records, episodes, calibration, seed)
        return df

    def _summary(
        self, records: list[RolloutRecord], episodes: int, calibration: Calibration | None, seed: int
    ) -> dict[str, dict[str, Any]]:
        """Each output column's mean and 90 % interval over ``records`` (member-major when there
        are several members per episode; see `rollout`)."""
        cols = ["reward", *self.spec.names("response"), *self.spec.names("kpi")]
        per_run = np.array([[float(r.frame[c].mean()) if c in r.frame else np.nan for c in cols] for r in records])
        members = len(records) // max(1, episodes)
        # runs are ordered episode-major: (e0 m0, e0 m1, ..., e1 m0, ...) -> (M, R) per column
        values = per_run.reshape(episodes, members, len(cols)).transpose(1, 0, 2)
        out: dict[str, dict[str, Any]] = {}
        for j, c in enumerate(cols):
            v = values[:, :, j]
            if not np.isfinite(v).any():
                continue
            lo, hi = interval(v, calibration, c, seed=seed)
            out[c] = {"mean": float(np.nanmean(v)), "low": lo, "high": hi, "level": LEVEL,
                      "calibrated": calibration is not None and c in calibration.quantile}
        return out


def set_torch_threads(n: int = 1) -> None:
    """Small MLPs on 2 shared cores run fastest single-threaded."""
    th.set_num_threads(n)


#: Files every twin directory has (its manifest must list them).
_TWIN_FILES = ("meta.json", "layout.json", "spec.toml", "arrays.npz", "population.kind")


def _read_sealed(path: Path, read: Any) -> Any:
    """``read(path)``, with any failure turned into an `InputError` naming ``path``.

    The manifest has already vouched for the bytes, so a failure here means a file written by
    another version of edgetwin or its libraries: say which file, not a raw exception.
    """
    try:
        return read(path)
    except InputError:
        raise
    except Exception as e:  # torch / pickle / numpy / pandas each raise their own kinds
        raise InputError(f"cannot read it ({type(e).__name__}: {e})", str(path)) from None


def _check_fit_args(
    members: int,
    response_model: str,
    transition_model: str,
    hyper: Mapping[str, Any],
    workers: int | None,
    ray_address: str | None,
) -> MailConfig:
    """`Twin.fit`'s option checks, before the log is read: one-line `InputError`s naming the
    option, so a typo fails in a second rather than after minutes of fitting.

    Returns:
        The `MailConfig` built from ``hyper``.
    """
    if members < 1:
        raise InputError(f"members must be >= 1, got {members}", "--members")
    if response_model not in (*RESPONSE_MODELS, "auto"):
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
    resolve_workers(workers, members)  # a bad count or Ray address fails before any fitting
    if ray_address is not None:
        check_ray(ray_address)
    return cfg


def _response_model(overlap: Any, response_model: str, cfg: MailConfig) -> str:
    """`Twin.fit`'s response model once the log's overlap report is known (``"auto"`` resolved; no
    MAIL rounds for ``"bc"``)."""
    logging.getLogger(__name__).info("%s", overlap.summary())
    if response_model == "auto":
        response_model = "causal" if overlap.n_policies >= 2 and not overlap.says_nothing else "mail"
    if response_model == "bc":
        cfg.rounds = 0
    return response_model


def _stamp_checkpoint(checkpoint_dir: str | Path | None, ident: dict[str, Any]) -> Path | None:
    """Create the checkpoint directory and stamp it with what identifies the fit (``fit.json``:
    data hash, seed, options); refuse one stamped by a different fit.

    Separate because resuming must never mix members of two different fits: the stamp is the
    guard, checked before any member is loaded from it.

    Returns:
        The checkpoint directory, or None without one.
    """
    if checkpoint_dir is None:
        return None
    ckpt = Path(checkpoint_dir)
    ckpt.mkdir(parents=True, exist_ok=True)
    stamp = ckpt / "fit.json"
    if stamp.is_file() and json.loads(stamp.read_text()) != json.loads(json.dumps(ident, default=str)):
        raise InputError("checkpoint belongs to a different fit (data, seed or options differ)", str(ckpt))
    stamp.write_text(json.dumps(ident, default=str))
    return ckpt


def _plan_members(
    members: int, seed: int, n_episodes: int, ckpt: Path | None, n_scenarios: int
) -> tuple[dict[int, Member], list[tuple[Any, ...]]]:
    """Load the members a checkpoint already holds and draw each remaining member's bootstrap of
    the episodes and its seed.

    Separate (and done before any fitting) because the draws are made here, in member order, so
    that where a member is fitted (serially, a process pool, Ray) does not change what it is
    fitted on.

    Returns:
        (finished members by index, tasks ``(m, episode indices or None, member seed)``).
    """
    fitted: dict[int, Member] = {}
    tasks: list[tuple[Any, ...]] = []
    for m in range(members):
        mdir = ckpt / f"member_{m}" if ckpt is not None else None
        if mdir is not None and (mdir / "DONE").is_file():
            fitted[m] = Member.load(mdir, n_scenarios)
            continue
        rng = np.random.default_rng([seed, m])
        # bootstrap over episodes (drawn here, in order, so that where a member is fitted does
        # not change what it is fitted on); a repeated episode becomes a distinct one
        pick = None if members == 1 else rng.choice(n_episodes, size=n_episodes, replace=True)
        tasks.append((m, pick, seed * 1000 + m))
    return fitted, tasks


def _fit_members(
    fitted: dict[int, Member],
    tasks: list[tuple[Any, ...]],
    ckpt: Path | None,
    *,
    workers: int | None,
    ray_address: str | None,
    progress: bool,
    data: tuple[Any, ...],
    options: tuple[Any, ...],
    on_idle: Callable[[], None] | None = None,
    beside: Executor | None = None,
) -> None:
    """Fit the planned members (serially, on a process pool, on Ray, or shared between this process
    and an already running pool, ``beside``: `edgetwin.twin.parallel.run_tasks`), adding each to
    ``fitted`` and saving it to the checkpoint as it finishes.

    `_fit_member_task` receives ``(*data, inner progress, *options)``: the inner progress bars
    are shown only when fitting serially, as several processes' bars would interleave.
    ``on_idle``: called (in this process, maybe more than once) when a local pool's worker has no
    member left to start, so that the caller can use that core while the last members run (five
    members on two workers leave one core idle for the last member's whole fit); with ``beside``,
    once, when this process has no member left to start.
    """

    done = [0]

    def finished(i: int, member: Member) -> None:
        m = tasks[i][0]
        fitted[m] = member
        done[0] += 1
        # a pool worker has nothing left to start: the caller may use the core (``on_idle``)
        if on_idle is not None and together is None and parallel and ray_address is None and len(tasks) - done[0] < n_workers:
            on_idle()
        mdir = ckpt / f"member_{m}" if ckpt is not None else None
        if mdir is not None:
            if mdir.exists():
                shutil.rmtree(mdir)
            member.save(mdir)

    together = beside if ray_address is None and len(tasks) > 1 else None
    if together is not None:
        workers = 1  # this process and ``beside``'s worker, no pool of its own
    n_workers = 1 if ray_address is None and len(tasks) <= 1 else resolve_workers(workers, len(tasks))
    parallel = ray_address is not None or n_workers > 1 or together is not None
    mapped = None
    if ray_address is None and n_workers > 1:  # the pool's workers map the log (`MappedLog`)
        fd, path = tempfile.mkstemp(prefix="edgetwin-log-", suffix=".arrow")
        os.close(fd)
        mapped = MappedLog.write(data[0], path)
        data = (mapped, *data[1:])
    try:
        run_tasks(
            _fit_member_task,
            tasks,
            workers=n_workers,
            ray_address=ray_address,
            progress=progress,
            desc="twin members",
            shared=(*data, progress and not parallel, *options),
            on_result=finished,
            beside=together,
            on_idle=on_idle if together is not None else None,
        )
    finally:
        if mapped is not None:
            os.unlink(mapped.path)


def _choose_invariances(
    df: pd.DataFrame, layout: Layout, cfg: MailConfig, seed: int
) -> dict[int, InvarianceChoice]:
    """Per scenario, the causal response model's invariance weight, cross-fitted on the whole log
    (`edgetwin.imitation.causal.choose_invariance`; folds of whole agent-days), which every member
    then fits at.

    Separate, and before the members, because choosing it inside each member (on its bootstrap
    draw) cross-fitted 12 fits per member and scenario for one final fit: 89 % of a causal fit's
    time on the scale benchmark's multi-policy log (docs/benchmarks/scale/README.md, "The fit"). The
    members' spread is the bootstrap's, not the spread of a hyper-parameter's choice.
    """
    steps = build_steps(df, layout)
    policy, agent_day = steps.policy_ids(), steps.agent_days()
    out = {}
    for s in range(len(layout.scenarios)):
        rows = client_rows(steps, layout, s)
        out[s] = choose_invariance(
            steps.x_client[rows], steps.y_client[rows], None if policy is None else policy[rows], agent_day[rows],
            tuple(cfg.net_arch), seed=seed + s,
        )  # fmt: skip
    return out


def _members_then_tail(
    fitted: dict[int, Member], tasks: list[Any], ckpt: Path | None, tail_args: tuple[Any, ...], **fit_kw: Any
) -> tuple[tuple[SupportIndex, np.ndarray, np.ndarray], dict[str, str]]:
    """`_fit_members`, then the support index and the episodes' hashes (``tail_args`` = df, layout, spec, seed).

    The tail needs the log only: on a local pool it runs in a helper thread while the last members
    run (a core idle); fitted serially it runs here after them, as a second thread's BLAS calls
    beside sklearn's OpenMP distance loops make OpenBLAS warn "Detect OpenMP Loop" once per call;
    beside a running pool (``beside``) it runs here once this process has no member left to start."""
    df, layout, spec, seed = tail_args

    Tail = tuple[tuple[SupportIndex, np.ndarray, np.ndarray], dict[str, str]]

    def tail() -> Tail:
        return _support_and_action_bounds(df, layout, spec, seed), episode_hashes(df, episode_hash_columns(layout))

    after = ThreadPoolExecutor(max_workers=1)
    started: list[Future[Tail]] = []

    def idle() -> None:
        if started:
            return
        if fit_kw.get("beside") is None:
            started.append(after.submit(tail))
            return
        # beside a running pool this process's own thread is the idle one: the tail runs in it, not
        # in a new thread (whose OpenMP would not inherit this thread's limit: OpenBLAS's warning)
        done: Future[Tail] = Future()
        done.set_result(tail())
        started.append(done)

    try:
        _fit_members(fitted, tasks, ckpt, **fit_kw, on_idle=idle)
        return started[0].result() if started else tail()
    finally:
        after.shutdown(wait=True)


def _support_and_action_bounds(
    df: pd.DataFrame, layout: Layout, spec: TwinSpec, seed: int
) -> tuple[SupportIndex, np.ndarray, np.ndarray]:
    """The twin's support index over the logged (profile, state, action) rows, standardised, and
    the action bounds (the spec's, else the logged range where the spec leaves them infinite).

    Separate because these say where the twin may be trusted: the gate's out-of-support share
    and the env's action clipping read them, not the fitted members.
    """
    steps_all = build_steps(df, layout)
    z_support = np.concatenate(
        [steps_all.x_engine, steps_all.za], axis=1
    )  # [profile, state, action] standardised
    support = SupportIndex.fit(z_support, seed=seed, groups=steps_all.episode, n_action=steps_all.za.shape[1])
    a_low, a_high = spec.bounds("action")
    logged = df[layout.action].to_numpy(np.float64)
    a_low = np.where(np.isfinite(a_low), a_low, logged.min(axis=0))
    a_high = np.where(np.isfinite(a_high), a_high, logged.max(axis=0))
    return support, a_low, a_high
