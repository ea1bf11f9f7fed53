"""``edgetwin train``, ``evaluate``, ``whatif`` and ``promote``: policies trained, scored, compared and gated."""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from edgetwin.cli.common import (
    JsonOpt,
    RegistryOpt,
    SeedOpt,
    TaskRayOpt,
    TaskWorkersOpt,
    app,
    emit_json,
    out,
    out_dir_arg,
)
from edgetwin.cli.trust import TwinTrustOpt, check_twin_trust
from edgetwin.contract.errors import GateRefused, InputError


def cluster_kpi_columns() -> Any:
    """Which emulated-cluster columns are which KPI (defined beside the cluster)."""
    from edgetwin.emulator.cluster import cluster_kpi_columns as kpis

    return kpis()


def _load_kpis(path: Path | None, spec: Any) -> Any:
    from edgetwin.policies.evaluate import KpiColumns

    if path is None:
        cols = {f.name for f in spec.features}
        default = cluster_kpi_columns()
        # the cluster's mapping fits any log with the cluster's columns; otherwise only the return
        return default if all(c in cols for c in default.__dict__.values() if isinstance(c, str)) else KpiColumns()
    if not path.is_file():
        raise InputError("KPI mapping file not found", str(path))
    try:
        import tomllib

        d = json.loads(path.read_text()) if path.suffix == ".json" else tomllib.loads(path.read_text())
    except ValueError as e:
        raise InputError(f"cannot parse the KPI mapping ({e})", str(path)) from None
    return KpiColumns.from_dict(d)


@app.command("train")
def policy_train(
    twin_dir: Annotated[Path, typer.Argument(help="Twin directory (from `edgetwin fit`).")],
    out_dir: Annotated[Path, typer.Option("--out", help="Directory of the exported policy.")],
    algo: Annotated[str, typer.Option(help="ppo | a2c | sac | td3 | maskable_ppo | recurrent_ppo | dual_critic_ppo.")] = "ppo",
    steps: Annotated[int, typer.Option(min=1, help="Environment steps (transitions over all agents).")] = 50_000,
    agents: Annotated[int | None, typer.Option(min=1, help="Agents (= sub-envs) per twin episode.")] = None,
    episode_steps: Annotated[int | None, typer.Option(min=1, help="Ticks per twin episode.")] = None,
    action_norm_lambda: Annotated[
        float, typer.Option(min=0.0, help="λ of seed 004's action-norm regulariser (eq. 8; 0.4 there). Off by default: the "
                                 "support-aware penalty regularises instead.")
    ] = 0.0,
    support_penalty: Annotated[
        float, typer.Option(min=0.0, help="Reward minus this x the ensemble's disagreement (MOPO-style; 0: off).")
    ] = 1.0,
    select: Annotated[
        bool, typer.Option("--select/--no-select", help="Score the trained policy beside simple candidates in the "
                           "twin and export the best by the lower bound of its 90 % interval of the return.")
    ] = True,
    view: Annotated[Path | None, typer.Option(help="Scheduling view (TOML/JSON): also score the heuristics.")] = None,
    log: Annotated[Path | None, typer.Option("--log", help="Held-out log: score by replaying it (calibrated intervals).")] = None,
    validate_on: Annotated[Path | None, typer.Option(help="Held-out twin for early stopping.")] = None,
    patience: Annotated[int, typer.Option(min=1, help="Evaluations without a new best before stopping.")] = 3,
    eval_every: Annotated[int, typer.Option(min=1, help="Steps between validations.")] = 5_000,
    checkpoint_every: Annotated[int, typer.Option(min=0, help="Steps between checkpoints (0: none).")] = 10_000,
    resume: Annotated[bool, typer.Option("--resume/--no-resume", help="Continue from OUT/checkpoints if this run (same twin, seed, settings) wrote them; another run's are removed.")] = True,
    tensorboard: Annotated[Path | None, typer.Option(help="TensorBoard log directory.")] = None,
    trust: TwinTrustOpt = None,
    seed: SeedOpt = 0,
    as_json: JsonOpt = False,
) -> None:
    """Train a platform policy inside a twin and export it (checkpoints, resume, early stopping).

    Then score it in the twin beside simple candidates (constant actions on a grid of the action box,
    the logging clone, heuristics with --view), each with its 90 % interval of the return, and export
    the best by its lower bound, saying so when that is not the trained network (--no-select: skip).
    """
    if not action_norm_lambda >= 0:  # NaN passes click's range check
        raise InputError(f"expected a number >= 0, got {action_norm_lambda}", "--action-norm-lambda")
    out_dir_arg(out_dir)  # before the heavy imports
    import torch

    from edgetwin.policies.train import train_policy
    from edgetwin.twin.twin import Twin, load_log

    torch.set_num_threads(1)
    if not support_penalty >= 0:
        raise InputError(f"expected a number >= 0, got {support_penalty}", "--support-penalty")
    check_twin_trust(twin_dir, trust)
    if validate_on is not None:
        check_twin_trust(validate_on, trust)
    twin = Twin.load(twin_dir)
    held = load_log(log, None)[0] if log is not None else None
    validation = Twin.load(validate_on) if validate_on is not None else None
    opts: dict[str, Any] = {k: v for k, v in {"n_agents": agents, "steps": episode_steps}.items() if v is not None}
    opts["disagreement_penalty"] = support_penalty
    res = train_policy(
        twin, algo, steps=steps, seed=seed, out=out_dir, tensorboard_dir=tensorboard,  # type: ignore[arg-type]
        checkpoint_every=checkpoint_every, resume=resume, action_norm_lambda=action_norm_lambda,
        early_stop_on=validation, eval_every=eval_every, patience=patience, twin_opts=opts, progress=not as_json,
    )
    summary: dict[str, Any] = {"policy": str(res.path), "algorithm": algo, "steps": res.steps,
                               "stopped_early": res.stopped_early, "best_validation_return": res.best_validation_return}
    sel = None
    if select:
        from edgetwin.policies.candidates import select_export
        from edgetwin.policies.gate import load_view

        sel = select_export(twin, res.path, view=load_view(view) if view is not None else None, log=held, seed=seed,
                            steps=episode_steps, n_agents=agents, progress=not as_json, twin_dir=twin_dir, log_path=log)  # fmt: skip
        summary["selection"] = sel.to_dict()
    if as_json:
        emit_json(summary)
        return
    out.print(f"trained {algo} for {res.steps} steps" + (", stopped early" if res.stopped_early else ""))
    if sel is not None:
        label = sel.scores[0].interval_label() if sel.scores else "interval"
        out.print(f"return in the twin (mean [{label}], out of support), best lower bound first:")
        for sc in sel.scores:
            out.print(f"  {sc.name:32s} {sc.mean:.4g} [{sc.low:.4g}, {sc.high:.4g}]  {100 * sc.out_of_support:.0f} %")
        out.print(sel.note)
    out.print(f"policy written to {res.path}")


