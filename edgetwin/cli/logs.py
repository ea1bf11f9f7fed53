"""``edgetwin logs``: generate logs on the emulated cluster, validate a log (every problem at once), and
import one from Prometheus (``logs import prometheus``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from edgetwin.cli.common import (
    AllowCodeOpt,
    JsonOpt,
    SeedOpt,
    app,
    emit_json,
    out,
    out_file_arg,
)
from edgetwin.contract.errors import InputError

logs_app = typer.Typer(help="Generate, validate, inspect and import logs.", no_args_is_help=True)
app.add_typer(logs_app, name="logs")


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
    allow_code: AllowCodeOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Report every problem of a log at once; exit 0 if it is usable, 2 if it is not.

    Unusable rows go to the quarantine file with their row number and reason; see docs/log-format.md.
    """
    from edgetwin.contract.functions import allow_code as allow
    from edgetwin.contract.validate import validate_log

    allow(allow_code or [])
    if not 0.0 <= min_usable <= 1.0:
        raise InputError(f"must be between 0 and 1, got {min_usable}", "--min-usable")
    report = validate_log(log, spec=spec, quarantine_path=quarantine, min_usable_fraction=min_usable)
    if as_json:
        emit_json(report.to_dict())
    else:
        out.print(report.summary(markup=False))
    raise typer.Exit(0 if report.usable else 2)



