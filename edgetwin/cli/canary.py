"""``edgetwin canary plan``: from the gate's abstention, the slice and hours a canary should get."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from edgetwin.cli.common import JsonOpt, SeedOpt, app, emit_json, out
from edgetwin.contract.errors import InputError

canary_app = typer.Typer(help="Canaries: plan the slice and hours that settle the gate's abstention.",
                         no_args_is_help=True)  # fmt: skip
app.add_typer(canary_app, name="canary")


def resolve_baseline(ref: str, twin: Any, registry: str | None, scope: str, tmp: Path) -> Any:
    """``current``: the registry's current version for ``scope`` (with --registry), else the twin's
    clone of the logging policy (what the logs were made with); anything else: `resolve_policy`."""
    from edgetwin.policies.gate import resolve_policy

    if ref != "current":
        return resolve_policy(ref, twin)
    if registry is None:
        return resolve_policy("logging", twin, name="current")
    from edgetwin.edge.registry import open_registry
    from edgetwin.edge.signing import TrustStore

    with open_registry(registry) as reg:
        version = reg.current(scope) or reg.current("global")
        if version is None:
            return resolve_policy("logging", twin, name="current")
        d = reg.fetch(version, tmp / "current", TrustStore())
    return resolve_policy(d, twin, name=f"current-{version}")


DesignOpt = Annotated[str, typer.Option(
    "--design", help="plan (the plan's group split) or switchback (the site-level switchback `canary plan "
    "--switchback-site --out` wrote beside the plan, or --switchback-plan).")]
SwitchbackPlanOpt = Annotated[Path | None, typer.Option(
    "--switchback-plan", help="With --design switchback: the switchback plan (default: the plan's *.switchback.json).")]


def load_switchback(design: str, plan_path: Path, switchback_plan: Path | None) -> Any:
    """The `SwitchbackPlan` a ``--design switchback`` command runs or judges (None for ``--design plan``);
    one line naming the flag on a bad design, a missing or changed switchback plan."""
    from edgetwin.loop.switchback import SwitchbackPlan

    if design not in ("plan", "switchback"):
        raise InputError(f"unknown design {design!r}; expected plan or switchback", "--design")
    if design == "plan":
        if switchback_plan is not None:
            raise InputError("a switchback plan needs --design switchback", "--switchback-plan")
        return None
    path = switchback_plan or plan_path.with_suffix(".switchback.json")
    flag = f"--switchback-plan {path}"
    if not path.is_file():
        raise InputError("switchback plan not found (write it with `edgetwin canary plan --switchback-site SITE --out PLAN`)",
                         flag)  # fmt: skip
    try:
        doc = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise InputError(f"not JSON ({e})", flag) from None
    if not isinstance(doc, dict):
        raise InputError("not a switchback plan (a JSON object)", flag)
    try:
        return SwitchbackPlan.from_dict(doc)
    except InputError as e:
        raise InputError(e.message, flag) from None


@canary_app.command("plan")
def canary_plan_cmd(
    twin_dir: Annotated[Path, typer.Argument(help="Twin directory (from `edgetwin fit`).")],
    policy: Annotated[str, typer.Option("--policy", help="The candidate: an exported policy directory.")],
    log: Annotated[Path, typer.Option("--log", help="Recent log of the real system (its service groups are the fleet).")],
    baseline: Annotated[
        str, typer.Option("--baseline", help="current (the registry's current version with --registry, else the "
                          "logging policy's clone), a policy directory or a built-in.")
    ] = "current",
    max_share: Annotated[str, typer.Option("--max-share", help="At most this share of the service groups (10% or 0.1).")] = "10%",
    max_loss: Annotated[
        list[str] | None,
        typer.Option("--max-loss", help="KPI=0.5%: the largest fleet-wide worsening the canary may cause at worst; repeatable."),
    ] = None,
    hours: Annotated[float, typer.Option("--hours", help="At most this many hours.")] = 24.0,
    max_regression: Annotated[
        list[str] | None, typer.Option("--max-regression", help="Guarded KPI and margin, as for `edgetwin promote`; repeatable.")
    ] = None,
    registry: Annotated[str | None, typer.Option("--registry", help="Registry whose current version is --baseline current.")] = None,
    scope: Annotated[str, typer.Option("--scope", help="Scope of the current version.")] = "global",
    episodes: Annotated[int, typer.Option(min=1, help="Recorded episodes the gate replays.")] = 2,
    plan_out: Annotated[Path | None, typer.Option("--out", help="Write the plan (JSON) here.")] = None,
    design: Annotated[str, typer.Option(
        "--design", help="auto (the narrower expected interval), random (fair coins) or matched_pairs (paired by "
        "the twin's predicted effect and the pre-period, randomized within pairs).")] = "auto",
    switchback_site: Annotated[
        list[str] | None,
        typer.Option("--switchback-site", help="Also plan a site-level switchback of this site (repeatable) with the "
                     "same share x hours and say which the twin expects to be narrower and whether it predicts "
                     "interference a group split would miss (written beside --out as *.switchback.json)."),
    ] = None,
    seed: SeedOpt = 0,
    as_json: JsonOpt = False,
) -> None:
    """Run the gate; when it abstains, plan the canary that should settle it: which service groups
    (drawn at random from the fleet), how many hours, the interval the twin expects after it, the worst
    case on the slice, and why — within --max-share, --max-loss and --hours. Exit 2 on a bad budget.
    When the gate already decides, nothing is planned (the verdict is printed)."""
    import tempfile

    from edgetwin.cli.policy import _whatif_inputs
    from edgetwin.loop.plan import DESIGNS, budget_from_flags, check_loss_budget_signs, plan_canary
    from edgetwin.loop.rounds import decision_day_variance
    from edgetwin.policies.gate import parse_guards, resolve_guards, resolve_policy, run_gate

    if design not in ("auto", *DESIGNS):  # before anything long
        raise InputError(f"unknown canary design {design!r}; expected one of auto, {', '.join(DESIGNS)}", "--design")
    budget = budget_from_flags(max_share, max_loss, hours)
    guards = parse_guards(max_regression or [])
    twin, _scen, kpi_defs, table = _whatif_inputs(twin_dir, None, None, log, None)
    resolved = resolve_guards(kpi_defs, guards or None)
    known = {g.kpi for g, _k in resolved}
    bad = sorted(set(budget.max_loss) - known)
    if bad:
        raise InputError(f"unknown KPI(s) {bad}; the gate guards {sorted(known)}", "--max-loss")
    if table is not None:  # before the gate: a relative cap needs a KPI of one positive sign
        check_loss_budget_signs(budget.max_loss, {k.name: k for _g, k in resolved}, table)
    with tempfile.TemporaryDirectory(prefix="edgetwin-plan-") as tmp:
        base = resolve_baseline(baseline, twin, registry, scope, Path(tmp))
        cand = resolve_policy(policy, twin, name=Path(policy).name or "candidate")
        if cand.name == base.name:
            cand.name += "-candidate"
        decision = run_gate(twin, cand, base, log=table, guards=guards or None, kpis=kpi_defs, episodes=episodes,
                            seed=seed)  # fmt: skip
        if decision.verdict != "abstain":
            doc = {"plan": None, "gate": {"verdict": decision.verdict, "reason": decision.reason()}}
            if as_json:
                emit_json(doc)
            else:
                out.print(f"nothing to plan: the gate decides ({decision.verdict}): {decision.reason()}")
            return
        # the verdict is about the change over the days the decision lives with: the recent log's days
        # give the plan the day term the verdict will carry (`edgetwin.loop.verdict.guarded_day_variance`)
        day_var = decision_day_variance(twin, decision, [table] if table is not None else [], cand, base, seed)
        try:
            plan = plan_canary(decision, twin, table, cand, base, budget, seed=seed, design=design, day_var=day_var)
        except InputError as e:  # a matched-pair design the budget cannot pair: name the flag
            if e.where != "design":
                raise
            raise InputError(e.message, "--design") from None
        switchback, weighed = None, []
        if switchback_site:
            from edgetwin.loop.switchback import plan_switchback, weigh_against_canary

            try:
                switchback = plan_switchback(decision, twin, table, cand, base, budget, sites=switchback_site, seed=seed)
            except InputError as e:  # the library names its own argument; here the sites are --switchback-site
                raise InputError(e.message, "--switchback-site" if e.where == "--site" else e.where) from None
            weighed = weigh_against_canary(switchback, plan)
    if plan_out is not None:
        plan_out.parent.mkdir(parents=True, exist_ok=True)
        plan_out.write_text(plan.to_json())
        if switchback is not None:
            plan_out.with_suffix(".switchback.json").write_text(json.dumps(switchback.to_dict(), indent=1))
    if as_json:
        answer: dict[str, Any] = {"plan": plan.to_dict(), "gate": {"verdict": decision.verdict, "reason": decision.reason()}}
        if switchback is not None:
            answer["switchback"] = {"plan": switchback.to_dict(), "weighed": weighed}
        emit_json(answer)
    else:
        out.print(plan.describe())
        for line in weighed:
            out.print(f"switchback: {line}")


@canary_app.command("verdict")
def canary_verdict_cmd(
    twin_dir: Annotated[Path, typer.Argument(help="Twin directory (from `edgetwin fit`, or `edgetwin update` with earlier canaries).")],
    canary_log: Annotated[Path, typer.Option("--canary-log", help="The collected canary log (`edgetwin canary collect`).")],
    fleet_log: Annotated[Path, typer.Option("--fleet-log", help="The fleet's log on the current policy the plan was made on.")],
    plan_path: Annotated[Path, typer.Option("--plan", help="The canary plan it ran (`edgetwin canary plan --out`).")],
    current: Annotated[str, typer.Option("--current", help="The current policy: an exported policy directory or a built-in (logging).")],
    candidate: Annotated[str, typer.Option("--candidate", help="The candidate: an exported policy directory.")],
    candidate_version: Annotated[
        str | None, typer.Option("--candidate-version", help="Its registry version in the log's policy column (default: "
                                 "the one version the canary log holds and the fleet log does not).")
    ] = None,
    pre_ticks: Annotated[int, typer.Option("--pre-ticks", min=0, help="Ticks on the current policy before the candidate started.")] = 4,
    evidence_out: Annotated[Path | None, typer.Option("--out", help="Write the verdict as evidence for `edgetwin promote --evidence`.")] = None,
    status_path: Annotated[Path | None, typer.Option("--status", help="The sites' status of the run "
                           "(`edgetwin canary status RUN --json`), which names a stop (the guard's, the loss budget's).")] = None,
    tick_seconds: Annotated[float, typer.Option("--tick-seconds", help="Length of one reported tick, seconds "
                            "(as `canary start` was given): the plan's hours in ticks (--design plan).")] = 900.0,
    design: DesignOpt = "plan",
    switchback_plan: SwitchbackPlanOpt = None,
    seed: SeedOpt = 0,
    as_json: JsonOpt = False,
) -> None:
    """Judge a collected canary: the prediction-powered estimate of the fleet-wide change of every
    guarded KPI of the plan, its interval and level, against its margin. Exit 0 promote, 1 refuse,
    3 undecided (an interval straddles its margin); 2 on bad input. Works on any system's logs that
    follow the log contract (`policy` = the registry version that served each row).

    A canary a stop cut short (a site's log short of the plan's ticks, or a stop --status names) is
    judged as the loop judges it (`edgetwin.loop.day_verdict.stopped_verdict`): the hours before a stop
    are not the day the verdict is about, so a guard stop refuses on the guard's KPI (exit 1) and
    every other KPI stays open; any other stop leaves them all open (exit 3), saying what would
    decide them (a canary that runs its whole day).

    With --design switchback: the switchback's estimate over its blocks (Horvitz-Thompson, burn-in
    dropped, Neyman's conservative variance on a t reference: `edgetwin.loop.switchback`) of the
    change on its sites, judged against the plan's margins by the same rule, a stop included (its
    day: the switchback plan's blocks at every one of its sites; --tick-seconds is not used, the
    switchback plan holds its tick; why not the blocks it ran: `judge_switchback`); the twin and the
    fleet log are what the plan was made from (recorded in the evidence), not terms of the estimate."""
    from edgetwin.cli.policy import _whatif_inputs
    from edgetwin.loop.evidence import Evidence, artifact_digest, file_digest, infer_versions, judge_canary
    from edgetwin.loop.plan import CanaryPlan
    from edgetwin.loop.ppi import LEVEL
    from edgetwin.policies.gate import resolve_policy
    from edgetwin.twin.twin import load_log

    plan = CanaryPlan.load(plan_path)
    switchback = load_switchback(design, plan_path, switchback_plan)
    for p, flag in ((canary_log, "--canary-log"), (fleet_log, "--fleet-log")):
        if not p.exists():
            raise InputError("log not found", f"{flag} {p}")
    twin, _s, _k, fleet = _whatif_inputs(twin_dir, None, None, fleet_log, None)
    canary, _ = load_log(canary_log, twin.spec)
    if switchback is not None:
        from edgetwin.loop.switchback import judge_switchback

        # validated above against the twin's spec; judged on the log as collected, whose switchback
        # columns (arm, tick, block, arm_probability) the spec does not name
        canary = _read_table(canary_log)
        verdict, checks, reason, _est = judge_switchback(canary, switchback, list(plan.margins),
                                                         candidate_version=candidate_version,
                                                         status=_read_status(status_path))  # fmt: skip
        version, current_version = _switchback_versions(canary, switchback)
        version = candidate_version or version
    else:
        version, current_version = infer_versions(canary, fleet, candidate_version)
        cand = resolve_policy(candidate, twin, name=f"candidate-{version}")
        base = resolve_policy(current, twin, name=f"current-{current_version or 'current'}")
        from edgetwin.edge.canary import CanaryConfig

        planned = CanaryConfig.from_plan(plan, version, tick_seconds=tick_seconds, pre_ticks=pre_ticks).ticks
        verdict, checks, reason = judge_canary(twin, fleet, canary, plan, cand, base, candidate_version=version,
                                               pre_ticks=pre_ticks, seed=seed, planned_ticks=planned,
                                               status=_read_status(status_path))  # fmt: skip
    ev = Evidence(
        verdict, reason, [c.to_dict() for c in checks], LEVEL, version, current_version,
        artifact_digest(candidate, "policy") if Path(candidate).is_dir() else None,
        artifact_digest(current, "policy") if Path(current).is_dir() else None,
        artifact_digest(twin_dir, "twin"), file_digest(canary_log), file_digest(fleet_log), file_digest(plan_path),
    )  # fmt: skip
    if evidence_out is not None:
        ev.save(evidence_out)
    if as_json:
        emit_json(ev.to_dict())
    elif switchback is not None:
        out.print(f"switchback verdict: {verdict.upper()} ({100 * LEVEL:g} % intervals of the change on site(s) "
                  f"{', '.join(switchback.sites)} when they switch whole, over {switchback.n_blocks} blocks)")  # fmt: skip
    else:
        out.print(f"canary verdict: {verdict.upper()} ({100 * LEVEL:g} % intervals of the fleet-wide change)")
    if not as_json:
        for c in checks:
            out.print(f"  {c.kpi}: {100 * c.change:+.2f}% [{100 * c.interval[0]:+.2f}%, {100 * c.interval[1]:+.2f}%] "
                      f"vs margin {100 * c.allowed_change:g}% -> {c.verdict}")  # fmt: skip
        # on every verdict: a promotion's reason names the KPIs whose one-day interval carries the
        # bound on the unrevealed day-to-day spread (`edgetwin.loop.day_verdict.bound_note`) too
        out.print(f"  why: {reason}")
    raise typer.Exit({"promote": 0, "refuse": 1, "undecided": 3}[verdict])


def _read_status(path: Path | None) -> Any:
    """The sites' status document (`edgetwin canary status RUN --json`), or None."""
    if path is None:
        return None
    if not path.is_file():
        raise InputError("status file not found", f"--status {path}")
    try:
        return json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise InputError(f"not JSON ({e})", f"--status {path}") from None


