"""The ``edgetwin`` command.

Every command has ``--help`` and ``--seed`` where it samples; ``--json`` where a script reads the
result. Exit codes: 0 ok, 1 failed (a gate refused, a check did not pass, an unexpected error),
2 bad input (a file, row, column, flag or value we cannot use; a tampered, unsealed or untrusted
artifact), 3 the gate abstained. `exit_code_of` is the one place that decides the code and
`describe_error` the one line that is printed, literally (no console markup); set
``EDGETWIN_DEBUG=1`` to also see the traceback.

Commands live here, grouped by the part of the pipeline they drive; the work itself is in the
subpackages, so each command is only argument handling and printing.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import sys
import traceback
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from edgetwin.contract.errors import GateRefused, InputError

app = typer.Typer(
    name="edgetwin",
    help="Learn a digital twin of an edge-cloud scheduling system from its logs, train policies "
    "offline in it, replay what-ifs and promote to the edge.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
logs_app = typer.Typer(help="Generate, validate and inspect logs.", no_args_is_help=True)
app.add_typer(logs_app, name="logs")

# markup off: file names and user text are printed literally ('x[bold]y.csv' stays as it is)
console = Console(stderr=True, markup=False, highlight=False, soft_wrap=True)
out = Console(markup=False, soft_wrap=True)

SeedOpt = Annotated[int, typer.Option("--seed", help="Random seed; the same seed gives the same result.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout.")]
TaskWorkersOpt = Annotated[
    int,
    typer.Option("--workers", min=0, help="Processes that run the independent episodes (1, the default: serially in "
                 "this process, as a worker's start-up costs ~10 s of imports; 0: one per core). The result does not "
                 "depend on it."),
]
TaskRayOpt = Annotated[
    str | None,
    typer.Option("--ray", help="Run the episodes on this Ray cluster (e.g. auto, ray://host:10001; local starts one "
                 "here); needs pip install -e \".[ray]\". The result does not depend on it."),
]


def emit_json(obj: Any) -> None:
    """Print a JSON document on stdout (numbers that numpy made are converted)."""
    print(json.dumps(obj, indent=2, default=_json_default))


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def out_dir_arg(path: Path, flag: str = "--out") -> Path:
    """Check (and create) an output directory before any long work: exit 2 with one line if it is
    an existing file or cannot be created or written, instead of a raw exception at the end."""
    if path.exists() and not path.is_dir():
        raise InputError("exists and is not a directory", f"{flag} {path}")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"cannot create the directory ({e.strerror or e})", f"{flag} {path}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise InputError("the directory is not writable", f"{flag} {path}")
    return path


def out_file_arg(path: Path, flag: str = "--out") -> Path:
    """Check an output file's place before any long work (exit 2 if it is a directory or unwritable)."""
    if path.is_dir():
        raise InputError("is a directory; expected a file name", f"{flag} {path}")
    out_dir_arg(path.parent if str(path.parent) else Path("."), flag)
    if path.exists() and not os.access(path, os.W_OK):
        raise InputError("the file exists and is not writable", f"{flag} {path}")
    return path


# ------------------------------------------------------------------------------------- logs
@logs_app.command("validate")
def logs_validate(
    log: Annotated[Path, typer.Argument(help="Log table (.parquet or .csv).")],
    spec: Annotated[Path | None, typer.Option(help="Twin spec (TOML); default LOG.spec.toml beside the log.")] = None,
    quarantine: Annotated[
        Path | None, typer.Option(help="Where unusable rows go; default LOG.quarantine.csv beside the log.")
    ] = None,
    min_usable: Annotated[
        float, typer.Option("--min-usable", help="The log is unusable below this share of usable rows (0..1).")
    ] = 0.5,
    as_json: JsonOpt = False,
) -> None:
    """Report every problem of a log at once; exit 0 if it is usable, 2 if it is not.

    Unusable rows go to the quarantine file with their row number and reason; see docs/log-format.md.
    """
    from edgetwin.contract.validate import validate_log

    if not 0.0 <= min_usable <= 1.0:
        raise InputError(f"must be between 0 and 1, got {min_usable}", "--min-usable")
    report = validate_log(log, spec=spec, quarantine_path=quarantine, min_usable_fraction=min_usable)
    if as_json:
        emit_json(report.to_dict())
    else:
        out.print(report.summary(markup=False))
    raise typer.Exit(0 if report.usable else 2)


# ------------------------------------------------------------------------------------- registry
registry_app = typer.Typer(help="Signed policy registry: keys, publish, list, show.", no_args_is_help=True)
app.add_typer(registry_app, name="registry")

RegistryOpt = Annotated[
    str,
    typer.Option(
        "--registry",
        envvar="EDGETWIN_REGISTRY",
        help="Registry: a directory (created on publish) or a nats://host:port URL (JetStream).",
    ),
]
BucketOpt = Annotated[str, typer.Option("--bucket", help="NATS bucket prefix of the registry.")]


