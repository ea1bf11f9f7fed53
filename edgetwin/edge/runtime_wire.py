"""The edge runtime's decision subject: requests in any wire format answered, errors replied, never raised."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from edgetwin.contract.errors import InputError
from edgetwin.edge import decision_wire
from edgetwin.edge.bus import RawMessage, Received
from edgetwin.edge.canary import (
    RoutedDecision,
)
from edgetwin.edge.messages import Envelope
from edgetwin.edge.runtime_commands import CanaryCommands
from edgetwin.edge.runtime_core import Decision, NoPolicyLoaded

log = logging.getLogger("edgetwin.runtime")


class BusDecisions(CanaryCommands):
    """Answering decisions on the bus: the edgetwin frame, JSON and Arrow bodies (`decision_wire`)."""

    async def _on_decision_raw(self, msg: RawMessage) -> None:
        """One request on the decision subject: an edgetwin frame goes the envelope way (decoded
        and validated by the bus, rejections counted there, `_on_decision`); JSON and Arrow bodies
        (`edgetwin.edge.decision_wire`) are answered in kind, and every failure gets an error
        reply with its reason and code."""
        assert self.bus is not None and self._answer_frame is not None
        if decision_wire.is_frame(msg.data, msg.headers):
            rejected = await self.bus.deliver(msg, self._answer_frame)
            if rejected is not None and msg.reply is not None:
                # counted in bus.stats.rejected; the requester hears why now instead of timing out
                self.stats.bus_requests += 1
                self.stats.bus_errors += 1
                reason = f"rejected frame: {rejected}"
                await self.bus.publish(msg.reply, Envelope(kind="error", sender=self.name, payload={"reason": reason}))
            return
        self.stats.bus_requests += 1
        msg_id = decision_wire.request_id(msg.headers)
        try:
            a = self._active
            req = decision_wire.parse_request(
                msg.data, msg.headers, a.observation_columns if a else None, self.site, self.bus.max_bytes
            )
            if req.agents is not None:  # named groups: each row is served by its canary arm
                r = self.decide_for(req.obs, req.agents, req.sites, req.scenarios, t=req.t)
                a = self._active
                body, headers = decision_wire.encode_reply(
                    req.fmt, r.actions, self._served_action_columns(), version=a.version if a else "",
                    scope=a.scope if a else "", revision=a.revision if a else 0, msg_id=msg_id,
                    policies=r.policy.tolist(), arms=r.arm.tolist(), propensity=r.propensity,
                )  # fmt: skip
            else:
                d = self._decide_unnamed(req.obs)
                body, headers = decision_wire.encode_reply(
                    req.fmt, d.actions, self._served_action_columns(), version=d.version, scope=d.scope,
                    revision=d.revision, msg_id=msg_id,
                )  # fmt: skip
        except Exception as e:  # a bad request is answered, never raised into the bus
            self.stats.bus_errors += 1
            code, reason = _error_status(e)
            if code >= 500:
                log.warning("%s: decision request failed: %s", self.site, reason)
            body, headers = decision_wire.encode_error(code, reason, msg_id)
        if msg.reply is not None:
            await self.bus.publish_raw(msg.reply, body, headers=headers)

    def _decide_unnamed(self, obs: Any) -> Decision:
        """A request that names no service groups: the current policy answers every row; during a
        canary that is counted (``stats.unrouted``, ``/metrics``), since its rows can be in no arm."""
        c = self._canary
        if c is not None and c.active:
            with self._stats_lock:
                self.stats.unrouted += 1
        return self.decide_with_info(obs)

    def _served_action_columns(self) -> list[str]:
        a = self._active  # a swap keeps the columns (an incompatible version is refused)
        return a.action_columns if a is not None else []

    async def _on_decision(self, rcv: Received) -> Envelope:
        self.stats.bus_requests += 1
        env = rcv.envelope
        try:
            if env.kind != "decision_request":
                raise InputError(f"expected a decision_request, got {env.kind!r}", where=rcv.subject)
            if env.payload["site"] != self.site:
                raise InputError(
                    f"request for site {env.payload['site']!r} reached {self.site!r}", where=rcv.subject
                )
            if "agents" in env.payload:  # named groups: each row is served by its canary arm
                routed = self._decide_named(env)
            else:
                d = self._decide_unnamed(env.tensors["obs"])
        except Exception:
            self.stats.bus_errors += 1
            raise  # the bus answers with an "error" envelope carrying the reason
        if "agents" in env.payload:
            a = self._active
            return Envelope(
                kind="decision_reply",
                sender=self.name,
                round=env.round,
                payload={"policy_version": int(a.revision if a else 0), "version": a.version if a else "",
                         "scope": a.scope if a else "", "policies": [str(v) for v in routed.policy],
                         "arms": [str(v) for v in routed.arm]},
                tensors={"actions": routed.actions, "propensity": routed.propensity},
            )  # fmt: skip
        return Envelope(
            kind="decision_reply",
            sender=self.name,
            round=env.round,
            payload={"policy_version": int(d.revision), "version": d.version, "scope": d.scope},
            tensors={"actions": d.actions},
        )

    def _decide_named(self, env: Envelope) -> RoutedDecision:
        """`decide_for` on a request naming its rows' groups (checked: strings, one per row)."""
        obs = np.atleast_2d(np.asarray(env.tensors["obs"]))
        named: dict[str, Any] = {}
        for k in ("agents", "sites", "scenarios"):
            v = env.payload.get(k)
            if v is None:
                continue
            if len(v) != len(obs) or not all(isinstance(x, str) for x in v):
                raise InputError(f"{k} must be {len(obs)} strings, one per observation row", where="decision_request")
            named[k] = v
        t = env.payload.get("t")
        return self.decide_for(obs, named["agents"], named.get("sites"), named.get("scenarios"), t=t)


def _error_status(e: Exception) -> tuple[int, str]:
    """(code, reason) of a failed JSON / Arrow decision request."""
    if isinstance(e, decision_wire.BadDecisionRequest):
        return e.code, e.reason
    if isinstance(e, InputError):
        return 400, str(e)
    if isinstance(e, NoPolicyLoaded):
        return 503, str(e)
    return 500, f"the policy failed: {type(e).__name__}: {e}"