@app.command("evaluate")
def policy_evaluate(
    policy: Annotated[str, typer.Argument(help="Exported policy directory, or 'random'.")],
    twin_dir: Annotated[Path | None, typer.Argument(help="Twin directory (with --on twin).")] = None,
    on: Annotated[str, typer.Option("--on", help="cluster (the emulated system) | twin.")] = "cluster",
    episodes: Annotated[int, typer.Option(min=1, help="Episodes (independent seeds) for the confidence intervals.")] = 5,
    agents: Annotated[int, typer.Option(min=1, help="Service groups per episode.")] = 100,
    episode_steps: Annotated[int, typer.Option(min=1, help="Ticks per episode.")] = 96,
    drift: Annotated[str, typer.Option(help="Cluster drift: 0d | 1d | 1w | 1m.")] = "0d",
    kpis: Annotated[Path | None, typer.Option(help="KPI column mapping (JSON/TOML of KpiColumns fields).")] = None,
    plot: Annotated[Path | None, typer.Option(help="Write a PNG of the KPIs here.")] = None,
    workers: TaskWorkersOpt = 1,
    ray: TaskRayOpt = None,
    trust: TwinTrustOpt = None,
    seed: SeedOpt = 0,
    as_json: JsonOpt = False,
) -> None:
    """Score a policy on the emulated cluster or a twin.

    On the cluster, KPIs with 95 % Student-t intervals over episodes. In a twin, every ensemble
    member plays the same episodes and each KPI has its 90 % interval over members x episodes, with
    the share of agent-steps outside the logs' support (calibrated intervals against held-out logs:
    `edgetwin whatif --log`). Every episode is built from the seed alone (its world, and its own
    seed for a policy that samples), so --workers and --ray do not change the numbers."""
    import torch

    from edgetwin.policies.evaluate import ArraySystem, evaluate_episodes, evaluate_on_twin, plot_results

    torch.set_num_threads(1)
    if on not in ("cluster", "twin"):
        raise InputError(f"--on must be 'cluster' or 'twin', got {on!r}", "--on")
    twin: Any = None
    if on == "twin":
        if twin_dir is None:
            raise InputError("--on twin needs the TWIN argument", "TWIN")
        check_twin_trust(twin_dir, trust)
        twin = _loaded_twin(str(twin_dir))  # the episodes run in this process use the same one
        spec = twin.spec
    else:
        from edgetwin.emulator.cluster import ClusterConfig, EdgeCluster

        cluster = EdgeCluster(ClusterConfig(n_agents=agents, steps=episode_steps, drift=drift))
        spec = ArraySystem(cluster, cluster.spec).spec
    name = "random"
    if policy != "random":
        pol = _loaded_policy(policy)
        name = Path(policy).name
        if pol.spec.observation_columns != spec.observation_columns or pol.spec.action_columns != spec.action_columns:
            raise InputError(f"the policy acts on {pol.spec.name!r}, whose columns differ from the {on}'s", policy)
        if on == "twin":
            from edgetwin.policies.export import check_policy_spec

            check_policy_spec(pol, spec, policy)
    if ray is not None:
        from edgetwin.twin.parallel import check_ray

        check_ray(ray)
    make_system = _EvalSystem(on, None if twin_dir is None else str(twin_dir), agents, episode_steps, drift)
    if twin is not None:
        res = evaluate_on_twin(
            _EvalPolicy(policy), make_system, len(twin.members), episodes=episodes, seed=seed,
            kpis=_load_kpis(kpis, spec), name=name, workers=workers, ray_address=ray, progress=not as_json,
        )  # fmt: skip
    else:
        res = evaluate_episodes(
            _EvalPolicy(policy), make_system, episodes=episodes, seed=seed, kpis=_load_kpis(kpis, spec), name=name,
            system_name=on, workers=workers, ray_address=ray, progress=not as_json,
        )  # fmt: skip
    if plot is not None:
        plot_results([res], plot, title=f"{name} on {on}")
    if as_json:
        emit_json(res.to_dict())
    else:
        where = f"all {len(twin.members)} members of the twin" if twin is not None else on
        out.print(f"{name} on {where}: {episodes} episodes, seed {seed}")
        out.print(res.table())
        if res.out_of_support is not None:
            from edgetwin.policies.gate import MAX_OUT_OF_SUPPORT

            beyond = res.out_of_support > MAX_OUT_OF_SUPPORT
            out.print(f"{100 * res.out_of_support:.1f} % of the agent-steps lie outside the logs' support"
                      + (f", above the promotion gate's {100 * MAX_OUT_OF_SUPPORT:.0f} %: the twin cannot vouch for "
                         "these numbers" if beyond else ""))
        if plot is not None:
            out.print(f"plot written to {plot}")