@registry_app.command("keygen")
def registry_keygen(
    out_dir: Annotated[Path, typer.Option("--out", help="Directory for NAME.key.pem (0600) and NAME.pub.pem.")],
    name: Annotated[str, typer.Option(help="File name stem of the key pair.")] = "publisher",
    force: Annotated[bool, typer.Option("--force", help="Overwrite existing key files.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Generate an Ed25519 signing key pair (from the OS's CSPRNG: keys are deliberately not seedable)."""
    from edgetwin.edge.signing import Signer, save_private_key, save_public_key

    out_dir.mkdir(parents=True, exist_ok=True)
    signer = Signer.generate()
    pub = out_dir / f"{name}.pub.pem"
    if pub.exists() and not force:
        raise InputError("a key file already exists here; pass --force to overwrite it", where=str(pub))
    key = save_private_key(signer.private_key, out_dir / f"{name}.key.pem", overwrite=force)
    save_public_key(signer.public_key, pub, overwrite=force)
    result = {"key_id": signer.key_id, "private_key": str(key), "public_key": str(pub)}
    if as_json:
        emit_json(result)
    else:
        out.print(f"key {signer.key_id}: private {key} (keep it secret), public {pub} (give it to edge agents)")


@registry_app.command("publish")
def registry_publish(
    policy_dir: Annotated[Path, typer.Argument(help="Exported policy directory.")],
    registry: RegistryOpt,
    key: Annotated[
        Path, typer.Option("--key", envvar="EDGETWIN_SIGNING_KEY", help="Ed25519 private key (PEM) that signs.")
    ],
    name: Annotated[str | None, typer.Option(help="Policy name; default: metadata's, else the directory name.")] = None,
    version: Annotated[str | None, typer.Option(help="Version name; default: the next v<N>.")] = None,
    metadata: Annotated[
        Path | None, typer.Option(help="JSON file of metadata (spec_hash, algorithm, metrics, ...).")
    ] = None,
    parent: Annotated[str | None, typer.Option(help="Parent version.")] = None,
    metric: Annotated[list[str] | None, typer.Option(help="A metric at promotion, NAME=VALUE; repeatable.")] = None,
    bucket: BucketOpt = "edgetwin",
    as_json: JsonOpt = False,
) -> None:
    """Pack, sign and publish a policy directory as a new immutable version.

    Metadata comes from the policy's own policy.json (algorithm, spec hash, training data hash,
    metrics), then --metadata, then the flags, each overriding the one before.
    """
    from edgetwin.edge.registry import describe_version, metadata_from_policy_dir, open_registry
    from edgetwin.edge.signing import Signer

    md: dict[str, Any] = metadata_from_policy_dir(policy_dir)  # an exported policy's policy.json, if any
    if metadata is not None:
        try:
            extra = json.loads(metadata.read_text())
        except (OSError, ValueError) as e:
            raise InputError(f"expected a JSON object of metadata ({e})", where=str(metadata)) from None
        if not isinstance(extra, dict):
            raise InputError("expected a JSON object of metadata", where=str(metadata))
        md |= extra
    md["name"] = name or md.get("name") or policy_dir.name
    if version is not None:
        md["version"] = version
    if parent is not None:
        md["parent_version"] = parent
    metrics = dict(md.get("metrics") or {})
    for item in metric or []:
        k, sep, v = item.partition("=")
        try:
            metrics[k] = float(v)
        except ValueError:
            sep = ""
        if not sep or not k:
            raise InputError(f"expected NAME=VALUE with a number, got {item!r}", where="--metric")
    md["metrics"] = metrics
    signer = Signer.from_pem(key)
    with open_registry(registry, bucket=bucket) as reg:
        published = reg.publish(policy_dir, md, signer)
        result = describe_version(reg, published)
    if as_json:
        emit_json(result)
    else:
        out.print(f"published {published} ({result['name']}, sha256 {result['sha256'][:12]}, key {signer.key_id})")


@registry_app.command("list")
def registry_list(registry: RegistryOpt, bucket: BucketOpt = "edgetwin", as_json: JsonOpt = False) -> None:
    """Published versions (oldest first) and the current version of every scope."""
    from rich.table import Table

    from edgetwin.edge.registry import describe_registry, open_registry

    with open_registry(registry, create=False, bucket=bucket) as reg:
        summary = describe_registry(reg)
    if as_json:
        emit_json(summary)
        return
    table = Table("version", "name", "algorithm", "created", "key", "sha256", "current in", title=summary["registry"])
    for v in summary["versions"]:
        table.add_row(
            v["version"], v["name"], v["algorithm"] or "", v["created"] or "", v["key_id"] or "UNSIGNED",
            v["sha256"][:12], ", ".join(v["current_in"]),
        )  # fmt: skip
    out.print(table)
    for scope, p in summary["pointers"].items():
        out.print(f"{scope}: {p['current']} (rollback to {p['rollback_to']}, revision {p['revision']})")


@registry_app.command("show")
def registry_show(
    registry: RegistryOpt,
    version: Annotated[str | None, typer.Argument(help="Version to show.")] = None,
    scope: Annotated[
        str | None, typer.Option(help="Show a scope's pointer history instead: global, cluster/C or site/S.")
    ] = None,
    trust: Annotated[
        list[Path] | None, typer.Option(help="Public key file or directory: also verify the artifact (exit 2 if refused).")
    ] = None,
    bucket: BucketOpt = "edgetwin",
    as_json: JsonOpt = False,
) -> None:
    """A version's signed metadata (optionally verified against trusted keys), or a scope's history."""
    import tempfile

    from edgetwin.edge.registry import check_scope, describe_version, open_registry, rollback_target
    from edgetwin.edge.signing import TrustStore

    if (version is None) == (scope is None):
        raise InputError("give either a VERSION or --scope", where="registry show")
    store = TrustStore.from_paths(trust) if trust else None
    with open_registry(registry, create=False, bucket=bucket) as reg:
        if scope is not None:
            history = reg.history(check_scope(scope))
            result: dict[str, Any] = {
                "scope": scope,
                "current": history[-1].version if history else None,
                "rollback_to": rollback_target(history),
                "history": [h.to_dict() for h in history],
            }
        else:
            assert version is not None  # exactly one of version / scope, checked above
            result = describe_version(reg, version)
            if store is not None:
                with tempfile.TemporaryDirectory() as tmp:
                    reg.fetch(version, Path(tmp) / "policy", store)  # raises ArtifactRejected: exit 2
                result["verified"] = True
    if as_json:
        emit_json(result)
    elif scope is not None:
        out.print(f"{scope}: current {result['current']}, rollback to {result['rollback_to']}")
        for h in result["history"]:
            out.print(f"  r{h['revision']} {h['at']} {h['kind']:8} {h['previous']} -> {h['version']}  {h['reason']}")
    else:
        out.print_json(data=result)
        if store is not None:
            out.print(f"verified: signed by trusted key {result['key_id']}, checksum and metadata intact")


# ------------------------------------------------------------------------------------- logs generate
@logs_app.command("generate")
def logs_generate(
    out_path: Annotated[Path, typer.Option("--out", help="Log to write (.parquet or .csv); LOG.spec.toml goes beside it.")],
    agents: Annotated[int, typer.Option("--agents", min=1, help="Service groups per episode.")] = 200,
    episodes: Annotated[int, typer.Option("--episodes", min=1, help="Episodes (days) to log.")] = 3,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Ticks per episode (96 x 15 min = a day).")] = 96,
    policy: Annotated[str, typer.Option("--policy", help="Logging policy: random | heuristic.")] = "random",
    drift: Annotated[str, typer.Option("--drift", help="Simulated time since day 0: 0d | 1d | 1w | 1m.")] = "0d",
    trace: Annotated[
        Path | None, typer.Option("--trace", help="Real trace for task sizes and arrival curve (format auto-detected).")
    ] = None,
    carbon: Annotated[
        Path | None, typer.Option("--carbon", help="Carbon-intensity file or folder (<zone>_*.parquet); default built-in.")
    ] = None,
    plot: Annotated[bool, typer.Option("--plot/--no-plot", help="Also write LOG.overview.png (KPIs by hour).")] = True,
    seed: SeedOpt = 0,
    as_json: JsonOpt = False,
) -> None:
    """Run the emulated edge-cloud cluster under a logging policy and write its log and spec."""
    from edgetwin.contract.logs import write_table
    from edgetwin.contract.spec import spec_path_for
    from edgetwin.emulator.cluster import ClusterConfig
    from edgetwin.emulator.logs import generate_logs, plot_overview
    from edgetwin.emulator.population import DRIFT_DAYS

    if policy not in ("random", "heuristic"):
        raise InputError(f"expected 'random' or 'heuristic', got {policy!r}", "--policy")
    if drift not in DRIFT_DAYS:
        raise InputError(f"expected one of {', '.join(DRIFT_DAYS)}, got {drift!r}", "--drift")
    for flag, value in (("--agents", agents), ("--episodes", episodes), ("--steps", steps)):
        if value < 1:
            raise InputError(f"expected a positive integer, got {value}", flag)
    if trace is not None and not trace.exists():
        raise InputError("trace file not found", f"--trace {trace}")
    if carbon is not None and not carbon.exists():
        raise InputError("carbon intensity file not found", f"--carbon {carbon}")
    out_file_arg(out_path)
    config = ClusterConfig(n_agents=agents, steps=steps, drift=drift, trace=trace, carbon=carbon)
    log, spec = generate_logs(config, episodes=episodes, policy=policy, seed=seed, progress=not as_json)
    write_table(log, out_path)
    spec_path = spec.save(spec_path_for(out_path))
    png = plot_overview(log, out_path.with_name(out_path.name.split(".")[0] + ".overview.png")) if plot else None
    summary = {
        "log": str(out_path),
        "spec": str(spec_path),
        "plot": None if png is None else str(png),
        "rows": len(log),
        "episodes": episodes,
        "agents": agents,
        "steps": steps,
        "policy": policy,
        "drift": drift,
        "trace": None if trace is None else str(trace),
        "seed": seed,
        "scenarios": {str(k): int(v) for k, v in log.groupby("scenario")["agent"].nunique().items()},
        "mean_offload_ratio": float(log["response.offload_ratio"].mean()),
        "mean_slo_violation": float(log["kpi.slo_violation"].mean()),
        "mean_reward": float(log["reward"].mean()),
    }
    if as_json:
        emit_json(summary)
    else:
        where = f"spec: {spec_path}" + (f"\nplot: {png}" if png else "")
        out.print(
            f"wrote {summary['rows']:,} rows ({episodes} episodes x {steps} steps x {agents} service groups) "
            f"to {out_path}\n{where}\nmean offload ratio {summary['mean_offload_ratio']:.3f}, "
            f"SLO violations {summary['mean_slo_violation']:.3f}, reward {summary['mean_reward']:.3f}"
        )


# ------------------------------------------------------------------------------------- demo
@app.command("demo")
def demo(
    out_dir: Annotated[Path, typer.Option("--out", help="Directory for everything the demo writes.")] = Path(
        "edgetwin-demo"
    ),
    agents: Annotated[int, typer.Option(min=10, help="Service groups in the emulated cluster.")] = 100,
    episodes: Annotated[int, typer.Option(min=2, help="Episodes (days) of logs to learn from.")] = 3,
    steps: Annotated[int, typer.Option(min=8, help="Steps per episode.")] = 96,
    seed: SeedOpt = 0,
    as_json: JsonOpt = False,
) -> None:
    """The main job on the embedded defaults: emulated cluster -> logs -> twin -> policy -> what-if report."""
    from edgetwin.demo import run_demo

    out_dir_arg(out_dir)
    result = run_demo(out_dir, seed=seed, agents=agents, episodes=episodes, steps=steps, log=console.print)
    if as_json:
        emit_json(result.to_dict())
        return
    for name, path in result.artifacts.items():
        out.print(f"{name:>16}: {path}")
    n = result.numbers
    if "cluster_offload_trained" in n:
        out.print(
            f"on the emulated cluster (episodes the twin never saw): offload ratio {n['cluster_offload_trained']:.3f} "
            f"with the twin-trained policy vs {n['cluster_offload_random']:.3f} with the random logging policy "
            f"({100 * n['offload_improvement_over_random']:+.1f} %)"
        )
    if n.get("promoted_version"):
        out.print(f"promoted {n['promoted_version']}; the edge runtime served {n['served_decisions']:,} decisions")
    elif "gate_refused" in n:
        out.print(f"the promotion gate refused the policy: {n['gate_refused']}")
    if "whatif_report" in result.artifacts:
        out.print(f"what-if report: {result.artifacts['whatif_report']}")
    out.print(f"summary written to {result.artifacts['summary']}")


# ------------------------------------------------------------------------------------- twin
@app.command("fit")
def twin_fit(
    log: Annotated[Path, typer.Argument(help="Log table (.parquet or .csv).")],
    out_dir: Annotated[Path, typer.Option("--out", help="Directory to write the twin to.")],
    spec: Annotated[Path | None, typer.Option(help="Twin spec (TOML); default LOG.spec.toml beside the log.")] = None,
    members: Annotated[int, typer.Option(min=1, help="Ensemble members (bootstrap resamples of episodes).")] = 5,
    rounds: Annotated[int, typer.Option(min=0, help="MAIL-MMSG adversarial rounds per scenario (0: BC only).")] = 10,
    bc_epochs: Annotated[int, typer.Option(min=0, help="Behaviour-cloning epochs (engine and client pre-training).")] = 20,
    response_model: Annotated[str, typer.Option(help="mail | bc | supervised.")] = "mail",
    population_model: Annotated[str, typer.Option(help="gan-smmsg | gmm | gan | wgan | empirical.")] = "gan-smmsg",
    population_steps: Annotated[int | None, typer.Option(min=0, help="Generator updates of the population model.")] = None,
    site_model: Annotated[
        bool,
        typer.Option(
            "--site-model",
            help="Learn how site-level state columns (one value per site and tick) follow the whole site's "
            "actions (`SiteStateModel`); off by default, see docs/benchmarks.md.",
        ),
    ] = False,
    site_columns: Annotated[
        str | None,
        typer.Option(
            "--site-columns",
            help="Comma-separated site-level state columns for the site model (implies --site-model; "
            "default: all of them).",
        ),
    ] = None,
    federated: Annotated[
        bool,
        typer.Option(
            "--federated",
            help="Split the log by its site column and fit across the sites, one agent per site in this "
            "process over the in-process bus: only statistics and parameters travel (docs/federation.md).",
        ),
    ] = False,
    fed_rounds: Annotated[
        int | None, typer.Option(min=1, help="--federated: FedAvg rounds per member (default: 240 of 5 minibatches; "
                            "with dp_gaussian 8 of 2 epochs, DP_SCHEDULE).")
    ] = None,
    strategy: Annotated[str, typer.Option(help="--federated: fedavg | fedavgm | dp_gaussian.")] = "fedavg",
    compression: Annotated[str, typer.Option(help="--federated: dense | int8 | topk+int8.")] = "dense",
    secure: Annotated[bool, typer.Option("--secure", help="--federated: secure aggregation.")] = False,
    light: Annotated[
        bool,
        typer.Option("--light", help="--federated: the light family (behaviour-cloned responses, mixture population) "
                     "instead of the default MAIL + GAN-SMMSG."),
    ] = False,
    workers: Annotated[
        int,
        typer.Option(min=0, help="Processes that fit ensemble members in parallel (0: one per core; 1: serially). "
                     "The twin does not depend on it."),
    ] = 0,
    ray: Annotated[
        str | None,
        typer.Option("--ray", help="Fit the members on this Ray cluster (e.g. auto, ray://host:10001; local starts "
                     "one here); needs pip install -e \".[ray]\". The twin does not depend on it."),
    ] = None,
    seed: SeedOpt = 0,
    as_json: JsonOpt = False,
) -> None:
    """Learn a twin from a log. Resumable: finished members are checkpointed in OUT/checkpoint."""
    out_dir_arg(out_dir)  # before the heavy imports: a wrong --out is reported at once
    if federated:
        fam: dict[str, Any] = {"response_model": "bc", "population_model": "gmm"} if light else {
            "response_model": response_model, "population_model": population_model, "adv_rounds": rounds}
        if population_steps is not None:
            fam["gan_rounds"] = max(1, population_steps // 50)
        _fit_federated(log, out_dir, spec, members, fed_rounds, strategy, compression, secure, seed, as_json, fam)
        return
    import torch

    from edgetwin.generative import MODELS
    from edgetwin.twin.twin import RESPONSE_MODELS, Twin

    if response_model not in RESPONSE_MODELS:
        raise InputError(f"expected one of {', '.join(RESPONSE_MODELS)}, got {response_model!r}", "--response-model")
    if population_model not in (*MODELS, "empirical"):
        raise InputError(
            f"expected one of {', '.join((*MODELS, 'empirical'))}, got {population_model!r}", "--population-model"
        )
    torch.set_num_threads(1)
    pop_hyper = {} if population_steps is None else {"steps": population_steps}
    twin = Twin.fit(
        log,
        spec,
        seed=seed,
        members=members,
        progress=not as_json,
        checkpoint_dir=out_dir / "checkpoint",
        response_model=response_model,
        population_model=population_model,
        population_hyper=pop_hyper,
        rounds=rounds,
        bc_epochs=bc_epochs,
        site_model=[c.strip() for c in site_columns.split(",") if c.strip()] if site_columns else site_model,
        workers=workers,
        ray_address=ray,
    )
    twin.save(out_dir)
    summary = {"twin": str(out_dir), **{k: twin.meta[k] for k in ("members", "data_sha256", "n_rows", "n_episodes", "fit_seconds")}}
    if as_json:
        emit_json(summary)
    else:
        out.print(f"twin written to {out_dir} ({twin.meta['members']} members, {twin.meta['n_rows']} rows, "
                  f"{twin.meta['fit_seconds']:.0f} s)")


def _rounds(rounds: int | None) -> dict[str, Any]:
    """``--fed-rounds`` as `FitOptions` keywords: none when not given (its default schedule)."""
    return {} if rounds is None else {"rounds": rounds}


#: the behaviour-cloning phase's rounds shown by `edgetwin fit --federated` (one line in this many)
WEIGHT_ROUNDS_SHOWN_EVERY = 20


def _fit_federated(log: Path, out_dir: Path, spec: Path | None, members: int, rounds: int | None, strategy: str,
                   compression: str, secure: bool, seed: int, as_json: bool, family: dict[str, Any]) -> None:
    """`edgetwin fit --federated`: one site agent per value of the log's site column, in-process.

    ``family``: `FitOptions` fields choosing the models (default MAIL + GAN-SMMSG, as `Twin.fit`)."""
    import torch

    from edgetwin.federation.twin.fit import FitOptions
    from edgetwin.federation.twin.runner import fit_federated, split_by_site
    from edgetwin.twin.twin import load_log

    torch.set_num_threads(1)
    df, sp = load_log(log, spec)
    parts = split_by_site(df)

    def progress(rec: dict[str, Any]) -> None:
        # the weights phase runs hundreds of short rounds (`FitOptions`): show one in 20
        if not as_json and (rec["phase"] != "weights" or rec["step"] % WEIGHT_ROUNDS_SHOWN_EVERY == 0 or rec["missing"]):
            out.print(f"round {rec['seq']:>3} {rec['phase']:<11} member {rec['member']} step {rec['step']:>2}: "
                      f"{len(rec['sites'])}/{len(parts)} sites ({rec['reason']}, {rec['seconds']:.1f} s)"
                      + (f", missing {rec['missing']}" if rec["missing"] else ""))

    options = FitOptions.for_strategy(strategy, members=members, seed=seed, **family, **_rounds(rounds))
    twin, rep = fit_federated(parts, sp, options=options,
                              strategy=strategy, compression=compression, secure=secure, on_round=progress)
    twin.save(out_dir)
    summary = {"twin": str(out_dir), "sites": rep.sites, "rounds": len(rep.rounds), "bytes_up": rep.bytes_up,
               "bytes_down": rep.bytes_down, "seconds": rep.seconds, "strategy": rep.strategy,
               "compression": rep.compression, "secure": rep.secure, "secure_bytes": rep.secure_bytes,
               "privacy": rep.privacy, "n_rows": twin.meta["n_rows"], "bytes_by_phase": rep.bytes_by_phase,
               "response_model": twin.meta["response_model"], "population_model": twin.meta["population_model"]}
    if as_json:
        emit_json(summary)
    else:
        for site, b in sorted(rep.bytes_up.items()):
            out.print(f"  {site}: sent {b / 1e3:,.1f} kB in {rep.messages_up.get(site, 0)} messages")
        if rep.privacy:
            nts = ", ".join(f"{k} {v:,.0f}x" for k, v in rep.privacy["noise_to_signal"].items())
            out.print(f"Gaussian DP: epsilon {rep.privacy['epsilon']:,.1f} at delta {rep.privacy['delta']:g}; "
                      f"each round's noise is this many times the largest mean update: {nts}")
        out.print(f"twin written to {out_dir} ({len(rep.sites)} sites, {len(rep.rounds)} rounds, "
                  f"{rep.bytes_down / 1e3:,.1f} kB of tasks, {rep.seconds:.0f} s; no row left its site)")


@app.command("fidelity")
def twin_fidelity(
    twin_dir: Annotated[Path, typer.Argument(help="A twin directory (from `edgetwin fit`).")],
    log: Annotated[Path, typer.Argument(help="Held-out log of the real system under its logging policy.")],
    spec: Annotated[Path | None, typer.Option(help="Spec of the log; default LOG.spec.toml beside it.")] = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="Directory for the PNGs and fidelity.json.")] = None,
    episodes: Annotated[int, typer.Option(min=1, help="Twin episodes to roll out.")] = 4,
    horizon: Annotated[int, typer.Option(min=1, help="Longest replay horizon for the compounding error.")] = 100,
    seed: SeedOpt = 0,
    as_json: JsonOpt = False,
) -> None:
    """Score a twin against a held-out log: KL of outputs, time-of-day profile, compounding error, and
    how often the logged KPIs fall inside the twin's calibrated 90 % interval (coverage)."""
    import torch

    from edgetwin.twin.fidelity import fidelity_report
    from edgetwin.twin.twin import Twin, load_log

    if out_dir is not None:
        out_dir_arg(out_dir)
    torch.set_num_threads(1)
    twin = Twin.load(twin_dir)
    df, _ = load_log(log, spec)
    report = fidelity_report(twin, df, seed=seed, episodes=episodes, max_horizon=horizon, out_dir=out_dir)
    if out_dir is not None:
        (out_dir / "fidelity.json").write_text(json.dumps(report, indent=1, default=_json_default))
    if as_json:
        emit_json(report)
        return
    out.print(f"mean KL(real || twin) over outputs: {report['mean_kl']:.3f} nats")
    for c, v in report["kl"].items():
        out.print(f"  {c:32s} {v:.3f}")
    out.print(f"compounding-error growth exponent: {report['growth_exponent']:.2f}")
    sup = report["support"]
    out.print(f"out of the logs' support: {100 * sup.get('out_of_support', float('nan')):.1f} % of steps")
    cov = report.get("coverage") or {}
    if cov:
        out.print(
            f"coverage of the 90 % interval on held-out episodes: {100 * cov['coverage']:.0f} % of "
            f"{cov['episodes']} episode(s) x {len(cov['per_kpi'])} KPI(s) (plain bootstrap: "
            f"{100 * cov['coverage_plain']:.0f} %; calibrated on the other half of the episodes)"
        )
    if out_dir is not None:
        out.print(f"report and figures in {out_dir}")


# ------------------------------------------------------------------------------------- population
population_app = typer.Typer(
    help="Population models of who shows up (GAN-SMMSG and the GMM / GAN / WGAN-GP baselines).",
    no_args_is_help=True,
)
app.add_typer(population_app, name="population")


def _population_table(log: Path, spec: Path | None, model_spec: Any = None) -> tuple[Any, Any]:
    """Read a log (or a profile table) and its spec; return (one row per agent, spec)."""
    from edgetwin.contract.logs import read_table, resolve_spec
    from edgetwin.generative import agent_profiles

    df = read_table(log)
    sp = model_spec if model_spec is not None and spec is None else resolve_spec(log, spec, list(df.columns))
    if not sp.names("profile"):
        raise InputError("no profile.* columns: give a spec (--spec) or a table with profile.* columns", str(log))
    try:
        return agent_profiles(df, sp), sp
    except InputError as e:
        raise InputError(str(e).removeprefix("log: "), str(log)) from None


@population_app.command("fit")
def population_fit(
    log: Annotated[Path, typer.Argument(help="Log (one row per episode, t, agent) or profile table (.parquet/.csv).")],
    out_dir: Annotated[Path, typer.Option("--out", help="Directory to write the model to.")],
    model: Annotated[str, typer.Option("--model", help="gan-smmsg | gmm | gan | wgan.")] = "gan-smmsg",
    spec: Annotated[Path | None, typer.Option(help="Twin spec (TOML); default LOG.spec.toml beside the log.")] = None,
    steps: Annotated[int | None, typer.Option("--steps", help="Generator updates (GAN models; default 3000).")] = None,
    seed: SeedOpt = 0,
    as_json: JsonOpt = False,
) -> None:
    """Fit a population model on the agents' profile.* features, per scenario."""
    import torch

    from edgetwin.generative import MODELS, fit_population

    if model not in MODELS:
        raise InputError(f"expected one of {', '.join(MODELS)}, got {model!r}", "--model")
    if steps is not None and (model == "gmm" or steps < 0):
        raise InputError("takes a non-negative number of generator updates, for the GAN models only", "--steps")
    out_dir_arg(out_dir)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    profiles, sp = _population_table(log, spec)
    hyper = {} if steps is None else {"steps": steps}
    pm = fit_population(profiles, sp, model, seed=seed, progress=not as_json, **hyper)
    pm.save(out_dir)
    summary = {
        "model": pm.name,
        "out": str(out_dir),
        "agents": len(profiles),
        "scenarios": dict(zip(pm.scenarios, pm.proportions.round(4).tolist(), strict=True)),
        "columns": sp.names("profile"),
        "fit_seconds": round(pm.meta["fit_seconds"], 2),
        "seed": seed,
    }
    if as_json:
        emit_json(summary)
    else:
        out.print(
            f"{pm.name} fitted on {len(profiles):,} agents ({len(pm.scenarios)} scenarios, "
            f"{len(summary['columns'])} profile features) in {summary['fit_seconds']:.1f} s; written to {out_dir}"
        )


@population_app.command("report")
def population_report_cmd(
    model_dir: Annotated[Path, typer.Argument(help="A population model directory (from `population fit`).")],
    log: Annotated[Path, typer.Argument(help="Real log or profile table to compare with (ideally held out).")],
    out_dir: Annotated[
        Path | None, typer.Option("--out", help="Directory for report.json and marginals.png (default MODEL_DIR/report).")
    ] = None,
    spec: Annotated[Path | None, typer.Option(help="Spec of the log; default the model's spec.")] = None,
    n: Annotated[int, typer.Option("--n", min=10, help="Agents to generate.")] = 20_000,
    seed: SeedOpt = 0,
    as_json: JsonOpt = False,
) -> None:
    """Score a population model against real agents: KL per feature, MMD, C2ST AUC, correlations."""
    from edgetwin.generative import load_population
    from edgetwin.generative.report import population_report

    pm = load_population(model_dir)
    real, _ = _population_table(log, spec, model_spec=pm.spec)
    missing = [c for c in pm.spec.names("profile") if c not in real]
    if missing:
        raise InputError(f"profile column(s) {missing} of the model are missing", str(log))
    out_dir = out_dir if out_dir is not None else model_dir / "report"
    rep = population_report(pm, real, n=n, seed=seed, out=out_dir)
    if as_json:
        emit_json(rep)
        return
    out.print(f"{pm.name} vs {len(real):,} real agents ({n:,} generated), KL(real || generated) in nats:")
    for c, v in rep["kl"].items():
        out.print(f"  {c:32s} {v:.4f}")
    if rep["kl_label"] is not None:
        out.print(f"  {'scenario':32s} {rep['kl_label']:.4f}")
    out.print(f"MMD^2 {rep['mmd']:.4f}   C2ST AUC {rep['c2st_auc']:.3f} (0.5 = indistinguishable)   "
              f"correlation distance {rep['corr_dist']:.3f}")
    out.print(f"report and marginals plot in {out_dir}")


# ------------------------------------------------------------------------------------- policies
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
    resume: Annotated[bool, typer.Option("--resume/--no-resume", help="Continue from OUT/checkpoints.")] = True,
    tensorboard: Annotated[Path | None, typer.Option(help="TensorBoard log directory.")] = None,
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
                            steps=episode_steps, n_agents=agents, progress=not as_json)  # fmt: skip
        summary["selection"] = sel.to_dict()
    if as_json:
        emit_json(summary)
        return
    out.print(f"trained {algo} for {res.steps} steps" + (", stopped early" if res.stopped_early else ""))
    if sel is not None:
        out.print("return in the twin (mean [90 % interval], out of support), best lower bound first:")
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


# ------------------------------------------------------------------------------------- serve (edge runtime)
@app.command("serve")
def serve(
    site: Annotated[str, typer.Option("--site", help="This edge site's name: serves scope site/<S> (then cluster, global).")],
    registry: RegistryOpt,
    trust: Annotated[
        list[Path], typer.Option("--trust", help="Trusted publisher public key (PEM) or a directory of them; repeatable.")
    ],
    bus: Annotated[
        str, typer.Option("--bus", help="memory | memory://NAME | nats://host:port[,nats://...]: where decisions are served.")
    ] = "memory",
    shield: Annotated[
        Path | None, typer.Option("--shield", help="Safety shield applied to every action: a JSON ShieldConfig file.")
    ] = None,
    cluster: Annotated[str | None, typer.Option("--cluster", help="The site's cluster (fallback scope cluster/<C>).")] = None,
    guard: Annotated[
        list[str] | None,
        typer.Option(
            "--guard",
            help="Guarded live KPI: NAME<=+P% (lower is better) or NAME>=-P% (higher is better); repeatable. "
            "Default: the kpi.* columns the policy's reward weighs, 10%.",
        ),
    ] = None,
    no_watch: Annotated[bool, typer.Option("--no-kpi-watch", help="Do not watch KPIs (never roll back by itself).")] = False,
    window: Annotated[int, typer.Option(help="KPI reports per sliding window.")] = 20,
    grace: Annotated[int, typer.Option(help="KPI reports ignored after a swap.")] = 2,
    patience: Annotated[int, typer.Option(help="Consecutive regressed windows before rolling back.")] = 2,
    probation: Annotated[int, typer.Option(help="KPI reports during which a new version is judged, then accepted.")] = 100,
    baseline: Annotated[str, typer.Option(help="auto | previous | metadata | first_window (see KPIGuard).")] = "auto",
    poll: Annotated[float, typer.Option("--poll", help="Seconds between registry polls.")] = 2.0,
    cache_dir: Annotated[
        Path | None,
        typer.Option("--cache-dir", help="Verified last good policies (fail-static restarts); default ~/.cache/edgetwin/runtime/<S>."),
    ] = None,
    bucket: BucketOpt = "edgetwin",
    duration: Annotated[float, typer.Option(help="Stop after this many seconds (0: run until interrupted).")] = 0.0,
    log_level: Annotated[str, typer.Option("--log-level", help="DEBUG, INFO, WARNING.")] = "INFO",
    as_json: JsonOpt = False,
) -> None:
    """Run the edge runtime: serve the site's current signed policy until interrupted.

    Decisions over the bus (request/reply on edgetwin.decision.<S>: the edgetwin frame, or a JSON / Arrow IPC body from any NATS client, see docs/bus.md) and live KPIs on edgetwin.kpi.<S>; hot-swaps on promotion, keeps the last good policy when the registry or the bus is down, and rolls back when a guarded KPI regresses (notice on edgetwin.policy.rollback.<S>).
    """
    import asyncio
    import contextlib
    import logging
    import re
    import signal

    from edgetwin.edge.kpi_watch import KPIGuard, KPIMargin
    from edgetwin.edge.registry import open_async_registry
    from edgetwin.edge.runtime import EdgeRuntime
    from edgetwin.edge.signing import TrustStore

    for flag, name in (("--site", site), ("--cluster", cluster)):
        if name is not None and not re.fullmatch(r"[A-Za-z0-9_\-]{1,64}", name):
            raise InputError(f"expected 1-64 letters, digits, '_' or '-', got {name!r}", flag)
    if log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise InputError(f"expected DEBUG, INFO, WARNING or ERROR, got {log_level!r}", "--log-level")
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if poll <= 0 or duration < 0:
        raise InputError("--poll must be > 0 and --duration >= 0", "--poll/--duration")
    store = TrustStore.from_paths(trust)
    shield_cfg = None
    if shield is not None:
        from edgetwin.policies.shield import ShieldConfig

        try:
            shield_cfg = ShieldConfig.from_dict(json.loads(shield.read_text()))
        except (OSError, ValueError) as e:
            raise InputError(f"expected a JSON shield configuration ({e})", str(shield)) from None
    kpi_guard: Any
    if no_watch:
        kpi_guard = None
    else:
        margins = tuple(KPIMargin.parse(g) for g in guard) if guard else None  # None: the reward's KPIs
        kpi_guard = KPIGuard(margins, window=window, grace=grace, patience=patience, probation=probation, baseline=baseline)  # type: ignore[arg-type]
    cache = cache_dir or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "edgetwin" / "runtime" / site

    import torch

    # One intra-op thread: a policy network answers a few hundred rows at most, where a second
    # thread costs a wake-up (a tail-latency risk on shared cores) and saves nothing.
    torch.set_num_threads(1)

    async def run() -> dict[str, Any]:
        async with open_async_registry(registry, bucket=bucket) as reg:
            rt = EdgeRuntime(
                site, reg, store, bus=bus, shield=shield_cfg, kpi_guard=kpi_guard,
                cluster=cluster, poll_interval=poll, cache_dir=cache, freeze_gc=True,
            )  # fmt: skip
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.add_signal_handler(sig, stop.set)
            async with rt:
                a = rt.active
                serving = (
                    f"serving {a.version} (scope {a.scope} r{a.revision}, key {a.manifest.key_id}, sha256 {a.manifest.sha256[:12]})"
                    if a else f"no policy yet: waiting for a promotion to {', '.join(rt.scopes)}"
                )  # fmt: skip
                out.print(
                    f"edgetwin serve: site {site} {serving}; decisions on edgetwin.decision.{site} via {bus}; "
                    f"registry {registry} polled every {poll:g}s; shield: {'on' if shield_cfg else 'off'}; "
                    f"KPI guard: {rt.guard.describe() if rt.guard else 'off'}; "
                    + (f"stopping after {duration:g}s" if duration else "Ctrl-C to stop"),
                    highlight=False, soft_wrap=True,
                )  # fmt: skip
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), duration or None)
                return rt.status()

    status = asyncio.run(run())
    if as_json:
        emit_json(status)
    else:
        out.print(
            f"edgetwin serve: stopped; served {status['stats']['decisions']} decisions "
            f"({status['stats']['rows']} rows), {status['stats']['rollbacks']} rollbacks, now {status['version']}",
            highlight=False, soft_wrap=True,
        )  # fmt: skip


