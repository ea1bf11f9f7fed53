"""``edgetwin logs``: generate logs on the emulated cluster and validate a log (every problem at once)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from edgetwin.cli.common import (
    JsonOpt,
    SeedOpt,
    app,
    emit_json,
    out,
    out_file_arg,
)
from edgetwin.contract.errors import InputError

logs_app = typer.Typer(help="Generate, validate and inspect logs.", no_args_is_help=True)
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