class _EvalPolicy:
    """`evaluate`'s policy for one episode, ``(seed, spec) -> policy``: ``random`` seeded per episode,
    else the exported policy, loaded once per process (a heuristic, which may sample, once per
    episode). Picklable, for the episodes' worker processes."""

    def __init__(self, ref: str) -> None:
        self.ref = ref

    def __call__(self, seed: int, spec: Any) -> Any:
        if self.ref == "random":
            from edgetwin.policies.heuristics import UniformRandom

            return UniformRandom(spec, seed=seed)
        from edgetwin.policies.export import load_policy

        pol = _loaded_policy(self.ref)
        return load_policy(self.ref) if pol.kind == "heuristic" else pol


class _EvalSystem:
    """`evaluate`'s system, fresh for each episode (the twin itself loaded once per process)."""

    def __init__(self, on: str, twin_dir: str | None, agents: int, steps: int, drift: str) -> None:
        self.on, self.twin_dir, self.agents, self.steps, self.drift = on, twin_dir, agents, steps, drift

    def __call__(self, member: int | None = None) -> Any:
        """A fresh system; in a twin, ``member`` simulates that ensemble member and counts its
        agent-steps outside the logs' support."""
        from edgetwin.policies.evaluate import ArraySystem, TwinSystem

        if self.on == "twin":
            assert self.twin_dir is not None
            return TwinSystem(_loaded_twin(self.twin_dir), n_agents=self.agents, steps=self.steps, member=member,
                              track_support=member is not None)  # fmt: skip
        from edgetwin.emulator.cluster import ClusterConfig, EdgeCluster

        cluster = EdgeCluster(ClusterConfig(n_agents=self.agents, steps=self.steps, drift=self.drift))
        return ArraySystem(cluster, cluster.spec)


@functools.lru_cache(maxsize=4)
def _loaded_twin(path: str) -> Any:
    from edgetwin.twin.twin import Twin

    return Twin.load(path)


@functools.lru_cache(maxsize=4)
def _loaded_policy(path: str) -> Any:
    from edgetwin.policies.export import load_policy

    return load_policy(path)



