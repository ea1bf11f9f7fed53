"""An edge runtime driven over the bus: signed canary commands, the system's outcome reports, status.

`CanaryCommands` subscribes (`_subscribe_canary`, called by `EdgeRuntime.start` when it has a bus):

- durably to `edgetwin.edge.canary_command.command_subject` (consumer `command_durable_name`):
  a ``canary_start`` runs only when signed by a key of the runtime's trust store, naming a version
  its registry holds with the digest the command names, while it serves the command's
  ``current`` (when named) and no other run is active; a ``canary_stop`` of the running run stops
  it. Anything else is refused with ONE log line (WARNING, ``canary command refused (<reason>)``)
  and a count in ``stats.canary_refused`` (``/metrics``: ``edgetwin_canary_commands_refused_total``);
  the fleet stays on its current policy.
- durably to `outcome_subject` (consumer `outcome_durable_name`): each ``canary_outcome`` tick is
  joined with the decisions made for it (`edgetwin.edge.canary_join`), its rows of the run's slice
  kept (a system reports every group; the others are the fleet's own log), spooled by
  `canary_report` *before* the handler returns (the durable subscription acknowledges only then:
  a runtime killed mid-tick gets the report again), judged by the guard, and shipped as a log
  segment. A tick reported twice is joined once (`Canary.ticks_seen`).
- `status_subject` (request/reply): the `CanaryStatus` of the last run.

Outcome reports, like ``kpi_report``, must be authenticated (`_authentic_report`).

A command-started run's signed command is kept in its spool directory (``command.json``); a runtime
restarted on the same cache directory after dying mid-run resumes it (`_resume_runs`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pandas as pd

from edgetwin.contract.errors import InputError
from edgetwin.edge.bus import Received
from edgetwin.edge.canary import Canary
from edgetwin.edge.canary_command import (
    KIND_OUTCOME,
    KIND_START,
    KIND_STOP,
    CanaryStart,
    CanaryStatus,
    CanaryStop,
    CommandRefused,
    command_durable_name,
    command_subject,
    outcome_durable_name,
    outcome_rows,
    outcome_subject,
    status_reply,
    status_subject,
    verify_command,
)
from edgetwin.edge.messages import Envelope
from edgetwin.edge.registry import RegistryError, VersionNotFound
from edgetwin.edge.runtime_canary import CanaryRouting
from edgetwin.edge.runtime_core import _atomic_write

log = logging.getLogger("edgetwin.runtime")


def _in_slice(canary: Canary, rows: pd.DataFrame) -> pd.DataFrame:
    """The joined rows of the run's slice (its candidate and control arms, pre-period included):
    the canary log is the slice's, as `canary_report`'s rows are; the groups outside it are
    the fleet's ordinary log, which the system keeps."""
    if not len(rows):
        return rows
    scen = rows["scenario"].astype(str).tolist() if "scenario" in rows.columns else None
    arms = canary.router.arms(rows["agent"].astype(str).tolist(), rows["site"].astype(str).tolist(), scen)
    return rows[arms != "fleet"].reset_index(drop=True)