# ------------------------------------------------------------------------------------- what-if and promotion
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
    deterministic: Annotated[bool, typer.Option(help="Use the twin's mean responses (no response noise).")] = False,
    oos_tolerance: Annotated[
        float, typer.Option(help="Flag a number when more than this share of its agent-steps is out of support.")
    ] = 0.05,
    view: Annotated[Path | None, typer.Option(help="SchedulingView (TOML/JSON) for heuristic:NAME policies.")] = None,
    workers: TaskWorkersOpt = 1,
    ray: TaskRayOpt = None,
    seed: SeedOpt = 0,
    as_json: JsonOpt = False,
) -> None:
    """Run policies through a twin under what-if scenarios; write a KPI report with intervals and plots."""
    from edgetwin.policies.gate import PolicySpec, resolve_policy
    from edgetwin.twin.report import write_report
    from edgetwin.twin.whatif import run_whatif

    if not 0.0 <= oos_tolerance <= 1.0:
        raise InputError(f"expected a share between 0 and 1, got {oos_tolerance}", "--oos-tolerance")
    out_dir_arg(out_dir)
    if ray is not None:
        from edgetwin.twin.parallel import check_ray

        check_ray(ray)
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
        members=_members(members), steps=steps, n_agents=agents, stochastic=not deterministic, log=table,
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