def _whatif_inputs(
    twin_dir: Path, scenario: list[Path] | None, kpis: Path | None, log: Path | None, spec: Path | None
) -> tuple[Any, list[Any], list[Any], Any]:
    """Twin, scenarios, KPI definitions (defaults + files) and the replay log of what-if commands."""
    import torch

    from edgetwin.contract.spec import REWARD_COLUMN
    from edgetwin.twin.twin import Twin, load_log
    from edgetwin.twin.whatif import default_kpis, kpis_from_dicts, load_kpis, load_scenarios, merge_kpis

    torch.set_num_threads(1)
    twin = Twin.load(twin_dir)
    scenarios: list[Any] = []
    extra: list[Any] = []
    for path in scenario or []:
        scenarios += load_scenarios(path)
        doc = path.read_text()
        if "[[kpi]]" in doc or '"kpi"' in doc:  # a scenario file may carry its KPIs
            import tomllib

            raw = json.loads(doc) if path.suffix.lower() == ".json" else tomllib.loads(doc)
            extra += kpis_from_dicts(raw.get("kpi", []), str(path))
    names = [s.name for s in scenarios]
    if len(set(names)) != len(names):
        raise InputError(f"scenario names must be unique across files, got {names}", "--scenario")
    if kpis is not None:
        extra += load_kpis(kpis)
    lay = twin.layout
    base = default_kpis(twin.spec, lay.outputs + ([] if lay.predict_reward else [REWARD_COLUMN]))
    table = None
    if log is not None:
        table, _ = load_log(log, spec if spec is not None else twin.spec)
    return twin, scenarios, merge_kpis(base, extra), table


def _members(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"expected comma-separated member indices, got {text!r}", "--members") from None


ScenarioOpt = Annotated[
    list[Path] | None,
    typer.Option("--scenario", help="Scenario file (TOML/JSON with perturbation or scenario tables); repeatable."),
]
KpisOpt = Annotated[Path | None, typer.Option("--kpis", help="KPI definitions (TOML/JSON kpi tables) added to the defaults.")]
ExogenousOpt = Annotated[
    list[str] | None, typer.Option("--exogenous", help="Replay: a state column taken from the log at every tick; repeatable.")
]
MembersOpt = Annotated[str | None, typer.Option("--members", help="Ensemble members to run, e.g. 0,1,2 (default: all).")]


@dataclass(frozen=True)
class WhatifConfig:
    """``edgetwin whatif --config FILE``: the what-if's rarely set knobs (a TOML file of these keys;
    a missing key keeps its default), so that the command keeps to the options every run sets.

    Attributes:
        deterministic: use the twin's mean responses (no response noise).
        oos_tolerance: flag a number when more than this share of its agent-steps lies outside the
            logs' support (a share in [0, 1]).
        view: a SchedulingView file (TOML/JSON) for ``heuristic:NAME`` policies.
    """

    deterministic: bool = False
    oos_tolerance: float = 0.05
    view: str | None = None

    def __post_init__(self) -> None:
        if not 0.0 <= self.oos_tolerance <= 1.0:  # also catches NaN
            raise ValueError(f"oos_tolerance: expected a share between 0 and 1, got {self.oos_tolerance}")

    @classmethod
    def load(cls, path: Path | None) -> WhatifConfig:
        from edgetwin.loop.fleet import load_toml_config

        return cls() if path is None else load_toml_config(path, cls, "--config")  # type: ignore[no-any-return]


