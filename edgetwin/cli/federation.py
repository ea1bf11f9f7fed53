"""``edgetwin federate`` and ``agent``: MA-FL federations and the federated twin fit's agents."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Annotated, Any

import typer

from edgetwin.cli.common import (
    JsonOpt,
    SeedOpt,
    app,
    emit_json,
    json_default,
    out,
    out_dir_arg,
    out_file_arg,
    rounds_option,
)
from edgetwin.contract.errors import InputError

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
        out_file.write_text(json.dumps(res.to_dict(), indent=2, default=json_default))
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
    response_model: Annotated[
        str, typer.Option(help="twin-coordinator: mail | bc | causal (invariant across the logs' policy ids; "
                          "sites send per-policy sums and gradients, docs/federation.md).")
    ] = "mail",
    keys: Annotated[
        Path | None,
        typer.Option(help="Keys directory (`edgetwin agent-keys`): every party's *.pub.pem and this agent's "
                     "*.key.pem; its messages are signed, others' checked (default: $EDGETWIN_FEDERATION_KEYS). "
                     "Required on a NATS bus: without it (or --insecure) the agent refuses to start, exit 2."),
    ] = None,
    insecure: Annotated[
        bool,
        typer.Option("--insecure", help="Run without keys on a NATS bus: unauthenticated, so anyone who reaches "
                     "the bus can speak for any party (said in one warning line). For trials only."),
    ] = False,
    min_agents: Annotated[
        int, typer.Option(min=1, help="twin-site: every statistic this site sends is an aggregate over at least "
                          "this many agents (docs/federation.md).")
    ] = 10,
    seed: Annotated[
        int, typer.Option("--seed", help="twin-coordinator: seed of the federated fit (the sites draw from the "
                          "plan it sends; the same seed gives the same twin). esa / coa / gca take --config's.")
    ] = 0,
) -> None:
    """Run one MA-FL agent until its federation closes; prints one JSON line per event.

    ``--fit-twin LOCAL_LOG`` runs one site's side of a federated twin fit (`twin-site`, the default
    role); ``twin-coordinator`` assembles and saves the twin (docs/federation.md).

    Every message is signed with this agent's key and every received one checked: an agent on a
    NATS bus needs ``--keys DIR`` (or $EDGETWIN_FEDERATION_KEYS; `edgetwin agent-keys` makes one) and
    refuses to start without it (exit 2), unless ``--insecure`` (unauthenticated, one warning line).
    """
    import asyncio

    import torch

    torch.set_num_threads(1)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {role} %(name)s %(levelname)s %(message)s")
    if keys is not None:
        import os

        from edgetwin.edge.message_auth import KEYS_ENV

        if not keys.is_dir():
            raise InputError("no such keys directory", str(keys))
        os.environ[KEYS_ENV] = str(keys)  # read where each agent's bus is made (run_agent, run_twin_*)
    from edgetwin.edge.message_auth import refuse_without_keys

    if role not in ("esa", "coa", "gca", "twin-site", "twin-coordinator"):
        raise InputError(f"role must be esa, coa, gca, twin-site or twin-coordinator, got {role!r}", "ROLE")
    refuse_without_keys(f"edgetwin agent {role}", bus, insecure)  # before any slow work (reading a log)
    if role in ("twin-site", "twin-coordinator") or fit_twin is not None:
        _twin_agent(role, bus, name, fit_twin, spec, fit_id, sites, out_dir, fed_rounds, members, min_agents,
                    insecure, response_model, seed)
        return
    from edgetwin.federation.runner import FederationConfig, run_agent

    if config is None:
        raise InputError(f"an {role} needs --config", "--config")
    if role in ("esa", "coa") and name is None:
        raise InputError(f"an {role} needs --name (its site or group)", "--name")
    cfg = FederationConfig.load(config)

    def emit(ev: dict[str, Any]) -> None:
        print(json.dumps(ev, default=json_default), flush=True)

    doc = asyncio.run(run_agent(role, cfg, bus, name=name, state_dir=state_dir, result_path=result, emit=emit,
                                insecure=insecure))
    emit({"event": "done", "agent": role if name is None else f"{role}/{name}",
          "rounds": len(doc.get("records", doc.get("rounds", [])))})


def _twin_agent(role: str, bus: str, name: str | None, fit_twin: Path | None, spec: Path | None, fit_id: str,
                sites: str | None, out_dir: Path | None, rounds: int | None, members: int, min_agents: int = 10,
                insecure: bool = False, response_model: str = "mail", seed: int = 0) -> None:
    """`edgetwin agent --fit-twin LOG` (one site) and `edgetwin agent twin-coordinator` (the twin)."""
    import asyncio

    from edgetwin.contract.spec import TwinSpec
    from edgetwin.federation.twin.fit import FitOptions
    from edgetwin.federation.twin.runner import run_twin_coordinator, run_twin_site
    from edgetwin.twin.twin import load_log

    def emit(ev: dict[str, Any]) -> None:
        print(json.dumps(ev, default=json_default), flush=True)

    if role != "twin-coordinator":
        if fit_twin is None:
            raise InputError("a twin-site needs --fit-twin LOCAL_LOG", "--fit-twin")
        df, sp = load_log(fit_twin, spec)
        site = name or (str(df["site"].iloc[0]) if df["site"].nunique() == 1 else None)
        if site is None:
            raise InputError("the log has several sites; name this one with --name", "--name")
        n = asyncio.run(run_twin_site(df, sp, bus, site, fit_id, emit=emit, min_agents=min_agents, insecure=insecure))
        emit({"event": "done", "agent": f"twin-site/{site}", "answered": n})
        return
    if spec is None or sites is None or out_dir is None:
        raise InputError("a twin-coordinator needs --spec, --sites and --out", "--sites")
    out_dir_arg(out_dir)
    names = [s.strip() for s in sites.split(",") if s.strip()]
    twin, rep = asyncio.run(run_twin_coordinator(TwinSpec.load(spec), names, bus, fit_id,
                                                 FitOptions(members=members, response_model=response_model,
                                                            seed=seed, **rounds_option(rounds)),
                                                 insecure=insecure, on_round=emit))
    twin.save(out_dir)
    signed_by = _sign_as_coordinator(out_dir)
    emit({"event": "done", "agent": "twin-coordinator", "twin": str(out_dir), "bytes_up": rep.bytes_up,
          "bytes_down": rep.bytes_down, "rounds": len(rep.rounds), "signed_by": signed_by})


def _sign_as_coordinator(out_dir: Path) -> str | None:
    """The federated twin leaves the coordinator signed by it: with a keys directory holding the
    coordinator's private key (`KEYS_ENV`, ``--keys``), the saved twin gets its SIGNATURE.json under that
    key, so a site (or anyone) checks it with the coordinator's public key (``--trust``). Returns the
    key id, or None when the coordinator runs without its key (``--insecure``, already warned, or the
    in-process ``memory`` bus)."""
    import os

    from edgetwin.edge.message_auth import KEYS_ENV, FederationKeys
    from edgetwin.edge.signed_dirs import sign_directory
    from edgetwin.federation.twin.runner import COORDINATOR

    directory = os.environ.get(KEYS_ENV)
    if not directory:
        return None
    signer = FederationKeys.load(directory, own=[COORDINATOR]).private[COORDINATOR]
    sign_directory(out_dir, "twin", signer, {"publisher": signer.key_id, "role": COORDINATOR})
    return str(signer.key_id)


@app.command("agent-keys")
def agent_keys(
    identities: Annotated[list[str], typer.Argument(help="The parties: twin/coordinator and each site's name "
                                                    "(twin fit); agg/<group> and esa/<site> (edgetwin federate).")],
    out_dir: Annotated[Path, typer.Option("--out", help="The keys directory to write.")],
) -> None:
    """Make a keys directory for a federation: one Ed25519 pair per party. Copy every *.pub.pem to
    every machine and each *.key.pem only to the machine of its party; point `edgetwin agent --keys`
    (or $EDGETWIN_FEDERATION_KEYS) at it (docs/bus.md, "Authenticated senders")."""
    from edgetwin.edge.message_auth import write_keys

    d = write_keys(out_dir, identities)
    out.print(f"{len(identities)} key pairs written to {d}")
