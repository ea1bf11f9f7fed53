"""Live KPIs and rollback for the edge runtime: the watch, the local switch, the registry, the notice."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping

from edgetwin.contract.errors import InputError
from edgetwin.edge.bus import Received
from edgetwin.edge.kpi_watch import Breach
from edgetwin.edge.messages import Envelope
from edgetwin.edge.runtime_core import ServedPolicy
from edgetwin.edge.runtime_messages import rollback_subject
from edgetwin.edge.runtime_registry import RegistryFollower

log = logging.getLogger("edgetwin.runtime")


class KPIRollback(RegistryFollower):
    """The live KPI watch and the rollback it triggers (locally, in the registry, on the bus)."""

    def report_kpis(self, kpis: Mapping[str, float], *, version: str | None = None) -> Breach | None:
        """Feed one live KPI report (name -> value, e.g. means over the last control period).

        Args:
            kpis: the KPIs; names as in the guard (others are ignored).
            version: the version whose decisions produced them; a report for another version than
                the one served is ignored (it arrived after a swap). None: the served version.

        Returns:
            The `Breach` if this report triggered a rollback (already under way: the served policy
            is switched before this returns when the previous version is in memory).
        """
        bad = {
            k: v
            for k, v in kpis.items()
            if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)
        }
        if bad:
            raise InputError(f"KPI values must be finite numbers, got {bad}", where="kpis")
        with self._state_lock:
            a = self._active
            if self.watch is None or a is None:
                return None
            if version is not None and version != a.version:
                self.stats.kpi_stale += 1
                return None
            self.stats.kpi_reports += 1
            if self.metrics is not None:
                self.metrics.observe_kpis(kpis, a.version, arm="fleet")
            was_accepted = self.watch.accepted
            breach = self.watch.observe(kpis)
            if breach is None:
                if self.watch.accepted and not was_accepted and self.watch.judging:
                    log.info("%s: %s passed its probation (%d KPI reports); accepted", self.site, a.version, self.watch.reports)
                    self._event("accepted", a.version, a.scope, f"{self.watch.reports} reports within margins")
                return None
            self._rollback_locally(a, breach)
        if self._loop is not None:
            self.call_soon(self._rollback_in_registry(a, breach))
        return breach

    async def _on_kpi_report(self, rcv: Received) -> None:
        env = rcv.envelope
        if env.kind != "kpi_report" or env.payload.get("site") != self.site:
            return
        self.report_kpis(env.payload["kpis"], version=env.payload.get("version"))

    def _rollback_locally(self, bad: ServedPolicy, breach: Breach) -> None:
        """Stop serving ``bad`` now: switch to the version it replaced when we still hold it."""
        self.stats.rollbacks += 1
        prev = self._previous
        self._vetoed = (bad.scope, bad.version, bad.revision, bad.manifest.sha256)
        self._pending_rollback = (bad.scope, bad.version, breach.reason())
        if prev is not None and prev is not bad and prev.version != bad.version:
            self._activate(prev, "rollback", f"local rollback from {bad.version}")
        else:
            log.error(
                "%s: %s regressed but no earlier version is in memory; still serving it until the registry rolls back",
                self.site,
                bad.version,
            )
        log.warning("%s: KPI regression, rolling back %s: %s", self.site, bad.version, breach.reason())
        self._event("rollback", bad.version, bad.scope, breach.reason())

    async def _rollback_in_registry(self, bad: ServedPolicy, breach: Breach) -> None:
        outcome, target = "pending", self._previous.version if self._previous else bad.version
        try:
            async with self._refresh_lock:  # type: ignore[union-attr]
                pending = self._pending_rollback
                if pending is not None and pending[1] == bad.version:
                    outcome, target = await self._registry_rollback(bad.scope, bad.version, breach.reason())
                elif self._rollback_outcomes.get(bad.version) is not None:
                    outcome, target = self._rollback_outcomes[bad.version]  # a poll already did it
            if outcome != "pending":
                await self.refresh()  # load the registry's target if it differs from our local one
        except Exception as e:
            self._registry_down(e)
        await self._publish_rollback(bad, target, breach, outcome)

    async def _publish_rollback(self, bad: ServedPolicy, target: str, breach: Breach, outcome: str) -> None:
        if self.bus is None:
            return
        env = Envelope(
            kind="policy_rollback",
            sender=self.name,
            payload={
                "site": self.site,
                "scope": bad.scope,
                "from_version": bad.version,
                "to_version": target,
                "reason": breach.reason(),
                "kpis": breach.kpis,
                "registry": outcome,
            },
        )
        try:
            await self.bus.publish_durable(rollback_subject(self.site), env)
        except Exception as e:  # the bus may be down too: the log line above already says why
            log.warning("%s: could not publish the rollback notice: %r", self.site, e)