@app.command("whatif")
def whatif_cmd(
    twin_dir: Annotated[Path, typer.Argument(help="A twin directory (from `edgetwin fit`).")],
    policy: Annotated[
        list[str],
        typer.Option(
            "--policy",
            help="Policy directory, or logging (the twin's clone of the logging policy), logged (the log's "
            "actions, with --log), random, heuristic:NAME (with --view); repeatable.",
        ),
    ],
    out_dir: Annotated[Path, typer.Option("--out", help="Directory for whatif.json/.md, PNGs and report.html.")],
    baseline: Annotated[str | None, typer.Option("--baseline", help="Policy the others are compared with.")] = None,
    scenario: ScenarioOpt = None,
    kpis: KpisOpt = None,
    log: Annotated[
        Path | None, typer.Option("--log", help="Counterfactual replay of this log's episodes instead of generated worlds.")
    ] = None,
    spec: Annotated[Path | None, typer.Option(help="Spec of --log (default: beside it, else the twin's).")] = None,
    exogenous: ExogenousOpt = None,
    episodes: Annotated[int, typer.Option(min=1, help="Episodes per seed (replay: the last E episodes of the log).")] = 2,
    seeds: Annotated[int, typer.Option(min=1, help="Independent seeds of worlds and response noise.")] = 2,
    members: MembersOpt = None,
    steps: Annotated[
        int | None, typer.Option(min=1, help="Steps per episode (default: the twin's horizon / the log's).")
    ] = None,
    agents: Annotated[int | None, typer.Option("--agents", min=1, help="Agents per generated world.")] = None,
    config: Annotated[
        Path | None,
        typer.Option("--config", help="TOML of the rarely set knobs (WhatifConfig: deterministic, oos_tolerance, "
                     "view); a missing key keeps its default."),
    ] = None,
    workers: TaskWorkersOpt = 1,
    ray: TaskRayOpt = None,
    trust: TwinTrustOpt = None,
    seed: SeedOpt = 0,
    as_json: JsonOpt = False,
) -> None:
    """Run policies through a twin under what-if scenarios; write a KPI report with intervals and plots."""
    from edgetwin.policies.gate import PolicySpec, resolve_policy
    from edgetwin.twin.report import write_report
    from edgetwin.twin.whatif import run_whatif

    cfg = WhatifConfig.load(config)
    oos_tolerance, view = cfg.oos_tolerance, cfg.view
    out_dir_arg(out_dir)
    if ray is not None:
        from edgetwin.twin.parallel import check_ray

        check_ray(ray)
    check_twin_trust(twin_dir, trust)
    twin, scenarios, kpi_defs, table = _whatif_inputs(twin_dir, scenario, kpis, log, spec)
    refs = list(policy)
    if baseline is not None and baseline not in refs:
        refs.insert(0, baseline)
    pols: list[PolicySpec] = []
    for ref in refs:
        p = resolve_policy(ref, twin, view=view)
        if p.name in [q.name for q in pols]:
            raise InputError(f"policy {ref!r} is given twice (or two policies share the name {p.name!r})", "--policy")
        pols.append(p)
    base_name = None if baseline is None else pols[refs.index(baseline)].name
    result = run_whatif(
        twin, pols, scenarios, baseline=base_name, kpis=kpi_defs, episodes=episodes, seeds=seeds, seed=seed,
        members=_members(members), steps=steps, n_agents=agents, stochastic=not cfg.deterministic, log=table,
        exogenous=exogenous or (), oos_tolerance=oos_tolerance, progress=not as_json, workers=workers, ray_address=ray,
    )  # fmt: skip
    files = write_report(result, out_dir, title=f"What-if report: {', '.join(result.policies)}")
    if as_json:
        doc = result.to_dict()
        doc["files"] = {k: str(v) for k, v in files.items()}
        emit_json(doc)
        return
    flagged = sum(
        result.summary(p, s.name, k.name)["flagged"] for p in result.policies for s in result.scenarios for k in result.kpis
    )
    out.print(
        f"{len(result.policies)} policies x {len(result.scenarios)} scenarios x {result.settings['replicates']} worlds x "
        f"{len(result.settings['members'])} members; {flagged} numbers flagged as outside the logs' support"
    )
    out.print(f"report: {files['html']}\ntables: {files['markdown']}")


@dataclass(frozen=True)
class GateConfig:
    """``edgetwin promote --gate-config FILE``: how the gate replays (a TOML file of these keys; a
    missing key keeps its default). The production command keeps the flags every promotion sets;
    these are the ones an operator sets once for a fleet and keeps in a file.

    Attributes:
        against: what POLICY is compared with: ``auto`` (the scope's current version, else
            global's, else the logging policy), a registry version, a policy directory or a
            built-in (``logging``, ``random``).
        scenario: what-if scenario files (TOML/JSON perturbation or scenario tables) replayed too.
        default_margin: margin (a fraction) of the default guards (every KPI with a direction).
        spec: spec of ``--log`` (default: beside it, else the twin's).
        exogenous: state columns taken from the log at every tick of the replay.
        seeds: response-noise seeds per replayed episode.
        members: ensemble members to run, e.g. ``"0,1,2"`` (default: all).
        refuse_out_of_support: refuse (instead of abstaining) when a guarded number rests on states
            outside the logs' support.
        name: the policy's name in the registry (default: the directory's).
        bucket: the NATS bucket prefix of the registry.
        interval_method: the intervals' construction (`edgetwin.twin.intervals.METHODS`): ``replayed``
            (the default: the twin's effect-size error calibrated on the replayed days, times how far the
            two policies move the actions), ``hybrid`` (the construction before it: narrower), ``relative``
            or ``normalized``.
    """

    against: str = "auto"
    scenario: tuple[str, ...] = ()
    default_margin: float = 0.05
    spec: str | None = None
    exogenous: tuple[str, ...] = ()
    seeds: int = 1
    members: str | None = None
    refuse_out_of_support: bool = False
    name: str | None = None
    bucket: str = "edgetwin"
    interval_method: str | None = None

    def __post_init__(self) -> None:
        from edgetwin.twin.intervals import METHODS

        if self.interval_method is not None and self.interval_method not in METHODS:
            raise ValueError(f"interval_method: expected one of {', '.join(METHODS)}, got {self.interval_method!r}")
        if not self.default_margin >= 0:  # also catches NaN
            raise ValueError(f"default_margin: expected a fraction >= 0, got {self.default_margin}")
        if self.seeds < 1:
            raise ValueError(f"seeds: expected >= 1, got {self.seeds}")

    @classmethod
    def load(cls, path: Path | None) -> GateConfig:
        from edgetwin.loop.fleet import load_toml_config

        return cls() if path is None else load_toml_config(path, cls, "--gate-config")  # type: ignore[no-any-return]