@logs_app.command("generate")
def logs_generate(
    out_path: Annotated[Path, typer.Option("--out", help="Log to write (.parquet or .csv); LOG.spec.toml goes beside it.")],
    agents: Annotated[int, typer.Option("--agents", min=1, help="Service groups per episode.")] = 200,
    episodes: Annotated[
        int | None, typer.Option("--episodes", min=1, help="Episodes (days) to log under --policy [default: 3].")
    ] = None,
    steps: Annotated[int, typer.Option("--steps", min=1, help="Ticks per episode (96 x 15 min = a day).")] = 96,
    policy: Annotated[
        str | None,
        typer.Option("--policy", help="Logging policy: random | heuristic (SLO-aware) | regime_switching | a heuristic "
                     "of edgetwin.policies.heuristics (least_loaded, round_robin, best_fit, sjf, ljf, lowest_carbon) "
                     "[default: random]."),
    ] = None,
    noise: Annotated[
        float | None,
        typer.Option("--noise", help="Gaussian exploration noise on --policy's actions, a share of each action's range "
                     "(0.1 = 10 %) [default: 0]."),
    ] = None,
    regime: Annotated[
        list[str] | None,
        typer.Option("--regime", help="POLICY:DAYS[:NOISE], repeatable, in order: log several schedulers one after "
                     "the other (e.g. --regime heuristic:4:0.1 --regime least_loaded:2:0.1); instead of "
                     "--policy / --episodes / --noise."),
    ] = None,
    trial: Annotated[
        list[str] | None,
        typer.Option("--trial", help="SHARE:DAYS:ARM[,ARM...], repeatable, after the regimes: DAYS more days of the "
                     "last policy on which each service group joins a randomized trial with probability SHARE and "
                     "then one ARM (a policy name) at random, logged as arm-ARM (e.g. --trial 0.1:1:random,least_loaded)."),
    ] = None,
    drift: Annotated[str, typer.Option("--drift", help="Simulated time since day 0: 0d | 1d | 1w | 1m.")] = "0d",
    trace: Annotated[
        Path | None, typer.Option("--trace", help="Real trace for task sizes and arrival curve (format auto-detected).")
    ] = None,
    carbon: Annotated[
        Path | None, typer.Option("--carbon", help="Carbon-intensity file or folder (<zone>_*.parquet); default built-in.")
    ] = None,
    plot: Annotated[bool, typer.Option("--plot/--no-plot", help="Also write LOG.overview.png (KPIs by hour).")] = True,
    openmetrics: Annotated[
        Path | None,
        typer.Option("--openmetrics", help="Also write the log as OpenMetrics (episode e = day 2026-01-01 + e) and "
                     "its import mapping beside it (for promtool backfill / logs import prometheus)."),
    ] = None,
    seed: SeedOpt = 0,
    as_json: JsonOpt = False,
) -> None:
    """Run the emulated edge-cloud cluster under logging policies and write its log and spec.

    Every row says which policy decided it (``policy``) and, where that policy samples, the
    probability density of its action (``propensity``): one policy (--policy, --noise), several one
    after the other (--regime), and randomized trials on a share of the service groups (--trial).
    """
    from edgetwin.contract.logs import write_table
    from edgetwin.contract.spec import POLICY_COLUMN, spec_path_for
    from edgetwin.emulator.cluster import ClusterConfig
    from edgetwin.emulator.logs import (
        Regime,
        generate_logs,
        parse_regime,
        parse_trial,
        plot_overview,
        policy_names,
    )
    from edgetwin.emulator.population import DRIFT_DAYS

    if drift not in DRIFT_DAYS:
        raise InputError(f"expected one of {', '.join(DRIFT_DAYS)}, got {drift!r}", "--drift")
    for flag, value in (("--agents", agents), ("--episodes", episodes), ("--steps", steps)):
        if value is not None and value < 1:
            raise InputError(f"expected a positive integer, got {value}", flag)
    if regime:
        for flag, given in (("--policy", policy), ("--episodes", episodes), ("--noise", noise)):
            if given is not None:
                raise InputError("give either --regime or --policy / --episodes / --noise, not both", flag)
        regimes = [parse_regime(r) for r in regime]
    else:
        name = (policy or "random").strip().replace("-", "_")
        if name not in policy_names():
            raise InputError(f"expected one of {', '.join(policy_names())}, got {policy!r}", "--policy")
        if noise is not None and not 0.0 <= noise <= 1.0:
            raise InputError(f"must be in [0, 1] (a share of each action's range), got {noise}", "--noise")
        regimes = [Regime(name, episodes or 3, noise=noise or 0.0)]
    for t in trial or []:
        regimes.append(parse_trial(t, regimes[-1]))
    episodes = sum(r.days for r in regimes)
    if trace is not None and not trace.exists():
        raise InputError("trace file not found", f"--trace {trace}")
    if carbon is not None and not carbon.exists():
        raise InputError("carbon intensity file not found", f"--carbon {carbon}")
    out_file_arg(out_path)
    if openmetrics is not None:
        out_file_arg(openmetrics, "--openmetrics")
    config = ClusterConfig(n_agents=agents, steps=steps, drift=drift, trace=trace, carbon=carbon)
    log, spec = generate_logs(config, regimes=regimes, seed=seed, progress=not as_json)
    write_table(log, out_path)
    spec_path = spec.save(spec_path_for(out_path))
    png = plot_overview(log, out_path.with_name(out_path.name.split(".")[0] + ".overview.png")) if plot else None
    om = None
    if openmetrics is not None:
        from edgetwin.emulator.logs import write_openmetrics_logs

        om = write_openmetrics_logs(log, spec, openmetrics)
    rows_by_policy = {str(k): int(v) for k, v in log[POLICY_COLUMN].value_counts().sort_index().items()}
    summary: dict[str, Any] = {
        "log": str(out_path),
        "spec": str(spec_path),
        "plot": None if png is None else str(png),
        "openmetrics": None if om is None else str(om[0]),
        "mapping": None if om is None else str(om[1]),
        "rows": len(log),
        "episodes": episodes,
        "agents": agents,
        "steps": steps,
        "regimes": [{"policy": r.policy_id(), "days": r.days, "noise": r.noise,
                     **({"trial_share": r.arm_share, "arms": list(r.arms)} if r.arms else {})} for r in regimes],
        "policies": rows_by_policy,
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
        where += f"\nOpenMetrics: {om[0]} (import mapping {om[1]})" if om else ""
        if len(summary["policies"]) > 1 or any(r.arms or r.noise for r in regimes):
            where += "\npolicies (rows): " + ", ".join(f"{k} {v:,}" for k, v in rows_by_policy.items())
        out.print(
            f"wrote {summary['rows']:,} rows ({episodes} episodes x {steps} steps x {agents} service groups) "
            f"to {out_path}\n{where}\nmean offload ratio {summary['mean_offload_ratio']:.3f}, "
            f"SLO violations {summary['mean_slo_violation']:.3f}, reward {summary['mean_reward']:.3f}"
        )




import_app = typer.Typer(help="Import a log from where operators keep it.", no_args_is_help=True)
logs_app.add_typer(import_app, name="import")


@import_app.command("prometheus")
def logs_import_prometheus(
    mapping: Annotated[Path, typer.Option("--mapping", help="The import mapping (TOML): a query per contract column, the key labels; see docs/log-format.md.")],
    out_path: Annotated[Path, typer.Option("--out", help="Log to write (.parquet or .csv); LOG.spec.toml and LOG.quarantine.csv go beside it.")],
    start: Annotated[str, typer.Option("--start", help="First step: RFC 3339 (2026-03-01T00:00:00Z; no zone = UTC) or unix seconds.")],
    end: Annotated[str, typer.Option("--end", help="End of the range, exclusive (same forms as --start).")],
    step: Annotated[str | None, typer.Option("--step", help="Seconds per t (60, 60s, 1m, 1h); must divide the range; default the mapping's step.")] = None,
    url: Annotated[str | None, typer.Option("--url", help="The Prometheus server, e.g. http://127.0.0.1:9090 (/api/v1/query_range).")] = None,
    from_file: Annotated[
        Path | None, typer.Option("--from-file", help="An OpenMetrics / text-exposition dump with timestamps instead of a server (queries: plain selectors).")
    ] = None,
    timeout: Annotated[float, typer.Option("--timeout", min=0.1, help="Seconds per HTTP request, all of it (connect, headers, body).")] = 60.0,
    retries: Annotated[int, typer.Option("--retries", min=0, help="Extra attempts after a connection error, a timeout, HTTP 429 or 5xx.")] = 3,
    max_points: Annotated[int, typer.Option("--max-points", min=1, max=11000, help="Steps per request (Prometheus answers at most 11,000 points per series).")] = 11000,
    concurrency: Annotated[int, typer.Option("--concurrency", min=1, max=16, help="Queries in flight at once (the server evaluates one while edgetwin reads another).")] = 2,
    http_config: Annotated[
        Path | None, typer.Option("--http-config", help="Credentials and TLS (TOML; Prometheus' http_config keys: basic_auth, authorization, bearer_token_file, tls_config).")
    ] = None,
    max_answer_mb: Annotated[float, typer.Option("--max-answer-mb", min=0.001, help="The largest answer read per request (MB); a larger one is refused.")] = 256.0,
    min_usable: Annotated[float, typer.Option("--min-usable", help="The log is unusable below this share of usable rows (0..1).")] = 0.5,
    as_json: JsonOpt = False,
) -> None:
    """Import a log from Prometheus: run the mapping's queries over [START, END) every STEP, write the
    log and its spec skeleton, and validate it (exit 0 usable, 2 not, or a bad mapping, range or server).
    """
    from edgetwin.contract.prometheus.auth import HTTPClientConfig
    from edgetwin.contract.prometheus.http import PrometheusHTTP
    from edgetwin.contract.prometheus.importer import import_prometheus

    if not 0.0 <= min_usable <= 1.0:
        raise InputError(f"must be between 0 and 1, got {min_usable}", "--min-usable")
    if (url is None) == (from_file is None):
        raise InputError("give exactly one source: a server (--url) or a dump (--from-file)", "--url")
    out_file_arg(out_path)
    if http_config is not None and url is None:
        raise InputError("applies to a server (--url) only", "--http-config")
    client = None
    if url is not None:
        auth = HTTPClientConfig.load(http_config) if http_config is not None else None
        try:
            client = PrometheusHTTP(url, timeout=timeout, retries=retries, max_points=max_points, auth=auth,
                                    max_bytes=int(max_answer_mb * 1024 * 1024))  # fmt: skip
        except ValueError as e:
            raise InputError(str(e), "--url") from None
        except OSError as e:  # ssl.SSLError included: a PEM file that is not a certificate or key
            raise InputError(f"cannot load the TLS files ({e})", str(http_config)) from None
    result = import_prometheus(
        mapping, out_path, start=start, end=end, step=step, client=client, from_file=from_file,
        progress=not as_json, min_usable_fraction=min_usable, concurrency=concurrency,
    )  # fmt: skip
    if as_json:
        emit_json(result.to_dict())
    else:
        out.print(result.summary())
    raise typer.Exit(0 if result.report.usable else 2)