@app.command("promote")
def promote_cmd(
    policy: Annotated[str, typer.Argument(help="Exported policy directory (or a version already in the registry).")],
    registry: RegistryOpt,
    log: Annotated[Path, typer.Option("--log", help="Recent log of the real system: the traffic replayed in the twin.")],
    twin_dir: Annotated[Path, typer.Option("--twin", help="Twin directory to replay in.")],
    key: Annotated[
        Path, typer.Option("--key", envvar="EDGETWIN_SIGNING_KEY", help="Ed25519 private key (PEM) that signs the artifact.")
    ],
    against: Annotated[
        str,
        typer.Option(
            "--against",
            help="auto (the scope's current version, else global's, else the logging policy), a registry "
            "version, a policy directory or a built-in (logging, random).",
        ),
    ] = "auto",
    scope: Annotated[str, typer.Option("--scope", help="global, cluster/NAME or site/NAME.")] = "global",
    scenario: ScenarioOpt = None,
    max_regression: Annotated[
        list[str] | None,
        typer.Option(
            "--max-regression",
            help="Guarded KPI and its margin: KPI=0.05, KPI=5% or KPI=0.05:ABS; repeatable "
            "(default: every KPI with a direction, at --default-margin).",
        ),
    ] = None,
    default_margin: Annotated[float, typer.Option(help="Margin of the default guards (a fraction).")] = 0.05,
    kpis: KpisOpt = None,
    spec: Annotated[Path | None, typer.Option(help="Spec of --log (default: beside it, else the twin's).")] = None,
    exogenous: ExogenousOpt = None,
    episodes: Annotated[int, typer.Option(min=1, help="Recorded episodes replayed (the last ones of the log).")] = 4,
    seeds: Annotated[int, typer.Option(min=1, help="Response-noise seeds per episode.")] = 1,
    members: MembersOpt = None,
    steps: Annotated[int | None, typer.Option(min=1, help="Replay at most this many steps per episode.")] = None,
    trust: Annotated[
        list[Path] | None, typer.Option("--trust", help="More trusted public keys for fetching versions (default: --key's).")
    ] = None,
    refuse_out_of_support: Annotated[
        bool, typer.Option(help="Refuse (instead of abstaining) when a guarded number rests on states outside the logs' support.")
    ] = False,
    max_out_of_support: Annotated[
        float, typer.Option(help="Abstain when more than this share of a number's agent-steps lie outside the logs' support.")
    ] = 0.25,
    force: Annotated[bool, typer.Option("--force", help="Promote even if the gate refuses or abstains (recorded in the metadata).")] = False,
    name: Annotated[str | None, typer.Option(help="Policy name in the registry.")] = None,
    out_dir: Annotated[Path, typer.Option("--out", help="Directory for the gate's report.")] = Path("promotion-report"),
    bucket: BucketOpt = "edgetwin",
    seed: SeedOpt = 0,
    as_json: JsonOpt = False,
) -> None:
    """Replay POLICY and the current version in the twin on recent traffic and what-ifs; promote
    (publish signed + move the scope's pointer with compare-and-swap) only if no guarded KPI regresses,
    judged by the twin's calibrated 90 % intervals (calibrated on the log's own actions).

    Exit 1 with the KPIs that regressed (margin, interval) when the gate refuses; exit 3 with the reason
    when it abstains (an interval straddles a margin, or the candidate's rollout lies outside the logs'
    support); nothing is published then. --json says which KPIs drove the verdict.
    """
    from edgetwin.edge.registry import check_scope, metadata_from_policy_dir, open_registry
    from edgetwin.edge.signing import Signer, TrustStore
    from edgetwin.policies.gate import GateAbstained, parse_guards, promote

    check_scope(scope)
    if not default_margin >= 0:  # also catches NaN
        raise InputError(f"expected a fraction >= 0, got {default_margin}", "--default-margin")
    if not 0.0 <= max_out_of_support <= 1.0:
        raise InputError(f"expected a share in [0, 1], got {max_out_of_support}", "--max-out-of-support")
    guards = parse_guards(max_regression or [])
    out_dir_arg(out_dir)
    signer = Signer.from_pem(key)
    store = TrustStore.from_paths(trust) if trust else TrustStore()
    store.add(signer.public_key)
    twin, scenarios, kpi_defs, table = _whatif_inputs(twin_dir, scenario, kpis, log, spec)
    base_md = metadata_from_policy_dir(policy) if Path(policy).is_dir() else {}
    with open_registry(registry, bucket=bucket) as reg:
        try:
            result = promote(
                policy, reg, twin=twin, log=table, signer=signer, trust=store, scope=scope, against=against,
                scenarios=scenarios, guards=guards or None, default_margin=default_margin, kpis=kpi_defs,
                episodes=episodes, seeds=seeds, seed=seed, members=_members(members), steps=steps,
                exogenous=exogenous or (), refuse_out_of_support=refuse_out_of_support,
                max_out_of_support=max_out_of_support, force=force, out_dir=out_dir, name=name, metadata=base_md,
                progress=not as_json,
            )  # fmt: skip
        except (GateRefused, GateAbstained) as e:
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