@dataclass
class _Promotion:
    """What `_promote_with_canary` and `_promote_with_evidence` act on: the registry, the signed
    candidate and where the gate stands."""

    reg: Any
    policy: str
    twin: Any
    table: Any
    signer: Any
    store: Any
    scope: str
    metadata: dict[str, Any]
    seed: int
    out_dir: Path
    as_json: bool


@app.command("promote")
def promote_cmd(
    policy: Annotated[str, typer.Argument(help="Exported policy directory (or a version already in the registry).")],
    registry: RegistryOpt,
    twin_dir: Annotated[Path, typer.Option("--twin", help="Twin directory to replay in.")],
    key: Annotated[
        Path, typer.Option("--key", envvar="EDGETWIN_SIGNING_KEY", help="Ed25519 private key (PEM) that signs the artifact.")
    ],
    log: Annotated[
        Path | None, typer.Option("--log", help="Recent log of the real system: the traffic replayed in the twin "
                                  "(not with --evidence).")
    ] = None,
    scope: Annotated[str, typer.Option("--scope", help="global, cluster/NAME or site/NAME.")] = "global",
    max_regression: Annotated[
        list[str] | None,
        typer.Option(
            "--max-regression",
            help="Guarded KPI and its margin: KPI=0.05, KPI=5% or KPI=0.05:ABS; repeatable "
            "(default: every KPI with a direction, at the gate config's default_margin).",
        ),
    ] = None,
    kpis: KpisOpt = None,
    episodes: Annotated[int, typer.Option(min=1, help="Recorded episodes replayed (the last ones of the log).")] = 4,
    steps: Annotated[int | None, typer.Option(min=1, help="Replay at most this many steps per episode.")] = None,
    trust: Annotated[
        list[Path] | None,
        typer.Option("--trust", help="More trusted public keys for fetching versions (default: --key's). Given, the "
                     "--twin must be signed by one of them or --key's key (its SIGNATURE.json), else exit 2."),
    ] = None,
    max_out_of_support: Annotated[
        float, typer.Option(help="Abstain when more than this share of a number's agent-steps lie outside the logs' support.")
    ] = 0.25,
    level: Annotated[
        str, typer.Option("--level", help="Confidence a verdict needs (90% or 0.9): a KPI whose calibration episodes "
                          "support less abstains (exit 3) saying what would reach it; ask for less only knowingly.")
    ] = "90%",
    force: Annotated[bool, typer.Option("--force", help="Promote even if the gate refuses or abstains (recorded in the metadata).")] = False,
    gate_config: Annotated[
        Path | None, typer.Option("--gate-config", help="TOML of the gate's replay knobs (against, scenario, default_margin, "
                                  "spec, exogenous, seeds, members, refuse_out_of_support, name, bucket).")
    ] = None,
    evidence: Annotated[
        Path | None, typer.Option("--evidence", help="A canary's verdict (`edgetwin canary verdict --out`): promote on it "
                                  "instead of the twin's replay; it must name this policy, this twin and the registry's versions.")
    ] = None,
    canary_config: Annotated[
        Path | None, typer.Option("--canary-config", help="Emulated cluster only: when the gate abstains, plan -> canary -> "
                                  "Twin.update -> verdict with the knobs of this TOML (rounds, max_share, max_loss, hours, "
                                  "current, agents, train_log; an empty file: defaults).")
    ] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Directory for the gate's report.")] = Path("promotion-report"),
    seed: SeedOpt = 0,
    as_json: JsonOpt = False,
) -> None:
    """Replay POLICY and the current version in the twin on recent traffic and what-ifs; promote
    (publish signed + move the scope's pointer with compare-and-swap) only if no guarded KPI regresses,
    judged by the twin's calibrated 90 % intervals (calibrated on the log's own actions).

    Exit 1 with the KPIs that regressed (margin, interval) when the gate refuses; exit 3 with the reason
    when it abstains (an interval straddles a margin, or the candidate's rollout lies outside the logs'
    support); nothing is published then. --json says which KPIs drove the verdict.

    With --evidence, the canary's verdict decides instead: promote publishes the policy with the
    verdict, its inputs' digests and the twin's version in the signed metadata; exit 1 on a refuse,
    3 on an undecided verdict; exit 2 when the evidence is about another policy, twin or fleet.
    """
    from edgetwin.edge.registry import check_scope, metadata_from_policy_dir, open_registry
    from edgetwin.edge.signing import Signer, TrustStore
    from edgetwin.loop.fleet import EmulatedCanaryConfig
    from edgetwin.policies.gate import GateAbstained, parse_guards, parse_level, promote

    check_scope(scope)
    gc = GateConfig.load(gate_config)
    if not 0.0 <= max_out_of_support <= 1.0:
        raise InputError(f"expected a share in [0, 1], got {max_out_of_support}", "--max-out-of-support")
    guards = parse_guards(max_regression or [])
    asked = parse_level(level)
    if evidence is not None and canary_config is not None:
        raise InputError("--evidence is a canary's verdict already; --canary-config runs one: give one of them", "--evidence")
    canary = EmulatedCanaryConfig.load(canary_config) if canary_config is not None else None
    if canary is not None:
        budget = canary.budget()  # exit 2 on a bad budget, before anything long
        if not Path(policy).is_dir():
            raise InputError("--canary-config needs an exported policy directory (the edge serves it)", str(policy))
    if evidence is None and log is None:
        raise InputError("the gate replays recent traffic: give --log (or --evidence, a canary's verdict)", "--log")
    out_dir_arg(out_dir)
    signer = Signer.from_pem(key)
    store = TrustStore.from_paths(trust) if trust else TrustStore()
    store.add(signer.public_key)
    if trust:
        check_twin_trust(twin_dir, store)
    base_md = metadata_from_policy_dir(policy) if Path(policy).is_dir() else {}
    if gc.name:
        base_md["name"] = gc.name
    if evidence is not None:
        with open_registry(registry, bucket=gc.bucket) as reg:
            _promote_with_evidence(_Promotion(reg, policy, None, None, signer, store, scope, base_md, seed, out_dir,
                                              as_json), evidence, twin_dir)  # fmt: skip
        return
    twin, scenarios, kpi_defs, table = _whatif_inputs(twin_dir, [Path(p) for p in gc.scenario] or None, kpis, log,
                                                      Path(gc.spec) if gc.spec else None)  # fmt: skip
    with open_registry(registry, bucket=gc.bucket) as reg:
        try:
            result = promote(
                policy, reg, twin=twin, log=table, signer=signer, trust=store, scope=scope, against=gc.against,
                scenarios=scenarios, guards=guards or None, default_margin=gc.default_margin, kpis=kpi_defs,
                episodes=episodes, seeds=gc.seeds, seed=seed, members=_members(gc.members), steps=steps,
                exogenous=list(gc.exogenous), refuse_out_of_support=gc.refuse_out_of_support,
                max_out_of_support=max_out_of_support, force=force, out_dir=out_dir, name=gc.name, metadata=base_md,
                progress=not as_json, level=asked, method=gc.interval_method,
            )  # fmt: skip
        except GateAbstained as e:
            if canary is None or not hasattr(e, "result"):
                if as_json and hasattr(e, "result"):
                    emit_json(e.result.to_dict())
                raise
            _promote_with_canary(_Promotion(reg, policy, twin, table, signer, store, scope, base_md, seed, out_dir,
                                            as_json), e.result, canary, budget)  # fmt: skip
            return
        except GateRefused as e:
            if as_json and hasattr(e, "result"):
                emit_json(e.result.to_dict())
            raise
    if as_json:
        emit_json(result.to_dict())
        return
    verdict = "passed" if result.decision.passed else f"{result.decision.verdict.upper()}, overridden with --force"
    out.print(
        f"gate {verdict}: {result.decision.reason()}\npromoted {result.version} to {scope} "
        f"(was {result.previous}); report: {result.report['html']}"
    )


