"""A canary at the edge runtime: the slice's arms served, the log spooled and shipped, the run ended.

See `edgetwin.edge.canary` for the canary itself (its order, guard, log and durability).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import numpy as np

from edgetwin.contract.errors import InputError
from edgetwin.edge.canary import (
    Canary,
    CanaryConfig,
    CanaryResult,
    RoutedDecision,
    canary_log_subject,
    segment_envelope,
    unshipped_segments,
)
from edgetwin.edge.canary_guard import GuardStop
from edgetwin.edge.canary_join import DecisionBook
from edgetwin.edge.canary_switchback import SwitchbackRouter, block_index
from edgetwin.edge.registry import (
    VersionNotFound,
)
from edgetwin.edge.runtime_core import NoPolicyLoaded, ServedPolicy, _atomic_write, _Incompatible
from edgetwin.edge.runtime_serving import Serving
from edgetwin.edge.signing import ArtifactRejected

log = logging.getLogger("edgetwin.runtime")


class CanaryRouting(Serving):
    """A canary at this site: its arms, its log spooled and shipped, its end."""

    _canary: Canary | None
    _canary_policy: ServedPolicy | None
    _canary_final: CanaryResult | None
    _ship_lock: asyncio.Lock | None
    #: the decisions of a command-started run awaiting their outcome reports (None: no join; a
    #: canary driven from Python reports its own rows with `canary_report`)
    _book: DecisionBook | None = None

    @property
    def canary(self) -> Canary | None:
        """The last canary started here (active or ended), or None."""
        return self._canary

    async def start_canary(
        self, config: CanaryConfig, *, run_id: str | None = None, sha256: str | None = None, join: bool = False
    ) -> Canary:
        """Serve ``config.candidate`` to the candidate arm of ``config.slice`` (`edgetwin.edge.canary`).

        The candidate is fetched from the registry and verified, unpacked, loaded and warmed up
        like any version; the current policy keeps serving everyone else.

        Args:
            run_id: the run's id (default: a fresh one); a spool directory of that run already
                on disk is resumed (`Canary`).
            sha256: the candidate artifact's digest the order names: other bytes are refused.
            join: keep the decisions `decide_for` makes, to join them with the outcome reports of
                the system (`edgetwin.edge.canary_join`; a run started by a command).

        Raises:
            InputError: no current policy, a canary already running, the candidate not in the
                registry, refused (its reason), other bytes than ``sha256``, or the current version
                itself.
        """
        a = self._active
        if a is None:
            raise InputError(f"site {self.site!r} serves no policy yet: nothing to compare a canary with", where="canary")
        if self._canary is not None and self._canary.active:
            raise InputError(f"canary {self._canary.config.canary_id} is still running", where="canary")
        if config.candidate == a.version:
            raise InputError(f"the candidate {config.candidate!r} is the version already served", where="canary")
        try:
            packed, manifest = await self._call(self._areg._load(config.candidate))
        except VersionNotFound as e:
            raise InputError(f"candidate {config.candidate!r} is not in the registry ({e})", where="canary") from None
        if sha256 is not None and manifest.sha256 != sha256:
            raise InputError(f"candidate {config.candidate!r} in the registry has sha256 {manifest.sha256[:12]}..., the "
                             f"order names {sha256[:12]}...", where="canary")  # fmt: skip
        try:
            served = await asyncio.to_thread(self._prepare, config.candidate, "canary", 0, packed, manifest)
        except (ArtifactRejected, _Incompatible) as e:
            reason = e.reason.value if isinstance(e, ArtifactRejected) else "incompatible"
            raise InputError(
                f"candidate {config.candidate!r} refused: {reason}: {getattr(e, 'detail', e)}", where="canary"
            ) from None
        canary = Canary(config, a.version, self.cache_dir / "canary", run_id=run_id)
        book = DecisionBook(a.observation_columns, a.action_columns) if join else None
        with self._state_lock:
            self._canary, self._canary_policy, self._book = canary, served, book
        if not canary.active:  # a resumed run that had ended: nothing to serve
            self._end_canary(canary.stop_reason or "runtime", canary.guard_stop)
            return canary
        log.info(
            "%s: canary %s: %s on %s (treat share %.0f%%) for %d ticks, guarding %s; current %s elsewhere",
            self.site, config.canary_id, config.candidate, _describe_slice(config), 100 * config.slice.treat_share,
            config.ticks, ", ".join(m.describe() for m in config.margins), a.version,
        )  # fmt: skip
        self._event("canary_started", config.candidate, "canary", config.canary_id)
        return canary

    def decide_for(
        self, obs: np.ndarray, agents: Any, sites: Any = None, scenarios: Any = None, t: int | None = None
    ) -> RoutedDecision:
        """Actions for N rows of named service groups, each served by its canary arm.

        Args:
            obs: (N, O) observations.
            agents: (N,) the groups' ids (the log's ``agent``); sites, scenarios: (N,) theirs, or None.
            t: the tick these decisions are for (the key the system's outcome report joins on);
                None: the tick the running canary expects next (the ticks it has joined so far).

        Returns:
            `RoutedDecision`: actions (N, A), and per row the policy (registry version) that
            decided it, the probability of its action and its arm. Without an active canary every
            row is the current policy's (arm ``"fleet"``). With a switchback
            (`CanaryConfig.switchback`) the arm is the block's of tick ``t``
            (`edgetwin.edge.canary_switchback`): rows of its sites on ``candidate`` in the
            candidate's blocks and on ``control`` in the others, every row ``fleet`` outside the
            blocks; ``assignment`` is the block's probability (1/2), and the decisions kept for the
            join carry ``tick``, ``block`` (-1 outside) and ``arm_probability``.
        """
        t0 = time.perf_counter()
        x = self._check_obs(obs)
        agent_ids = [str(v) for v in np.asarray(agents, dtype=object).ravel()]
        # rows that do not name their site are this runtime's site's
        site_ids = [self.site] * len(x) if sites is None else [str(v) for v in np.asarray(sites, dtype=object).ravel()]
        scen_ids = None if scenarios is None else [str(v) for v in np.asarray(scenarios, dtype=object).ravel()]
        if len(agent_ids) != len(x) or any(v is not None and len(v) != len(x) for v in (site_ids, scen_ids)):
            raise InputError(f"{len(x)} observations but {len(agent_ids)} agents / sites", where="agents")
        with self._state_lock:  # one consistent view of (current, canary)
            served, canary, cand = self._active, self._canary, self._canary_policy
        if served is None:
            raise NoPolicyLoaded(f"site {self.site!r} has no verified policy yet (scopes {self.scopes}); see the log")
        tick = None if canary is None else canary.ticks if t is None else int(t)
        sb = None if canary is None else canary.config.switchback
        extra: dict[str, Any] | None = None
        block = -1 if sb is None or tick is None else int(block_index(sb, np.array([tick]))[0][0])
        if canary is None or not canary.active or cand is None:
            off = True
        elif isinstance(canary.router, SwitchbackRouter):  # a switchback: the arm is its block's at this tick
            off = block < 0
            arms = canary.router.arms(agent_ids, site_ids, None, t=tick)
        else:
            off = canary.in_pre_period
            arms = canary.router.arms(agent_ids, site_ids, scen_ids)
        if off:
            arms = np.full(len(x), "fleet", dtype=object)
            actions, prop = served.act_logged(x)
            policy = np.full(len(x), served.version, dtype=object)
            assign = np.ones(len(x))
        else:
            assert canary is not None and cand is not None
            on_cand = arms == "candidate"
            actions = np.empty((len(x), len(served.action_columns)))
            prop = np.empty(len(x))
            for pol, mask in ((served, ~on_cand), (cand, on_cand)):
                if mask.any():
                    actions[mask], prop[mask] = pol.act_logged(x[mask])
            policy = canary.router.policy_ids(arms)
            policy[~on_cand] = served.version
            assign = canary.router.assignment_propensity(arms)
        if sb is not None and tick is not None:
            extra = {"tick": np.full(len(x), tick, dtype=np.int64), "block": np.full(len(x), block, dtype=np.int64),
                     "arm_probability": np.asarray(assign, dtype=np.float64)}  # fmt: skip
        book = self._book
        if book is not None and canary is not None and canary.active and tick is not None:
            book.add(tick, agent_ids, site_ids, scen_ids, x, actions, policy, prop, arms, extra)
        with self._stats_lock:
            self.stats.decisions += 1
            self.stats.rows += len(x)
            for v in set(policy.tolist()):  # decisions (calls) a version took part in
                self.stats.by_version[v] += 1
        if self.metrics is not None:
            self.metrics.observe_routed(policy, arms, time.perf_counter() - t0)
        return RoutedDecision(actions, policy, prop, arms, assign)

    def canary_report(self, rows: Any) -> GuardStop | None:
        """One tick of the canary's log: its rows (the log contract with ``policy``, ``propensity``
        and the guarded KPIs), spooled before this returns, then shipped and judged.

        Returns:
            The `GuardStop` when this tick made the guard stop the canary (the slice is already
            back on the current policy when this returns).

        Raises:
            InputError: no canary was started, or rows that cannot be its log.
        """
        canary = self._canary
        if canary is None:
            raise InputError("no canary was started on this runtime", where="canary")
        _, stop = canary.record(rows)
        if self.metrics is not None:
            self.metrics.observe_canary_rows(canary, rows)
        if not canary.active and canary.stop_reason in ("guard", "completed", "budget") and self._canary_policy is not None:
            self._end_canary(canary.stop_reason, stop)
        if self.bus is not None and self._loop is not None:
            self.call_soon(self._ship_spool())
        return stop

    def stop_canary(self, reason: str = "operator") -> CanaryResult:
        """End the canary now (the slice returns to the current policy); its result so far."""
        if self._canary is None:
            raise InputError("no canary was started on this runtime", where="canary")
        if self._canary.active:
            self._end_canary(reason, None)
        return self._canary.result()

    def canary_result(self) -> CanaryResult:
        """The last canary's result (its log: every row reported, shipped or not; also after
        `stop` removed a temporary cache directory)."""
        if self._canary is None:
            raise InputError("no canary was started on this runtime", where="canary")
        if self._canary_final is not None and not self._canary.dir.exists():
            return self._canary_final
        return self._canary.result()

    def _end_canary(self, reason: str, stop: GuardStop | None) -> None:
        canary = self._canary
        assert canary is not None
        with self._state_lock:
            canary.stop(reason)
            self._canary_policy = None  # from here on the slice is served the current policy
            if self._book is not None:
                self.stats.decisions_unjoined += self._book.pending() + self._book.dropped
                self._book = None
        if reason == "guard" and stop is not None:
            log.warning("%s: canary %s stopped by its guard; slice back on %s: %s",
                        self.site, canary.config.canary_id, canary.current, stop.reason())  # fmt: skip
        elif reason == "budget":
            log.warning("%s: canary %s stopped: one more tick would spend more than its loss budget (%s); slice back "
                        "on %s", self.site, canary.config.canary_id, canary.budget_stop, canary.current)  # fmt: skip
        elif reason in ("link", "runtime"):
            log.warning("%s: canary %s stopped (%s); slice back on %s, its log stays spooled in %s until shipped",
                        self.site, canary.config.canary_id, reason, canary.current, canary.dir)  # fmt: skip
        else:
            log.info("%s: canary %s ended (%s) after %d ticks", self.site, canary.config.canary_id, reason, canary.ticks)
        self._event("canary_stopped", canary.config.candidate, "canary", f"{reason}: {stop.reason() if stop else ''}")

    def _spooled(self) -> bool:
        root = self.cache_dir / "canary"
        return root.is_dir() and any(unshipped_segments(d) for d in root.iterdir() if d.is_dir())

    async def _ship_spool(self) -> None:
        """Ship every spooled, unacknowledged canary segment durably, in order; on a failure stop
        the running canary (``link``) and leave the rest spooled for the next attempt."""
        if self.bus is None or self._ship_lock is None:
            return
        async with self._ship_lock:
            root = self.cache_dir / "canary"
            for d in sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []:
                for seg in unshipped_segments(d):
                    env = segment_envelope(self.site, d.name, seg, self.name)
                    try:
                        await asyncio.wait_for(
                            self.bus.publish_durable(canary_log_subject(self.site), env), self.registry_timeout
                        )
                    except Exception as e:  # the link: stop the canary, keep the rows spooled
                        c = self._canary
                        if c is not None and c.active:
                            log.warning("%s: could not ship canary log (%s: %s)", self.site, type(e).__name__, e)
                            self._end_canary("link", None)
                        return
                    _atomic_write(seg.with_suffix(".shipped"), b"")

    def _current_changed(self, version: str) -> None:
        if self._canary is not None and self._canary.active and version != self._canary.current:
            self._end_canary("swapped", None)  # its control arm is no longer the current policy


def _describe_slice(config: CanaryConfig) -> str:
    sl = config.slice
    parts = ([f"{len(sl.agents)} groups"] if sl.agents else []) + ([f"sites {', '.join(sl.sites)}"] if sl.sites else [])
    return " + ".join(parts)
