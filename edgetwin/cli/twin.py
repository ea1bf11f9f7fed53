"""``edgetwin fit``, ``fit-federated``, ``update``, ``fidelity`` and ``population``: learn a twin
(centralised or federated), update it with new rows, and score it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from edgetwin.cli.common import (
    AllowCodeOpt,
    JsonOpt,
    SeedOpt,
    app,
    emit_json,
    json_default,
    out,
    out_dir_arg,
    rounds_option,
)
from edgetwin.cli.trust import TwinTrustOpt, check_twin_trust
from edgetwin.contract.errors import InputError

#: `fit` and `fit-federated` share these (the model family and where members are fitted)
SpecOpt = Annotated[Path | None, typer.Option(help="Twin spec (TOML); default LOG.spec.toml beside the log.")]
MembersOpt = Annotated[int, typer.Option(min=1, help="Ensemble members (bootstrap resamples of episodes).")]
RoundsOpt = Annotated[int, typer.Option(min=0, help="MAIL-MMSG adversarial rounds per scenario (0: BC only).")]
PopulationModelOpt = Annotated[str, typer.Option(help="gan-smmsg | gmm | gan | wgan | empirical.")]
PopulationStepsOpt = Annotated[int | None, typer.Option(min=0, help="Generator updates of the population model.")]
KeyOpt = Annotated[
    Path | None,
    typer.Option("--key", help="Ed25519 private key (PEM): sign the twin (its SIGNATURE.json) so that commands "
                 "given --trust accept it."),
]


def _signer(key: Path | None) -> Any:
    """The twin's signer, loaded before the fit: a bad key fails at once, not after the fit."""
    if key is None:
        return None
    from edgetwin.edge.signing import Signer

    return Signer.from_pem(key)