# ------------------------------------------------------------------------------------- federation
_LEARNERS = {
    "forecast": {"kind": "forecast"},
    "ppo": {"kind": "ppo", "algo": "ppo", "federate": "policy"},
    "dual-critic": {"kind": "ppo", "algo": "dual_critic_ppo", "federate": "public_critic"},
}


def _strategy_arg(value: str, flag: str) -> Any:
    """A strategy flag: a name (``fedavgm``) or a JSON table (``{"name": "krum", "f": 1}``)."""
    if value.lstrip().startswith("{"):
        try:
            return json.loads(value)
        except json.JSONDecodeError as e:
            raise InputError(f"not a valid JSON strategy table: {e}", flag) from None
    return value


@app.command("federate")
def federate(
    sites: Annotated[int, typer.Option(min=1, help="Edge sites (one ESA each), heterogeneous by construction.")] = 4,
    rounds: Annotated[int, typer.Option(min=1, help="Federated rounds.")] = 10,
    clusters: Annotated[int, typer.Option(min=1, help="Cluster Orchestrator Agents (aggregation groups).")] = 1,
    bus: Annotated[str, typer.Option(help="memory | nats://host:port (several comma-separated).")] = "memory",
    learner: Annotated[str, typer.Option(help="forecast (tiny MLP) | ppo | dual-critic (PFRL-DM).")] = "forecast",
    strategy: Annotated[str, typer.Option(help="Site-level strategy name or JSON table (fedavg, attention, median, ...).")] = "fedavg",
    global_strategy: Annotated[str, typer.Option(help="Strategy of the GCA over the clusters.")] = "fedavg",
    hierarchy: Annotated[bool, typer.Option("--hierarchy/--flat", help="Sites -> clusters -> global, or all sites to the GCA.")] = True,
    participation: Annotated[float | None, typer.Option(help="Share of sites sampled per round (default all).")] = None,
    quorum: Annotated[float | None, typer.Option(help="Share of the sampled sites a round closes on (+ grace).")] = None,
    timeout: Annotated[float, typer.Option(help="Seconds a site-level round waits at most.")] = 30.0,
    grace: Annotated[float, typer.Option(help="Seconds a round waits for stragglers once the quorum is in.")] = 0.5,
    compression: Annotated[bool, typer.Option("--compression/--no-compression", help="Top-k 10 % + int8 uplink.")] = True,
    processes: Annotated[bool, typer.Option("--processes/--in-process", help="One OS process per agent (NATS only).")] = False,
    config: Annotated[Path | None, typer.Option(help="A federation config JSON (overrides the shape flags).")] = None,
    save_config: Annotated[Path | None, typer.Option(help="Write the federation config here (for `edgetwin agent`).")] = None,
    out_file: Annotated[Path | None, typer.Option("--out", help="Write the result JSON here.")] = None,
    plot: Annotated[Path | None, typer.Option(help="Write a PNG of reward and bytes per round here.")] = None,
    seed: SeedOpt = 0,
    as_json: JsonOpt = False,
) -> None:
    """Run a whole MA-FL federation (GCA, COAs, one ESA per site) on this machine."""
    import numpy as np
    import torch

    from edgetwin.federation.runner import FederationConfig, make_federation_config, run_federation

    torch.set_num_threads(1)
    if config is not None:
        cfg = FederationConfig.load(config)
    else:
        if learner not in _LEARNERS:
            raise InputError(f"unknown learner {learner!r}; known: {sorted(_LEARNERS)}", "--learner")
        cfg = make_federation_config(
            sites=sites, rounds=rounds, clusters=clusters, strategy=_strategy_arg(strategy, "--strategy"),
            global_strategy=_strategy_arg(global_strategy, "--global-strategy"), hierarchy=hierarchy,
            learner=_LEARNERS[learner], participation=participation, quorum=quorum, grace_s=grace, timeout_s=timeout,
            compression=compression, seed=seed,
        )
    for flag, path in (("--out", out_file), ("--plot", plot), ("--save-config", save_config)):
        if path is not None:
            out_file_arg(path, flag)
    if save_config is not None:
        cfg.save(save_config)
    res = run_federation(cfg, bus=bus, processes=processes, progress=not as_json)
    if out_file is not None:
        out_file.write_text(json.dumps(res.to_dict(), indent=2, default=_json_default))
    if plot is not None:
        res.plot(plot, title=f"{len(cfg.sites)} sites, {cfg.rounds} rounds")
    if as_json:
        emit_json(res.to_dict())
        return
    curve = res.reward_curve
    up = [sum(v for k, v in row.items() if k != "down") for row in res.bytes_per_round]
    out.print(f"{len(cfg.sites)} sites, {len(res.rounds)} rounds in {res.elapsed_s:.1f}s over {bus}")
    out.print(f"reward (root) first {curve[0]:.4f} -> last {curve[-1]:.4f}; uplink {np.mean(up) / 1024:.1f} KiB/round")
    if res.final_rewards:
        out.print("final reward per site: " + ", ".join(f"{k} {v:.3f}" for k, v in res.final_rewards.items()))
    rejected = res.bus.get("rejected", {})
    if rejected or res.refused:
        out.print(f"rejected messages {rejected}, refused updates {res.refused}")
    if plot is not None:
        out.print(f"plot written to {plot}")