def _promote_with_evidence(p: _Promotion, evidence_path: Path, twin_dir: Path) -> None:
    """``promote --evidence``: check the canary's verdict against the policy, the twin and the
    registry (`edgetwin.loop.evidence.check_evidence`, exit 2 on a mismatch), then on *promote*
    publish the policy with the evidence in its signed metadata and move the scope's pointer
    (compare-and-swap on the version the canary compared against); exit 1 on *refuse*, 3 on
    *undecided* (nothing is published)."""
    import tempfile

    from edgetwin.contract.errors import GateAbstained
    from edgetwin.loop.evidence import Evidence, check_evidence

    ev = Evidence.load(evidence_path)
    with tempfile.TemporaryDirectory(prefix="edgetwin-evidence-") as tmp:
        policy_dir = Path(p.policy)
        if not policy_dir.is_dir():  # a version already in the registry: the canary's own copy
            policy_dir = p.reg.fetch(p.policy, Path(tmp) / "policy", p.store)
        check_evidence(ev, policy_dir, twin_dir, p.reg, scope=p.scope, trust=p.store, workdir=tmp)
        doc: dict[str, Any] = {"evidence": ev.to_dict(), "promoted": False}
        if ev.verdict == "promote":
            md = {**p.metadata, "parent_version": ev.candidate_version, "evidence": ev.metadata()}
            if not md.get("name"):
                md["name"] = re.sub(r"[^A-Za-z0-9_.-]+", "-", policy_dir.name).strip("-.") or "policy"
            md.pop("version", None)
            version = p.reg.publish(policy_dir, md, p.signer)
            p.reg.set_current(p.scope, version, expected=ev.current_version if ev.current_version is not None
                              else p.reg.current(p.scope), reason=f"canary verdict: {ev.reason}"[:500],
                              kind="promote")  # fmt: skip
            doc.update(promoted=True, version=version)
    if p.as_json:
        emit_json(doc)
    elif ev.verdict == "promote":
        out.print(f"promoted {doc['version']} to {p.scope} on the canary's evidence: {ev.reason}")
    if ev.verdict == "refuse":
        raise GateRefused(f"refused on the canary's evidence: {ev.reason}")
    if ev.verdict == "undecided":
        raise GateAbstained(f"the canary's verdict is undecided: {ev.reason}")