def _read_table(path: Path) -> Any:
    """A log file as a DataFrame, every column kept (Parquet, else CSV)."""
    import pandas as pd

    try:
        return pd.read_parquet(path) if path.suffix != ".csv" else pd.read_csv(path)
    except (OSError, ValueError) as e:
        raise InputError(f"cannot read the log ({type(e).__name__}: {e})", f"--canary-log {path}") from None


def _switchback_versions(canary: Any, switchback: Any) -> tuple[str, str | None]:
    """The registry versions on the switchback's candidate and control arms of its log."""
    at = canary[canary["site"].astype(str).isin(switchback.sites)] if "site" in canary.columns else canary
    if "arm" not in at.columns or "policy" not in at.columns:
        raise InputError("a switchback log names each row's arm and policy (columns 'arm', 'policy')", "--canary-log")
    on = sorted(set(at.loc[at["arm"].astype(str) == "candidate", "policy"].astype(str)))
    off = sorted(set(at.loc[at["arm"].astype(str) != "candidate", "policy"].astype(str)) - set(on))
    if not on:
        raise InputError("no row of the switchback's sites was served by the candidate arm", "--canary-log")
    return on[0], (off[0] if len(off) == 1 else None)


BusOpt = Annotated[str, typer.Option("--bus", help="The fleet's bus: nats://host:port (memory://NAME in one process).")]
SitesOpt = Annotated[list[str] | None, typer.Option("--site", help="A site taking part; repeatable.")]