class CanaryCommands(CanaryRouting):
    """Canary commands, outcome reports and status over the bus (see the module docstring)."""

    async def _subscribe_canary(self) -> None:
        assert self.bus is not None
        self._subs.append(await self.bus.subscribe_durable(command_subject(), command_durable_name(self.site),
                                                           self._on_command))  # fmt: skip
        self._subs.append(await self.bus.subscribe_durable(outcome_subject(self.site), outcome_durable_name(self.site),
                                                           self._on_outcome))  # fmt: skip
        self._subs.append(await self.bus.serve(status_subject(self.site), self._on_status))

    # ---------------------------------------------------------------- commands
    def _refuse_command(self, e: CommandRefused, env: Envelope) -> None:
        self.stats.canary_refused[e.reason] += 1
        a = self._active
        log.warning("%s: canary command refused (%s): %s; from %r; serving %s", self.site, e.reason, e.detail,
                    env.sender, a.version if a else "nothing yet")  # fmt: skip
        self._event("canary_refused", None, "canary", f"{e.reason}: {e.detail}")

    async def _on_command(self, rcv: Received) -> None:
        env = rcv.envelope
        if env.kind not in (KIND_START, KIND_STOP):
            return
        try:
            cmd = verify_command(env, self.trust)
            if not cmd.for_site(self.site):
                return
            if isinstance(cmd, CanaryStart):
                await self._accept_start(cmd, env)
            else:
                self._accept_stop(cmd)
        except CommandRefused as e:
            self._refuse_command(e, env)

    def _run_dir(self, run: str) -> Path:
        return self.cache_dir / "canary" / run

    async def _accept_start(self, cmd: CanaryStart, env: Envelope) -> None:
        """Run a verified start, or raise `CommandRefused`; a redelivered start of the run already
        running here is a no-op. `RegistryError` (registry unreachable) propagates: the durable
        subscription then redelivers the command later."""
        c = self._canary
        if c is not None and c.run_id == cmd.run and c.active:
            return  # the same command again (a redelivery, or a replay of the one we run)
        if (self._run_dir(cmd.run) / "stopped.json").exists():
            raise CommandRefused("finished", f"run {cmd.run} already ended here")
        if c is not None and c.active:
            raise CommandRefused("busy", f"run {c.run_id} is still running here")
        a = self._active
        if a is None:
            raise CommandRefused("not_current", "this site serves no policy yet")
        if cmd.current and a.version != cmd.current:
            raise CommandRefused("not_current", f"the command expects {cmd.current!r} served, this site serves {a.version!r}")
        try:
            record = await self._call(self._areg.manifest(cmd.candidate))
        except VersionNotFound:
            raise CommandRefused("unknown_version", f"the registry holds no version {cmd.candidate!r}") from None
        if record.sha256 != cmd.sha256:
            raise CommandRefused("digest_mismatch", f"{cmd.candidate} in the registry is sha256 {record.sha256[:12]}..., "
                                 f"the command names {cmd.sha256[:12]}...")  # fmt: skip
        try:
            await self.start_canary(cmd.config(), run_id=cmd.run, sha256=cmd.sha256, join=True)
        except RegistryError:
            raise
        except InputError as e:
            raise CommandRefused("invalid", str(e)) from None
        _atomic_write(self._run_dir(cmd.run) / "command.json", json.dumps({"kind": env.kind, "payload": env.payload}).encode())
        self.stats.canary_accepted += 1
        log.info("%s: canary command %s accepted (signed by key %s)", self.site, cmd.run, env.payload.get("key_id"))

    def _accept_stop(self, cmd: CanaryStop) -> None:
        c = self._canary
        if c is not None and c.run_id == cmd.run:
            if c.active:
                self._end_canary(cmd.reason, None)
            return
        if (self._run_dir(cmd.run) / "stopped.json").exists():
            return  # already ended here: a stop is idempotent
        raise CommandRefused("unknown_run", f"run {cmd.run} is not running here")

    async def _resume_runs(self) -> None:
        """Resume a command-started run this cache directory holds unfinished (a runtime that died
        mid-run); one that cannot be resumed ends with reason ``runtime``."""
        root = self.cache_dir / "canary"
        for d in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
            f = d / "command.json"
            if not f.is_file() or (d / "stopped.json").exists():
                continue
            try:
                cmd = CanaryStart.from_payload(json.loads(f.read_text())["payload"])
                a = self._active
                if a is None or (cmd.current and a.version != cmd.current):
                    raise InputError(f"this site now serves {a.version if a else 'nothing'}", where="canary resume")
                await self.start_canary(cmd.config(), run_id=cmd.run, sha256=cmd.sha256, join=True)
                log.info("%s: canary %s resumed from its spool (%d ticks)", self.site, cmd.run, self._canary.ticks
                         if self._canary else 0)  # fmt: skip
            except Exception as e:  # resuming is best effort: the run then ends, its log kept
                log.warning("%s: canary %s cannot be resumed (%s); it ends (runtime)", self.site, d.name, e)
                _atomic_write(d / "stopped.json", json.dumps({"reason": "runtime"}).encode())

    # ---------------------------------------------------------------- outcomes
    def _reject_report(self, kind: str, reason: str, detail: str) -> None:
        self.stats.reports_rejected[f"{kind}:{reason}"] += 1
        log.warning("%s: %s not used (%s): %s", self.site, kind, reason, detail)

    async def _on_outcome(self, rcv: Received) -> None:
        env = rcv.envelope
        if env.kind != KIND_OUTCOME:
            return
        if not self._authentic_report(env):
            return
        if env.payload["site"] != self.site:
            self._reject_report(KIND_OUTCOME, "other_site", f"rows of site {env.payload['site']!r}")
            return
        c, book = self._canary, self._book
        t = int(env.payload["t"])
        if c is None or not c.active or book is None or env.payload.get("run", c.run_id) != c.run_id:
            self.stats.reports_rejected[f"{KIND_OUTCOME}:no_run"] += 1  # outside a run: not the canary's rows
            return
        if t in c.ticks_seen:
            self.stats.reports_rejected[f"{KIND_OUTCOME}:duplicate"] += 1
            return
        try:
            rows = outcome_rows(env)
            joined = book.join(t, rows, episode=f"{c.run_id}-{self.site}")
            self.stats.decisions_unjoined += joined.decisions_unmatched
            self.stats.outcomes_unjoined += joined.outcomes_unmatched
            rows = _in_slice(c, joined.rows)
            if len(rows):
                self.canary_report(rows)  # spooled before this returns, i.e. before the ack
        except InputError as e:
            self._reject_report(KIND_OUTCOME, "invalid", str(e))

    # ---------------------------------------------------------------- status
    def canary_status(self) -> CanaryStatus:
        """The `CanaryStatus` of the last run here (``phase`` ``idle`` when none)."""
        c = self._canary
        st = CanaryStatus(self.site, refused=dict(self.stats.canary_refused))
        if c is None:
            return st
        st.run, st.candidate, st.current = c.run_id, c.config.candidate, c.current
        st.phase = "stopped" if not c.active else "pre" if c.in_pre_period else "running"
        st.ticks, st.planned_ticks = c.ticks, c.config.total_ticks
        st.arms = {k: len(v) for k, v in c._arm_groups.items()}
        st.guard = {"intervals": c.guard.intervals(), "stop": c.guard_stop.to_dict() if c.guard_stop else None}
        st.loss = c.loss_so_far()
        st.stop_reason = c.stop_reason
        segs = sorted(c.dir.glob("seg-*.parquet")) if c.dir.exists() else []
        st.segments = len(segs)
        st.shipped = sum(1 for p in segs if p.with_suffix(".shipped").exists())
        st.unjoined = {"decisions": self.stats.decisions_unjoined, "outcomes": self.stats.outcomes_unjoined}
        return st

    async def _on_status(self, rcv: Received) -> Envelope:
        run = rcv.envelope.payload.get("run", "")
        st = self.canary_status()
        if run and st.run != run:
            done = self._run_dir(run) / "stopped.json"
            st = CanaryStatus(self.site, run=run, phase="stopped" if done.exists() else "idle",
                              stop_reason=json.loads(done.read_text()).get("reason") if done.exists() else None,
                              refused=st.refused)  # fmt: skip
        return status_reply(st, self.name)