@app.command("fit")
def twin_fit(
    log: Annotated[Path, typer.Argument(help="Log table (.parquet or .csv).")],
    out_dir: Annotated[Path, typer.Option("--out", help="Directory to write the twin to.")],
    spec: SpecOpt = None,
    members: MembersOpt = 5,
    rounds: RoundsOpt = 10,
    bc_epochs: Annotated[int, typer.Option(min=0, help="Behaviour-cloning epochs (engine and client pre-training).")] = 20,
    response_model: Annotated[str, typer.Option(help="mail | bc | supervised | causal (learns the actions' effects across the log's policy ids) | "
                                                    "auto (default: causal when the log holds several policies with overlap, else mail).")] = "auto",
    population_model: PopulationModelOpt = "gan-smmsg",
    population_steps: PopulationStepsOpt = None,
    site_model: Annotated[
        bool,
        typer.Option(
            "--site-model",
            help="Learn how site-level state columns (one value per site and tick) follow the whole site's "
            "actions (`SiteStateModel`); off by default, see docs/benchmarks/twin_site_state/README.md.",
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
    key: KeyOpt = None,
    seed: SeedOpt = 0,
    allow_code: AllowCodeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Learn a twin from a log. Resumable: finished members are checkpointed in OUT/checkpoint.
    Across sites without moving rows: `edgetwin fit-federated` (also spelt `fit --federated`); a
    twin updated with new rows: `edgetwin update` (also spelt `fit --update TWIN`)."""
    from edgetwin.contract.functions import allow_code as allow

    allow(allow_code or [])
    out_dir_arg(out_dir)  # before the heavy imports: a wrong --out is reported at once
    signer = _signer(key)
    import torch

    from edgetwin.generative import MODELS
    from edgetwin.twin.twin import RESPONSE_MODELS, Twin

    if response_model not in (*RESPONSE_MODELS, "auto"):
        raise InputError(f"expected one of {', '.join((*RESPONSE_MODELS, 'auto'))}, got {response_model!r}",
                         "--response-model")
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
    summary = {"twin": str(out_dir), **{k: twin.meta[k] for k in ("members", "data_sha256", "n_rows", "n_episodes", "fit_seconds")},
               "response_model": twin.meta["response_model"], "overlap": twin.meta.get("overlap")}
    if signer is not None:
        _sign_twin(out_dir, signer, True)
        summary["signed_by"] = signer.key_id
    if as_json:
        emit_json(summary)
    else:
        out.print(f"twin written to {out_dir} ({twin.meta['members']} members, {twin.meta['n_rows']} rows, "
                  f"{twin.meta['fit_seconds']:.0f} s)" + (f", signed by key {signer.key_id}" if signer else ""))
        if overlap_text(twin.meta):
            out.print(overlap_text(twin.meta))


@app.command("fit-federated")
def twin_fit_federated(
    log: Annotated[Path, typer.Argument(help="Log table (.parquet or .csv) with a site column.")],
    out_dir: Annotated[Path, typer.Option("--out", help="Directory to write the twin to.")],
    spec: SpecOpt = None,
    members: MembersOpt = 5,
    rounds: RoundsOpt = 10,
    response_model: Annotated[str, typer.Option(help="mail | bc | causal | auto (default: causal when the sites "
                                                    "together logged several policies).")] = "auto",
    population_model: PopulationModelOpt = "gan-smmsg",
    population_steps: PopulationStepsOpt = None,
    fed_rounds: Annotated[
        int | None, typer.Option(min=1, help="FedAvg rounds per member (default: 240 of 5 minibatches; "
                            "with dp_gaussian 8 of 2 epochs, DP_SCHEDULE).")
    ] = None,
    strategy: Annotated[str, typer.Option(help="fedavg | fedavgm | dp_gaussian.")] = "fedavg",
    min_agents: Annotated[
        int, typer.Option(min=1, help="Every statistic a site sends is an aggregate over at least this "
                          "many agents; a site with fewer sends none (docs/federation.md).")
    ] = 10,
    compression: Annotated[str, typer.Option(help="dense | int8 | topk+int8.")] = "dense",
    secure: Annotated[bool, typer.Option("--secure", help="Secure aggregation.")] = False,
    light: Annotated[
        bool,
        typer.Option("--light", help="The light family (behaviour-cloned responses, mixture population) "
                     "instead of the default MAIL + GAN-SMMSG."),
    ] = False,
    key: KeyOpt = None,
    seed: SeedOpt = 0,
    allow_code: AllowCodeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Learn a twin across the log's sites (also spelt `edgetwin fit LOG --federated`): the log is
    split by its site column, one agent per site in this process over the in-process bus; only
    statistics and parameters travel (docs/federation.md)."""
    from edgetwin.contract.functions import allow_code as allow

    allow(allow_code or [])
    out_dir_arg(out_dir)
    signer = _signer(key)
    fam: dict[str, Any] = {"response_model": "bc", "population_model": "gmm"} if light else {
        "response_model": response_model, "population_model": population_model, "adv_rounds": rounds}
    if population_steps is not None:
        fam["gan_rounds"] = max(1, population_steps // 50)
    _fit_federated(log, out_dir, spec, members, fed_rounds, strategy, compression, secure, seed, as_json, fam,
                   min_agents)
    _sign_twin(out_dir, signer, as_json)


@app.command("update")
def twin_update(
    twin_dir: Annotated[Path, typer.Argument(help="The twin to update (it stays as it is).")],
    log: Annotated[Path, typer.Argument(help="The new rows (e.g. a canary's log; .parquet or .csv).")],
    out_dir: Annotated[Path, typer.Option("--out", help="Directory to write the updated twin to.")],
    old_logs: Annotated[
        list[Path] | None,
        typer.Option("--log", help="The twin's training log (repeat, in order, for a twin that was "
                     "itself updated: its meta.json data_parts)."),
    ] = None,
    spec: Annotated[Path | None, typer.Option(help="The new rows' spec; refused unless it is the twin's.")] = None,
    update_epochs: Annotated[int, typer.Option(min=1, help="Fine-tune passes per response model.")] = 5,
    update_steps: Annotated[int, typer.Option(min=1, help="At most this many gradient steps per model.")] = 1000,
    key: KeyOpt = None,
    seed: SeedOpt = 0,
    allow_code: AllowCodeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Update TWIN with LOG's rows instead of fitting a new one (also spelt `edgetwin fit LOG --update
    TWIN`): response models warm-started and fine-tuned on old + new rows, support rebuilt; the new
    twin names its parent. Needs the twin's own log(s) with --log."""
    from edgetwin.contract.functions import allow_code as allow

    allow(allow_code or [])
    out_dir_arg(out_dir)
    signer = _signer(key)
    _fit_update(twin_dir, log, out_dir, spec, old_logs or [], update_epochs, update_steps, seed, as_json)
    _sign_twin(out_dir, signer, as_json)


def overlap_text(meta: dict[str, Any]) -> str:
    """What the twin's training logs say about the effect of actions (`overlap_report`, kept in its
    meta at fit time), for people; empty for a twin fitted before the report existed."""
    from edgetwin.imitation.overlap import Overlap

    doc = meta.get("overlap")
    return Overlap(**doc).summary() if isinstance(doc, dict) else ""


def _sign_twin(out_dir: Path, signer: Any, quiet: bool) -> None:
    """Write the twin's SIGNATURE.json (`edgetwin.edge.signed_dirs`) when ``signer`` is given."""
    if signer is None:
        return
    from edgetwin.edge.signed_dirs import sign_directory

    sign_directory(out_dir, "twin", signer, {"publisher": signer.key_id})
    if not quiet:
        out.print(f"signed by key {signer.key_id}")


def _fit_update(twin_dir: Path, new_log: Path, out_dir: Path, spec: Path | None, old_logs: list[Path],
                epochs: int, max_steps: int, seed: int, as_json: bool) -> None:
    import torch

    from edgetwin.contract.spec import TwinSpec
    from edgetwin.twin.twin import Twin
    from edgetwin.twin.update import manifest_sha256, update_twin

    if not old_logs:
        raise InputError("updating a twin needs the twin's training log (--log OLD): a twin does not keep its raw logs, "
                         "and fine-tuning on the new rows alone forgets the old ones", "--log")
    if out_dir.resolve() == twin_dir.resolve():
        raise InputError("--out must differ from the twin being updated: the parent twin stays as it is", "--out")
    for p in (new_log, *old_logs):
        if not p.is_file():
            raise InputError("no such log file", str(p))
    torch.set_num_threads(1)
    parent = Twin.load(twin_dir)
    if spec is not None and TwinSpec.load(spec).hash() != parent.spec.hash():
        raise InputError("this spec is not the twin's: the new rows must be logged under the twin's spec", str(spec))
    child = update_twin(parent, new_log, old_logs, seed=seed, epochs=epochs, max_steps=max_steps,
                        parent_manifest=manifest_sha256(twin_dir))  # fmt: skip
    child.save(out_dir)
    u = child.meta["update"]
    summary = {"twin": str(out_dir), "parent": child.meta["parent"], "new_rows": u["new_rows"],
               "n_rows": child.meta["n_rows"], "update_seconds": u["seconds"], "data_sha256": child.meta["data_sha256"]}
    if as_json:
        emit_json(summary)
    else:
        out.print(f"twin written to {out_dir}: {parent.meta.get('n_rows')} + {u['new_rows']} rows, updated in "
                  f"{u['seconds']:.0f} s; parent {str(child.meta['parent']['manifest_sha256'])[:12]}... ({twin_dir})")


#: the behaviour-cloning phase's rounds shown by `edgetwin fit-federated` (one line in this many)
WEIGHT_ROUNDS_SHOWN_EVERY = 20


def _fit_federated(log: Path, out_dir: Path, spec: Path | None, members: int, rounds: int | None, strategy: str,
                   compression: str, secure: bool, seed: int, as_json: bool, family: dict[str, Any],
                   min_agents: int = 10) -> None:
    """`edgetwin fit-federated`: one site agent per value of the log's site column, in-process.

    ``family``: `FitOptions` fields choosing the models (default MAIL + GAN-SMMSG, as `Twin.fit`)."""
    import torch

    from edgetwin.federation.twin.fit import FitOptions
    from edgetwin.federation.twin.runner import fit_federated, split_by_site
    from edgetwin.twin.twin import load_log

    torch.set_num_threads(1)
    df, sp = load_log(log, spec)
    parts = split_by_site(df)

    def progress(rec: dict[str, Any]) -> None:
        # the weights and causal phases run hundreds of short rounds (`FitOptions`): show one in 20
        if not as_json and (rec["phase"] not in ("weights", "causal_sums", "causal_grad")
                            or rec["step"] % WEIGHT_ROUNDS_SHOWN_EVERY == 0 or rec["missing"]):
            out.print(f"round {rec['seq']:>3} {rec['phase']:<11} member {rec['member']} step {rec['step']:>2}: "
                      f"{len(rec['sites'])}/{len(parts)} sites ({rec['reason']}, {rec['seconds']:.1f} s)"
                      + (f", missing {rec['missing']}" if rec["missing"] else ""))

    options = FitOptions.for_strategy(strategy, members=members, seed=seed, **family, **rounds_option(rounds))
    twin, rep = fit_federated(parts, sp, options=options,
                              strategy=strategy, compression=compression, secure=secure, on_round=progress,
                              min_agents=min_agents)
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
    trust: TwinTrustOpt = None,
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
    check_twin_trust(twin_dir, trust)
    twin = Twin.load(twin_dir)
    df, _ = load_log(log, spec)
    report = fidelity_report(twin, df, seed=seed, episodes=episodes, max_horizon=horizon, out_dir=out_dir)
    if out_dir is not None:
        (out_dir / "fidelity.json").write_text(json.dumps(report, indent=1, default=json_default))
    report["training_overlap"] = twin.meta.get("overlap")
    if as_json:
        emit_json(report)
        return
    if overlap_text(twin.meta):
        out.print(overlap_text(twin.meta).replace("overlap:", "overlap of the twin's training logs:", 1))
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