@app.command("agent")
def agent(
    role: Annotated[str, typer.Argument(help="esa | coa | gca | twin-site | twin-coordinator")] = "twin-site",
    config: Annotated[Path | None, typer.Option(help="Federation config JSON (`edgetwin federate --save-config`).")] = None,
    bus: Annotated[str, typer.Option(help="nats://host:port (or memory, for a lone agent in tests).")] = "nats://127.0.0.1:4222",
    name: Annotated[str | None, typer.Option(help="The site (esa, twin-site) or group (coa) this agent runs.")] = None,
    state_dir: Annotated[Path | None, typer.Option(help="ESA checkpoints: a restart finishes the round it was in.")] = None,
    result: Annotated[Path | None, typer.Option(help="GCA: write the federation result JSON here.")] = None,
    fit_twin: Annotated[
        Path | None, typer.Option("--fit-twin", help="twin-site: this site's own log; it never leaves the process.")
    ] = None,
    spec: Annotated[Path | None, typer.Option(help="twin-*: the shared twin spec (TOML).")] = None,
    fit_id: Annotated[str, typer.Option(help="twin-*: the federated fit this agent takes part in.")] = "twin",
    sites: Annotated[str | None, typer.Option(help="twin-coordinator: comma-separated site names.")] = None,
    out_dir: Annotated[Path | None, typer.Option("--out", help="twin-coordinator: where to save the twin.")] = None,
    fed_rounds: Annotated[
        int | None,
        typer.Option(min=1, help="twin-coordinator: FedAvg rounds per member (default: FitOptions', 240)."),
    ] = None,
    members: Annotated[int, typer.Option(min=1, help="twin-coordinator: ensemble members.")] = 1,
) -> None:
    """Run one MA-FL agent until its federation closes; prints one JSON line per event.

    ``--fit-twin LOCAL_LOG`` runs one site's side of a federated twin fit (`twin-site`, the default
    role); ``twin-coordinator`` assembles and saves the twin (docs/federation.md).
    """
    import asyncio
    import logging

    import torch

    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {role} %(name)s %(levelname)s %(message)s")
    if role in ("twin-site", "twin-coordinator") or fit_twin is not None:
        _twin_agent(role, bus, name, fit_twin, spec, fit_id, sites, out_dir, fed_rounds, members)
        return
    from edgetwin.federation.runner import FederationConfig, run_agent

    if role not in ("esa", "coa", "gca"):
        raise InputError(f"role must be esa, coa, gca, twin-site or twin-coordinator, got {role!r}", "ROLE")
    if config is None:
        raise InputError(f"an {role} needs --config", "--config")
    if role in ("esa", "coa") and name is None:
        raise InputError(f"an {role} needs --name (its site or group)", "--name")
    cfg = FederationConfig.load(config)

    def emit(ev: dict[str, Any]) -> None:
        print(json.dumps(ev, default=_json_default), flush=True)

    doc = asyncio.run(run_agent(role, cfg, bus, name=name, state_dir=state_dir, result_path=result, emit=emit))
    emit({"event": "done", "agent": role if name is None else f"{role}/{name}",
          "rounds": len(doc.get("records", doc.get("rounds", [])))})


