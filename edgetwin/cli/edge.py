"""``edgetwin serve``: the edge runtime."""

from __future__ import annotations

import json
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

import typer

from edgetwin.cli.common import (
    BucketOpt,
    JsonOpt,
    RegistryOpt,
    app,
    emit_json,
    out,
)
from edgetwin.contract.errors import InputError


@dataclass(frozen=True)
class ServeConfig:
    """``edgetwin serve --config FILE``: a site's settings set once and kept in a file (a TOML file of
    these keys; a missing key keeps its default), so that the command keeps to the options every
    start sets.

    Attributes:
        cluster: the site's cluster (fallback scope ``cluster/<C>``; default none).
        probation: KPI reports during which a new version is judged, then accepted.
        baseline: what the KPI watch compares with: ``auto | previous | metadata | first_window``
            (`edgetwin.edge.kpi_watch.KPIGuard`, which checks it).
    """

    cluster: str | None = None
    probation: int = 100
    baseline: str = "auto"

    def __post_init__(self) -> None:
        if self.probation < 0:
            raise ValueError(f"probation: expected >= 0, got {self.probation}")

    @classmethod
    def load(cls, path: Path | None) -> ServeConfig:
        from edgetwin.loop.fleet import load_toml_config

        return cls() if path is None else load_toml_config(path, cls, "--config")  # type: ignore[no-any-return]


def _shield_config(path: Path | None) -> Any:
    """``--shield``: the `ShieldConfig` of a JSON file, or None; a bad file is one line, exit 2."""
    if path is None:
        return None
    from edgetwin.policies.shield import ShieldConfig

    try:
        return ShieldConfig.from_dict(json.loads(path.read_text()))
    except (OSError, ValueError) as e:
        raise InputError(f"expected a JSON shield configuration ({e})", str(path)) from None


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
    poll: Annotated[float, typer.Option("--poll", help="Seconds between registry polls.")] = 2.0,
    cache_dir: Annotated[
        Path | None,
        typer.Option("--cache-dir", help="Verified last good policies (fail-static restarts); default ~/.cache/edgetwin/runtime/<S>."),
    ] = None,
    reporters: Annotated[
        Path | None,
        typer.Option("--reporters", help="Keys directory (*.pub.pem, one per identity, e.g. from `edgetwin agent-keys`) of "
                     "the systems whose signed kpi_report / canary_outcome messages are used; without it every "
                     "report arriving over NATS is refused and counted."),
    ] = None,
    bucket: BucketOpt = "edgetwin",
    metrics_port: Annotated[
        int, typer.Option("--metrics-port", min=0, max=65535, help="Serve Prometheus /metrics on this port (0: off); see docs/bus.md, \"Metrics\".")
    ] = 0,
    metrics_addr: Annotated[
        str, typer.Option("--metrics-addr", help="Address /metrics listens on (0.0.0.0 for a Prometheus on another host).")
    ] = "127.0.0.1",
    duration: Annotated[float, typer.Option(help="Stop after this many seconds (0: run until interrupted).")] = 0.0,
    log_level: Annotated[str, typer.Option("--log-level", help="DEBUG, INFO, WARNING.")] = "INFO",
    config: Annotated[
        Path | None,
        typer.Option("--config", help="TOML of the site's rarely changed settings (ServeConfig: cluster, probation, "
                     "baseline); a missing key keeps its default."),
    ] = None,
    as_json: JsonOpt = False,
) -> None:
    """Run the edge runtime: serve the site's current signed policy until interrupted.

    Decisions over the bus (request/reply on edgetwin.decision.<S>: the edgetwin frame, or a JSON / Arrow IPC body from any NATS client, see docs/bus.md; rows naming their service groups are served by their canary arm) and live KPIs on edgetwin.kpi.<S> (signed by a --reporters identity); canaries started and stopped by signed commands on edgetwin.canary.command, fed by the system's outcome rows on edgetwin.canary.outcome.<S>, status on edgetwin.status.canary.<S>; hot-swaps on promotion, keeps the last good policy when the registry or the bus is down, and rolls back when a guarded KPI regresses (notice on edgetwin.policy.rollback.<S>).
    """
    import asyncio
    import contextlib
    import re
    import signal

    cfg = ServeConfig.load(config)
    cluster, probation, baseline = cfg.cluster, cfg.probation, cfg.baseline

    from edgetwin.edge.canary_command import command_subject, outcome_subject, status_subject
    from edgetwin.edge.kpi_watch import KPIGuard, KPIMargin
    from edgetwin.edge.registry import open_async_registry
    from edgetwin.edge.runtime import EdgeRuntime
    from edgetwin.edge.signing import TrustStore

    for flag, name in (("--site", site), ("--config cluster", cluster)):
        if name is not None and not re.fullmatch(r"[A-Za-z0-9_\-]{1,64}", name):
            raise InputError(f"expected 1-64 letters, digits, '_' or '-', got {name!r}", flag)
    if log_level.upper() not in ("DEBUG", "INFO", "WARNING", "ERROR"):
        raise InputError(f"expected DEBUG, INFO, WARNING or ERROR, got {log_level!r}", "--log-level")
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if poll <= 0 or duration < 0:
        raise InputError("--poll must be > 0 and --duration >= 0", "--poll/--duration")
    store = TrustStore.from_paths(trust)
    from edgetwin.edge.message_auth import Keyring

    reporter_keys = Keyring.from_dir(reporters) if reporters is not None else None
    shield_cfg = _shield_config(shield)
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
                cluster=cluster, poll_interval=poll, cache_dir=cache, freeze_gc=True, reporters=reporter_keys,
            )  # fmt: skip
            metrics_server = None
            if metrics_port:
                from edgetwin.edge.metrics import instrument, serve_metrics

                try:
                    metrics_server, _ = serve_metrics(instrument(rt), metrics_port, metrics_addr)
                except OSError as e:
                    raise InputError(f"cannot listen on {metrics_addr}:{metrics_port} ({e.strerror or e})", "--metrics-port") from None
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
                    f"canary commands on {command_subject()} (signed by a --trust key), outcomes on "
                    f"{outcome_subject(site)}, status on {status_subject(site)}; "
                    + (f"metrics on http://{metrics_addr}:{metrics_port}/metrics; " if metrics_port else "")
                    + (f"stopping after {duration:g}s" if duration else "Ctrl-C to stop"),
                    highlight=False, soft_wrap=True,
                )  # fmt: skip
                try:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), duration or None)
                finally:
                    if metrics_server is not None:
                        metrics_server.shutdown()
                return {**rt.status(), "canary": rt.canary_status().to_dict()}

    status = asyncio.run(run())
    if as_json:
        emit_json(status)
    else:
        out.print(
            f"edgetwin serve: stopped; served {status['stats']['decisions']} decisions "
            f"({status['stats']['rows']} rows), {status['stats']['rollbacks']} rollbacks, now {status['version']}",
            highlight=False, soft_wrap=True,
        )  # fmt: skip


