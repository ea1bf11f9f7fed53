"""Live KPIs and rollback for the edge runtime: the watch, the local switch, the registry, the notice."""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import TwinSpec
from edgetwin.edge.bus import InMemoryBus, Received
from edgetwin.edge.kpi_watch import Breach
from edgetwin.edge.message_auth import MessageAuth
from edgetwin.edge.messages import Envelope, MessageRejected
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
            declared = self.declared_kpis()
            known = {k: v for k, v in kpis.items() if k in declared}
            self.stats.kpis_undeclared += len(kpis) - len(known)
            if self.metrics is not None and known:  # only declared KPIs become /metrics series
                self.metrics.observe_kpis(known, a.version, arm="fleet")
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

    def declared_kpis(self) -> frozenset[str]:
        """The KPI names that may become ``/metrics`` series: the served policy's spec's (or the
        runtime's) ``kpi.*`` columns and the guard's KPIs. A report's other names are dropped and
        counted (``stats.kpis_undeclared``): a sender must not be able to mint series (issue 45
        item 8: 20,000 new names made 20,001 series)."""
        names: set[str] = set()
        a = self._active
        for spec in (getattr(a.policy, "spec", None) if a else None, self.spec):
            if isinstance(spec, TwinSpec):
                names.update(spec.names("kpi"))
        if self.guard is not None and self.guard.margins is not None:
            names.update(m.kpi for m in self.guard.margins)
        return frozenset(names)

    def _authentic_report(self, env: Envelope) -> bool:
        """Whether a report (``kpi_report``, ``canary_outcome``) from the bus may be used: signed by
        an identity of ``reporters`` (`edgetwin.edge.message_auth`: the sender's Ed25519 key), or
        verified by the bus itself (``bus.auth``). Without either, only the in-process bus is
        trusted (nothing outside the process reaches it); on NATS an unsigned report is refused.
        A refusal is counted (``stats.reports_rejected["<kind>:unauthenticated"]``) and logged."""
        if self.bus is not None and self.bus.auth is not None:
            return True  # the bus verified env.sender's signature before any handler saw it
        if self.reporters is not None:
            try:
                MessageAuth(self.reporters).verify(env)
                return True
            except MessageRejected as e:
                self._count_unauthentic(env, str(e))
                return False
        if isinstance(self.bus, InMemoryBus):
            return True
        self._count_unauthentic(env, f"from {env.sender!r}: this runtime has no reporter keys (edgetwin serve --reporters)")
        return False

    def _count_unauthentic(self, env: Envelope, detail: str) -> None:
        key = f"{env.kind}:unauthenticated"
        self.stats.reports_rejected[key] += 1
        if self.stats.reports_rejected[key] in (1, 10, 100, 1000) or self.stats.reports_rejected[key] % 10000 == 0:
            log.warning("%s: %s refused (unauthenticated, %d so far): %s", self.site, env.kind,
                        self.stats.reports_rejected[key], detail)  # fmt: skip

    async def _on_kpi_report(self, rcv: Received) -> None:
        env = rcv.envelope
        if env.kind != "kpi_report" or env.payload.get("site") != self.site:
            return
        if not self._authentic_report(env):
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