def _promote_with_canary(p: _Promotion, promotion: Any, canary: Any, budget: Any) -> None:
    """The gate abstained and --canary-config was given: `edgetwin.loop.rounds.canary_loop` on the
    emulated cluster (today's fleet: a day generated from --seed, run by the config's ``current``,
    which is also the policy the twin replays as the current one), then publish + move the pointer
    on *promote*, exit 1 on *refuse*, exit 3 on *abstain*."""
    from edgetwin.contract.errors import GateAbstained
    from edgetwin.emulator.cluster import ClusterConfig
    from edgetwin.emulator.logs import generate_logs, make_policy
    from edgetwin.loop.rounds import canary_loop, promote_after_canary
    from edgetwin.policies.export import load_policy
    from edgetwin.policies.gate import resolve_policy
    from edgetwin.twin.twin import load_log
    from edgetwin.twin.whatif import fixed_policy

    twin, table = p.twin, p.table
    last = table[table["episode"] == table["episode"].iloc[-1]]
    n = canary.agents or int(last["agent"].nunique())
    cluster = ClusterConfig(n_agents=n, steps=int(last["t"].nunique()))
    fleet_seed = p.seed + 30_000
    spec = twin.spec
    current_dir = Path(canary.current).is_dir()
    cur: Any = load_policy(canary.current) if current_dir else make_policy(canary.current, spec, seed=p.seed,
                                                                               where="--canary-config current")  # fmt: skip
    # the fleet's day is run by the current policy (not always random): the plan and the verdict
    # replay the same policy the fleet runs
    fleet_log, em_spec = generate_logs(cluster, 1, cur, seed=fleet_seed)
    if list(em_spec.observation_columns) != list(spec.observation_columns):
        raise InputError("the emulated cluster's columns are not the twin's: --canary-config runs on the emulated "
                         "cluster only", "--canary-config")  # fmt: skip
    if current_dir:
        cur = canary.current
        baseline = resolve_policy(canary.current, twin, name="current")
    else:
        baseline = fixed_policy("current", make_policy(canary.current, spec, seed=p.seed))
    old = [load_log(path, spec)[0] for path in canary.train_log] or None
    result = canary_loop(
        twin, fleet_log, p.policy, cur, cluster, candidate_spec=resolve_policy(p.policy, twin, name=Path(p.policy).name),
        baseline_spec=baseline, budget=budget, max_rounds=canary.rounds, seed=p.seed, fleet_seed=fleet_seed,
        old_logs=old, decision=promotion.decision, log=(lambda _m: None) if p.as_json else out.print,
    )  # fmt: skip
    doc: dict[str, Any] = {"gate": promotion.to_dict(), "canary": result.to_dict()}
    (Path(p.out_dir) / "canary.json").write_text(json.dumps(doc, indent=1, default=float))
    if result.verdict == "promote":
        version = promote_after_canary(p.reg, p.policy, result, p.signer, scope=p.scope, expected=promotion.previous,
                                       metadata=p.metadata)  # fmt: skip
        doc["promoted"], doc["version"] = True, version
        if p.as_json:
            emit_json(doc)
        else:
            out.print(f"promoted {version} to {p.scope} on the canary's evidence: {result.reason}")
        return
    if p.as_json:
        emit_json(doc)
    if result.verdict == "refuse":
        raise GateRefused(f"refused on the canary's evidence: {result.reason}")
    raise GateAbstained(f"the canary could not tell either ({len(result.rounds)} round(s)): {result.reason}")