def _twin_agent(role: str, bus: str, name: str | None, fit_twin: Path | None, spec: Path | None, fit_id: str,
                sites: str | None, out_dir: Path | None, rounds: int | None, members: int) -> None:
    """`edgetwin agent --fit-twin LOG` (one site) and `edgetwin agent twin-coordinator` (the twin)."""
    import asyncio

    from edgetwin.contract.spec import TwinSpec
    from edgetwin.federation.twin.fit import FitOptions
    from edgetwin.federation.twin.runner import run_twin_coordinator, run_twin_site
    from edgetwin.twin.twin import load_log

    def emit(ev: dict[str, Any]) -> None:
        print(json.dumps(ev, default=_json_default), flush=True)

    if role != "twin-coordinator":
        if fit_twin is None:
            raise InputError("a twin-site needs --fit-twin LOCAL_LOG", "--fit-twin")
        df, sp = load_log(fit_twin, spec)
        site = name or (str(df["site"].iloc[0]) if df["site"].nunique() == 1 else None)
        if site is None:
            raise InputError("the log has several sites; name this one with --name", "--name")
        n = asyncio.run(run_twin_site(df, sp, bus, site, fit_id, emit=emit))
        emit({"event": "done", "agent": f"twin-site/{site}", "answered": n})
        return
    if spec is None or sites is None or out_dir is None:
        raise InputError("a twin-coordinator needs --spec, --sites and --out", "--sites")
    out_dir_arg(out_dir)
    names = [s.strip() for s in sites.split(",") if s.strip()]
    twin, rep = asyncio.run(run_twin_coordinator(TwinSpec.load(spec), names, bus, fit_id,
                                                 FitOptions(members=members, **_rounds(rounds)), on_round=emit))
    twin.save(out_dir)
    emit({"event": "done", "agent": "twin-coordinator", "twin": str(out_dir), "bytes_up": rep.bytes_up,
          "bytes_down": rep.bytes_down, "rounds": len(rep.rounds)})