def _on_bus(url: str, work: Any) -> Any:
    """Run ``work(bus)`` on a connected bus (one line and exit 2 when it cannot connect)."""
    import asyncio

    from edgetwin.edge.bus import make_bus

    async def go() -> Any:
        bus = make_bus(url, name="edgetwin-operator") if url.startswith(("nats://", "tls://")) else make_bus(url)
        try:
            await bus.connect()
        except (OSError, TimeoutError) as e:
            raise InputError(f"cannot connect ({type(e).__name__}: {e})", f"--bus {url}") from None
        try:
            return await work(bus)
        finally:
            await bus.close()

    return asyncio.run(go())


@canary_app.command("start")
def canary_start_cmd(
    plan_path: Annotated[Path, typer.Argument(help="The canary plan (`edgetwin canary plan --out`).")],
    registry: Annotated[str, typer.Option("--registry", help="The registry the sites serve from (directory or nats://).")],
    key: Annotated[Path, typer.Option("--key", envvar="EDGETWIN_SIGNING_KEY", help="Ed25519 private key (PEM) that signs the command; the sites' --trust must hold its public key.")],
    bus: BusOpt,
    candidate: Annotated[
        str, typer.Option("--candidate", help="The candidate: a registry version, or an exported policy directory (e.g. "
                          "runs/policy.trained, the network `train` kept beside a safe candidate), published signed first.")
    ],
    current: Annotated[str, typer.Option("--current", help="The version the sites must be serving now (default: the registry's current at --scope).")] = "",
    scope: Annotated[str, typer.Option("--scope", help="Scope whose current version is --current by default.")] = "global",
    run: Annotated[str | None, typer.Option("--run", help="The run id (default: a fresh one, printed).")] = None,
    pre_ticks: Annotated[int, typer.Option("--pre-ticks", min=0, help="Ticks on the current policy everywhere before the candidate starts.")] = 4,
    alpha: Annotated[float, typer.Option("--alpha", help="The guard's error level (a candidate within its margins is stopped with at most this chance).")] = 0.05,
    tick_seconds: Annotated[float, typer.Option("--tick-seconds", help="Length of one reported tick, seconds.")] = 900.0,
    sites: SitesOpt = None,
    design: DesignOpt = "plan",
    switchback_plan: SwitchbackPlanOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Publish a signed canary start on the fleet's durable command subject: the candidate's
    registry version and digest, the plan's slice, hours, margins and loss budget, α, pre-ticks and
    the run id. Running `edgetwin serve` sites accept it only from a key in their --trust directory
    and for a version their registry holds. Exit 2 on a bad plan, key or candidate: nothing is sent.

    With --design switchback the command carries the switchback plan's design instead of the group
    split (its sites, blocks, burn-in, seed and assignment; its start tick is the pre-period and its
    tick length the tick, so --pre-ticks and --tick-seconds are not used): each site named serves
    every one of its groups the candidate in the candidate's blocks and the current policy in the
    others, by the block of each decision's tick; --site, when given, must be among its sites."""
    from edgetwin.edge.registry import open_registry
    from edgetwin.edge.signing import Signer
    from edgetwin.loop.commands import candidate_version, new_run_id, publish_start, start_from_plan
    from edgetwin.loop.plan import CanaryPlan

    if not (0.0 < alpha < 1.0):
        raise InputError(f"expected 0 < alpha < 1, got {alpha}", "--alpha")
    plan = CanaryPlan.load(plan_path)
    switchback = load_switchback(design, plan_path, switchback_plan)
    if switchback is not None and sites and set(sites) - set(switchback.sites):
        raise InputError(f"site(s) {sorted(set(sites) - set(switchback.sites))} are not the switchback's "
                         f"{list(switchback.sites)}", "--site")  # fmt: skip
    signer = Signer.from_pem(key)
    run_id = run or new_run_id()
    with open_registry(registry) as reg:
        version, sha = candidate_version(reg, candidate, signer)
        cur = current or reg.current(scope) or ""
    if cur and cur == version:
        raise InputError(f"the candidate {version!r} is the current version already", "--candidate")
    cmd = start_from_plan(plan, candidate=version, sha256=sha, run=run_id, current=cur, pre_ticks=pre_ticks,
                          alpha=alpha, tick_seconds=tick_seconds, sites=sites or (), switchback=switchback)  # fmt: skip
    seq = _on_bus(bus, lambda b: publish_start(b, cmd, signer))
    doc = {"run": run_id, "candidate": version, "sha256": sha, "current": cur, "stream_seq": seq,
           "sites": list(cmd.sites), "hours": cmd.hours, "pre_ticks": cmd.pre_ticks,
           "design": "switchback" if cmd.switchback is not None else "plan"}  # fmt: skip
    if cmd.switchback is not None:
        doc["switchback"] = cmd.switchback.to_dict()
    if as_json:
        emit_json(doc)
    elif cmd.switchback is not None:
        sb = cmd.switchback
        out.print(f"switchback {run_id} started: {version} on site(s) {', '.join(sb.sites)} in {sb.n_blocks // 2} of "
                  f"{sb.n_blocks} blocks of {sb.block_ticks} ticks ({sb.carryover_ticks} burned in each) after "
                  f"{sb.start_tick} pre-ticks, {cur or 'as served'} in the others")  # fmt: skip
    else:
        out.print(f"canary {run_id} started: {version} on {len(plan.slice.agents) or 'the'} groups' slice for "
                  f"{cmd.hours:g} h after {cmd.pre_ticks} pre-ticks (current {cur or 'as served'})")  # fmt: skip


@canary_app.command("stop")
def canary_stop_cmd(
    run: Annotated[str, typer.Argument(help="The run id.")],
    key: Annotated[Path, typer.Option("--key", envvar="EDGETWIN_SIGNING_KEY", help="Ed25519 private key (PEM) that signs the command.")],
    bus: BusOpt,
    sites: SitesOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Publish a signed stop of RUN: its slice goes back to the current policy (reason ``operator``)."""
    from edgetwin.edge.canary_command import CanaryStop
    from edgetwin.edge.signing import Signer
    from edgetwin.loop.commands import publish_stop

    signer = Signer.from_pem(key)
    cmd = CanaryStop(run, "operator", tuple(sites or ()))
    seq = _on_bus(bus, lambda b: publish_stop(b, cmd, signer))
    if as_json:
        emit_json({"run": run, "stop": "operator", "stream_seq": seq})
    else:
        out.print(f"canary {run}: stop sent")


@canary_app.command("status")
def canary_status_cmd(
    run: Annotated[str, typer.Argument(help="The run id.")],
    bus: BusOpt,
    sites: Annotated[list[str], typer.Option("--site", help="A site to ask; repeatable.")],
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds to wait for each site's reply.")] = 2.0,
    as_json: JsonOpt = False,
) -> None:
    """Ask each site how RUN stands: phase, ticks, groups per arm, the guard's state, the loss so
    far, segments spooled and shipped. Exit 1 when a site does not answer."""
    from edgetwin.loop.commands import fleet_status

    got = _on_bus(bus, lambda b: fleet_status(b, sites, run, timeout))
    doc = {s: (v if isinstance(v, str) else v.to_dict()) for s, v in got.items()}
    if as_json:
        emit_json({"run": run, "sites": doc})
    else:
        for s, v in got.items():
            if isinstance(v, str):
                out.print(f"{s}: {v}")
                continue
            guard = ", ".join(f"{k} [{g.get('lower')}, {g.get('upper')}]" for k, g in v.guard.items() if isinstance(g, dict))
            out.print(f"{s}: {v.phase} {v.run or '-'} ticks {v.ticks}/{v.planned_ticks} arms {v.arms} guard {guard or '-'} "
                      f"loss {v.loss} stop {v.stop_reason or '-'} segments {v.shipped}/{v.segments}")  # fmt: skip
    if any(isinstance(v, str) for v in got.values()):
        raise typer.Exit(1)


@canary_app.command("collect")
def canary_collect_cmd(
    run: Annotated[str, typer.Argument(help="The run id.")],
    bus: BusOpt,
    out_path: Annotated[Path, typer.Option("--out", help="The canary log written (Parquet).")],
    sites: SitesOpt = None,
    idle: Annotated[float, typer.Option("--idle", help="Stop once no segment arrived for this many seconds.")] = 2.0,
    timeout: Annotated[float, typer.Option("--timeout", help="Stop after this many seconds whatever arrived.")] = 600.0,
    as_json: JsonOpt = False,
) -> None:
    """Read RUN's durable log segments from the bus to --out, streaming (one Parquet row group per
    segment), each ``<run>-<seq>`` once, and say which sequence numbers are missing (with --site:
    also those a site's status says it shipped). Exit 1 when a segment is missing."""
    from edgetwin.loop.collect import collect_canary
    from edgetwin.loop.commands import fleet_status

    async def work(b: Any) -> Any:
        expected: dict[str, int] = {}
        if sites:
            for s, st in (await fleet_status(b, sites, run)).items():
                if not isinstance(st, str):
                    expected[s] = int(st.shipped)
        return await collect_canary(b, run, out_path, idle=idle, timeout=timeout, expected=expected)

    res = _on_bus(bus, work)
    if as_json:
        emit_json(res.to_dict())
    else:
        segs = sum(len(v) for v in res.segments.values())
        out.print(f"canary {run}: {res.rows} rows from {segs} segments of {len(res.segments)} site(s) -> {out_path}"
                  + (f"; {res.duplicates} redelivered segment(s) skipped" if res.duplicates else ""))  # fmt: skip
        for s, gap in res.missing.items():
            out.print(f"  {s}: missing sequence number(s) {gap}")
    if res.missing:
        raise typer.Exit(1)