# ------------------------------------------------------------------------------------- entry
def exit_code_of(error: BaseException) -> int:
    """The exit code of an error that ended a command: the one place the contract is decided.

    0 ok / 1 failed / 2 bad input / 3 the gate abstained. Errors say their code in ``exit_code``
    (`InputError` and `ArtifactTampered`: 2, `ArtifactRejected`: 2, `GateRefused`: 1,
    `GateAbstained`: 3); an OS error about a named file (a path that cannot be read or written) is
    bad input, 2; click's usage errors carry their own (2); anything else is a failure, 1.
    """
    code = getattr(type(error), "exit_code", None)
    if isinstance(code, int) and not isinstance(error, typer.Exit):
        return code
    if isinstance(error, typer.TyperException):  # click's usage errors: a bad flag or value
        return int(getattr(error, "exit_code", 2))
    if isinstance(error, OSError) and error.filename is not None:
        return 2
    return 1


def describe_error(error: BaseException) -> str:
    """One line for a person: a label by exit code, then the error's own words (file names first)."""
    code = exit_code_of(error)
    if isinstance(error, typer.TyperException):
        ctx = getattr(error, "ctx", None)
        hint = f" (see {ctx.command_path} --help)" if ctx is not None else ""
        return f"error: {error.format_message()}{hint}"
    if isinstance(error, OSError) and error.filename is not None:
        return f"error: {error.filename}: {error.strerror or error}"
    label = {2: "error", 3: "abstained"}.get(code, "refused" if isinstance(error, GateRefused) else "failed")
    if code == 2 and type(error).__name__ == "ArtifactRejected":
        label = "refused"
    if code == 1 and not isinstance(error, GateRefused):
        return f"failed: {type(error).__name__}: {error} (set EDGETWIN_DEBUG=1 for the traceback)"
    return f"{label}: {error}"


class _RaisedFilter(logging.Filter):
    """Drop log records of errors that are also raised: the CLI prints those once, as the error."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(record, "raised", False)


def _install_warning_handler() -> None:
    """Warnings of edgetwin's loggers go to stderr literally, once (not through logging's last resort)."""
    log = logging.getLogger("edgetwin")
    if any(getattr(h, "_edgetwin_cli", False) for h in log.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("warning: %(message)s"))
    handler.addFilter(_RaisedFilter())
    # a command that configures logging itself (serve) prints through the root logger instead
    handler.addFilter(lambda r: not logging.getLogger().handlers)
    handler._edgetwin_cli = True  # type: ignore[attr-defined]
    log.addHandler(handler)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point: run the app; every error is printed once, literally, one line,
    and turned into its exit code by `exit_code_of`."""
    debug = os.environ.get("EDGETWIN_DEBUG") == "1"
    _install_warning_handler()
    try:
        rv = app(args=argv, prog_name="edgetwin", standalone_mode=False)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except typer.Abort as e:
        # click turns an EOFError raised anywhere in a command (a truncated .gz, say) into Abort:
        # only a real interrupt is "aborted"
        cause = e.__cause__ or e.__context__
        if isinstance(cause, KeyboardInterrupt) or cause is None:
            console.print("aborted")
            sys.exit(130)
        _fail(cause, debug)
    except KeyboardInterrupt:
        console.print("aborted")
        sys.exit(130)
    except Exception as e:  # one line, not a traceback, for anything
        _fail(e, debug)
    sys.exit(rv if isinstance(rv, int) else 0)


def _fail(error: BaseException, debug: bool) -> None:
    if debug:
        traceback.print_exception(error)
    console.print(describe_error(error), markup=False, highlight=False, soft_wrap=True)
    sys.exit(exit_code_of(error))


if __name__ == "__main__":
    main()
