"""Run a federated twin fit over a bus: one `TwinSiteAgent` per site, one `TwinCoordinator`.

    twin, report = fit_federated({"site-a": log_a, "site-b": log_b}, spec)      # in-process
    twin, report = fit_federated(logs, spec, bus="nats://127.0.0.1:4222")       # over NATS

Tasks go down durably on ``edgetwin.model.twin.<fit>``, answers come up durably on
``edgetwin.update.twin.<fit>`` (JetStream on NATS: an accepted update survives a server restart).
Each round closes with the policy federation's quorum + grace (`RoundCollector`): a site that
drops out does not stop the others; when it comes back its durable consumer resumes, it skips the
tasks it missed and answers the current one. A site whose computation raises says so (the error's
type only) and is not waited for; when the quorum is then out of reach the fit stops at once
(`FederatedFitFailed`) rather than at the round's timeout. Aggregation is an existing rule: FedAvg
by default, FedAvgM, secure aggregation (`SecureAggregator`) and Gaussian DP with its RDP
accountant as options (Gaussian DP with its own default schedule, `FitOptions.for_strategy`).

Only `edgetwin.federation.twin.fit` touches rows, inside `SiteFitter`; what crosses the bus is what
`edgetwin.federation.twin.messages` lets through.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import TwinSpec
from edgetwin.edge.bus import Bus, Received, Subjects, make_bus
from edgetwin.edge.message_auth import FederationKeys, MessageAuth, require_auth
from edgetwin.edge.messages import Envelope
from edgetwin.federation.aggregation import (
    Aggregator,
    ClientUpdate,
    FedAvg,
    FedAvgM,
    GaussianDP,
    RoundCollector,
    SecureAggregator,
)
from edgetwin.federation.compression import UpdateCodec
from edgetwin.federation.twin.assemble import TwinAssembler, gmm_from_context, transformer_from_dict
from edgetwin.federation.twin.messages import (
    MAX_TASK_AGE_S,
    check_update_size,
    is_fresh,
    make_failure,
    make_task,
    make_update,
    new_nonce,
    read_update,
)
from edgetwin.federation.twin.plan import MIN_AGENTS, FitOptions, TwinFitPlan
from edgetwin.federation.twin.site import SiteFitter
from edgetwin.imitation.layout import Layout
from edgetwin.twin.twin import Twin

#: the phase of a site's request to take part again under a new nonce (`TwinSiteAgent`)
REJOIN = "rejoin"

__all__ = ["COORDINATOR", "FederatedFitDiverged", "FederatedFitFailed", "FederatedFitReport", "TwinCoordinator", "TwinSiteAgent", "fit_federated",
           "fit_federated_async", "make_weight_aggregator", "run_twin_coordinator", "run_twin_site", "split_by_site"]

log = logging.getLogger("edgetwin.federation.twin")

STRATEGIES = ("fedavg", "fedavgm", "dp_gaussian")
#: the coordinator's identity: the ``sender`` of every task, the key sites accept tasks under
COORDINATOR = "twin/coordinator"
#: phases whose vectors are model parameters (aggregated by the weight rule, compressible)
MODEL_PHASES = ("weights", "adversarial", "population")


class FederatedFitFailed(RuntimeError):
    """A federated fit that cannot go on (exit 1): too many sites reported that they could not
    compute a round for its quorum to be reached (`RoundCollector.fail`)."""


class FederatedFitDiverged(FederatedFitFailed):
    """An aggregate of the models stopped being finite numbers, e.g. Gaussian DP noise far larger
    than the updates. Weights that stay finite but overflow in a site's own forward pass are not
    caught here: those sites report the failure and the round stops (`FederatedFitFailed`)."""


def split_by_site(df: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """One log per value of its ``site`` column (what `edgetwin fit-federated` does)."""
    if "site" not in df.columns:
        raise InputError("the log has no 'site' column to split by", where="site")
    return {str(s): part.reset_index(drop=True) for s, part in df.groupby(df["site"].astype(str), sort=True)}


def make_weight_aggregator(strategy: str = "fedavg", secure: bool = False, dp: Mapping[str, Any] | None = None,
                           seed: int = 0) -> Aggregator:
    """The rule that averages the models' weights: FedAvg, FedAvgM or Gaussian DP, optionally secure."""
    agg: Aggregator
    if strategy == "fedavg":
        agg = FedAvg()
    elif strategy == "fedavgm":
        agg = FedAvgM()
    elif strategy == "dp_gaussian":
        agg = GaussianDP(**dict(dp or {}))
    else:
        raise InputError(f"unknown strategy {strategy!r}; expected one of {STRATEGIES}", where="--strategy")
    return SecureAggregator(agg, seed=seed) if secure else agg


@dataclass
class FederatedFitReport:
    """What a federated fit did: rounds, bytes, timings (JSON-able via `to_dict`).

    Attributes:
        rounds: one record per closed round (phase, step, member, who answered, reason, seconds).
        bytes_up: bytes each site sent (its ``twin_update`` frames as received).
        bytes_down: bytes of the tasks the coordinator published (each read by every site).
        messages_up: frames each site sent.
        seconds: wall time of the fit.
        privacy: epsilon of the DP accountant, when DP is on.
    """

    fit_id: str
    sites: list[str]
    rounds: list[dict[str, Any]] = field(default_factory=list)
    bytes_up: dict[str, int] = field(default_factory=dict)
    bytes_down: int = 0
    messages_up: dict[str, int] = field(default_factory=dict)
    #: bytes all sites sent, by phase (``weights``: every weight round of every member)
    bytes_by_phase: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    strategy: str = "fedavg"
    compression: str = "dense"
    secure: bool = False
    privacy: dict[str, Any] = field(default_factory=dict)
    #: with secure aggregation: what each site's masked inputs and key shares come to (the masking
    #: protocol runs in-process at the coordinator, as in the policy federation; see docs)
    secure_bytes: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


# ------------------------------------------------------------------------------------ site agent
class TwinSiteAgent:
    """One site's agent: answers the coordinator's tasks from its own log (`SiteFitter`).

    Args:
        name: the site (client id; also its durable consumer's name).
        log: the site's log (validated); it never leaves the process.
        spec: the shared twin spec.
        bus: a connected bus.
        fit_id: which fit it takes part in.
        codec: compresses its weight updates (None: dense float32).
        fail_after: tests: stop answering after this many answers (a killed site).
        min_agents: the site's privacy setting (`SiteFitter`): every statistic it sends is an
            aggregate over at least this many agents.
    """

    #: sites of one process compute one at a time: training draws from torch's and numpy's global
    #: generators (PPO, imitation, BC), so concurrent threads would make a fit depend on timing
    _compute = threading.Lock()

    def __init__(self, name: str, log: pd.DataFrame, spec: TwinSpec, bus: Bus, fit_id: str,
                 codec: UpdateCodec | None = None, fail_after: int | None = None, min_agents: int = MIN_AGENTS) -> None:
        self.name = name
        self.fitter = SiteFitter(name, log, spec, min_agents)
        self.spec = spec
        self.bus = bus
        self.fit_id = fit_id
        self.codec = codec
        self.fail_after = fail_after
        self.answered = 0
        self.done = asyncio.Event()
        self._latest: Envelope | None = None
        #: hellos waiting for an answer, by run
        self._hellos: dict[str, Envelope] = {}
        #: tasks of a run this agent did not greet (it restarted mid-fit, or started late): each run
        #: is asked once to take this agent's nonce (``rejoin``); a replayed run's coordinator is gone
        self._rejoins: list[Envelope] = []
        self._rejoined: set[str] = set()
        self._wake = asyncio.Event()
        self._sub: Any = None
        self._worker: asyncio.Task[None] | None = None
        self._plan_key: tuple[Any, ...] | None = None
        self.last_seq = 0
        #: tasks refused because they did not come from the coordinator
        self.refused = 0
        #: this agent's nonce: sent in its hello, and every later task it takes must carry it
        self.nonce = new_nonce()
        #: the run (the coordinator's nonce) it follows, fixed by the first task after a hello
        self.run: str | None = None
        #: runs whose hello it answered
        self._greeted: set[str] = set()
        #: coordinator-signed tasks refused as replays: ``stale`` (``ts``), ``other_run`` (not its nonce or run)
        self.replays: Counter[str] = Counter()

    async def start(self) -> None:
        async def on_task(rcv: Received) -> None:
            env = rcv.envelope
            if env.payload.get("fit") != self.fit_id:
                return
            if env.sender != COORDINATOR:  # on an authenticated bus the sender is who signed it
                self.refused += 1
                log.warning("site %s: refused a twin_task from %r (tasks come from %s only)", self.name, env.sender,
                            COORDINATOR)
                return
            if not self._current(env):
                return
            if env.payload.get("phase") == "hello":
                self._hellos[str(env.payload["run"])] = env
            elif self._latest is None or env.round > self._latest.round or self._latest.payload.get("run") != env.payload["run"]:
                self._latest = env
            self._wake.set()

        self._sub = await self.bus.subscribe_durable(
            Subjects.model("twin", self.fit_id), f"twin-{self.fit_id}-{self.name}", on_task
        )
        self._worker = asyncio.create_task(self._work())

    def _current(self, env: Envelope, count: bool = True) -> bool:
        """Whether a coordinator's task belongs to the run this site takes part in: signed within
        the clock window (`is_fresh`, at most `MAX_TASK_AGE_S` old); a ``hello`` of a run it has not
        greeted while it follows none; any other task only when it carries this agent's nonce
        (so it was sent after this agent's hello) and the run it follows, and is a later round."""
        now = time.time()
        if not is_fresh(env, now - MAX_TASK_AGE_S, now):
            if count:
                self.replays["stale"] += 1
                log.warning("site %s: refused a twin_task signed at %s, outside the clock window", self.name, env.ts)
            return False
        run = env.payload.get("run")
        if env.payload.get("phase") == "hello":
            return self.run is None and run not in self._greeted
        if (env.payload.get("sites") or {}).get(self.name) != self.nonce or self.run not in (None, run):
            if count:
                self.replays["other_run"] += 1
                log.warning("site %s: refused a twin_task of another run (round %d)", self.name, env.round)
                if self.run is None and run not in self._rejoined:  # restarted (or late): ask to rejoin
                    self._rejoined.add(str(run))
                    self._rejoins.append(env)
                    self._wake.set()
            return False
        return env.round > self.last_seq

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._worker
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()

    async def _work(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            while self._hellos:  # every run's hello is answered (a replayed one cannot hide today's)
                _, hello = self._hellos.popitem()
                if self.run is None:
                    await self._serve(hello)
            while self._rejoins:
                task = self._rejoins.pop(0)
                log.info("site %s: asks to rejoin at round %d", self.name, task.round)
                await self.bus.publish_durable(Subjects.update("twin", self.fit_id), make_update(
                    self.name, self.fit_id, task.round, REJOIN, 0, 0, np.zeros(0, np.float32), 0.0,
                    run=str(task.payload["run"]), nonce=self.nonce))
            env = self._latest
            if env is None or not self._current(env, count=False):
                continue
            self.run = str(env.payload["run"])  # the first task after its hello fixes the run it follows
            self.last_seq = env.round
            if env.payload.get("final"):
                self.done.set()
                return
            if self.fail_after is not None and self.answered >= self.fail_after:
                return  # a killed site: silent from here on
            await self._serve(env)
            if self._latest is not None and self._latest.round > env.round:
                self._wake.set()  # a newer task arrived while computing: this answer is late anyway

    async def _serve(self, env: Envelope) -> None:
        """Answer one task: the update (bound to the task's run and round; a hello's carries this
        agent's nonce), or the failure's type name."""
        run, hello = str(env.payload["run"]), env.payload["phase"] == "hello"
        if hello:
            self._greeted.add(run)
        t0 = time.perf_counter()
        try:
            vector, weight, labels = await asyncio.to_thread(self._answer, env)
        except Exception as e:  # a site that cannot answer says so (its error's type only): the round's quorum decides
            log.error("site %s failed on %s: %r", self.name, env.payload.get("phase"), e, exc_info=True)
            await self.bus.publish_durable(Subjects.update("twin", self.fit_id), make_failure(
                self.name, self.fit_id, env.round, env.payload["phase"], env.payload["step"],
                env.payload["member"], e, run=run))
            return
        codec = self.codec if env.payload["phase"] in MODEL_PHASES else None
        up = make_update(self.name, self.fit_id, env.round, env.payload["phase"], env.payload["step"],
                         env.payload["member"], vector, weight, codec, labels, time.perf_counter() - t0,
                         run=run, nonce=self.nonce if hello else None)
        await self.bus.publish_durable(Subjects.update("twin", self.fit_id), up)
        self.answered += 1

    def _plan(self, ctx: Mapping[str, Any]) -> TwinFitPlan:
        key = (tuple(ctx["scenarios"]), tuple(ctx["columns"]), ctx["has_reward"])
        if self.fitter.plan is None or self._plan_key != key:
            self.fitter.set_plan(TwinFitPlan(self.spec, list(ctx["scenarios"]), list(ctx["columns"]),
                                             bool(ctx["has_reward"]), FitOptions.from_dict(ctx["options"])))
            self._plan_key = key
        plan = self.fitter.plan
        assert plan is not None
        if "layout" in ctx and plan.layout is None:
            plan.layout = Layout.from_dict(ctx["layout"])
        return plan

    def _answer(self, env: Envelope) -> tuple[np.ndarray, float, dict[str, Any] | None]:
        with TwinSiteAgent._compute:
            return self._answer_locked(env)

    def _answer_locked(self, env: Envelope) -> tuple[np.ndarray, float, dict[str, Any] | None]:
        phase, ctx = env.payload["phase"], env.payload.get("context", {})
        f = self.fitter
        if phase == "hello":
            v, labels = f.hello(policies=(ctx.get("options") or {}).get("response_model") in ("causal", "auto"))
            return v, 1.0, labels
        plan = self._plan(ctx)
        if phase == "stats1":
            return f.stats1(), 1.0, None
        if phase == "stats2":
            return f.stats2(ctx["stats"]), 1.0, None
        tr = transformer_from_dict(self.spec, ctx["transformer"])
        if phase == "summary":
            return f.summary(tr), 1.0, None
        if phase == "em":
            return f.em(gmm_from_context(ctx), tr), 1.0, None
        params = np.asarray(env.tensors["params"], np.float32)
        if phase == "weights":
            v, n = f.weights(env.payload["member"], env.payload["step"], params)
            return v, n, None
        if phase == "residual":
            return f.residual(env.payload["member"], params), 1.0, None
        if phase in ("causal_sums", "causal_grad"):
            plan.policies = [str(p) for p in ctx.get("policies", [])]
            if phase == "causal_sums":
                return f.causal_sums(env.payload["member"], params), 1.0, None
            return f.causal_grad(env.payload["member"], params), 1.0, None
        if phase == "adversarial":
            v, n = f.adversarial(env.payload["member"], env.payload["step"], params)
            return v, n, None
        if phase == "population":
            v, n = f.population(env.payload["step"], params, tr, gmm_from_context(ctx))
            return v, n, None
        raise InputError(f"unknown phase {phase!r}", where="twin_task")


# ------------------------------------------------------------------------------------ coordinator
class TwinCoordinator:
    """Drives the phases, aggregates each round with an existing rule and assembles the twin.

    Args:
        spec: the twin spec.
        sites: the site names expected to take part.
        bus: a connected bus.
        options: the fit's hyper-parameters.
        quorum: share (or count) of sites a round needs; grace_s / timeout_s: as `RoundCollector`.
        strategy, secure, dp: how the models' weights are aggregated (`make_weight_aggregator`).
        fit_id: names the fit's subjects and durable consumers.
        on_round: called with each closed round's record (progress).
    """

    def __init__(self, spec: TwinSpec, sites: list[str], bus: Bus, options: FitOptions | None = None,
                 quorum: float | int = 1.0, grace_s: float = 2.0, timeout_s: float = 900.0,
                 strategy: str = "fedavg", secure: bool = False, dp: Mapping[str, Any] | None = None,
                 fit_id: str | None = None, on_round: Callable[[dict[str, Any]], None] | None = None,
                 compression: str = "dense") -> None:
        self.spec = spec
        self.sites = list(sites)
        self.bus = bus
        self.options = options or FitOptions.for_strategy(strategy)
        if self.options.response_model == "auto" and strategy == "dp_gaussian":
            self.options = self.options.resolved([])  # the causal rounds do not run under DP (below)
        if self.options.response_model == "causal" and strategy == "dp_gaussian":
            # the causal rounds' sums and gradients are added up, not passed through DP's mechanism
            raise InputError("the federated causal response model does not run under Gaussian DP yet: use "
                             "fedavg/fedavgm (optionally --secure) or another response model", where="--strategy")
        self.quorum, self.grace_s, self.timeout_s = quorum, grace_s, timeout_s
        self.weight_agg = make_weight_aggregator(strategy, secure, dp, self.options.seed)
        # one rule per model phase: FedAvgM's velocity and DP's accountant are per model
        self.adv_agg = make_weight_aggregator(strategy, secure, dp, self.options.seed + 1)
        self.gan_agg = make_weight_aggregator(strategy, secure, dp, self.options.seed + 2)
        self.stats_agg: Aggregator = SecureAggregator(FedAvg("uniform"), seed=self.options.seed) if secure else FedAvg("uniform")
        self.secure, self.strategy = secure, strategy
        self.fit_id = fit_id or uuid.uuid4().hex[:12]
        self.on_round = on_round
        self.asm = TwinAssembler(spec, self.options)
        self.report = FederatedFitReport(self.fit_id, list(self.sites), strategy=strategy, compression=compression,
                                         secure=secure)
        self.seq = 0
        self._collectors: dict[int, RoundCollector] = {}
        self._envs: dict[int, dict[str, Envelope]] = defaultdict(dict)
        self._failures: dict[int, dict[str, str]] = defaultdict(dict)
        self._sub: Any = None
        self._base_ctx: dict[str, Any] = {}
        self._phase_of: dict[int, str] = {}
        self._expected: dict[int, int | None] = {}
        #: updates refused on receipt, by reason
        self.refused: Counter[str] = Counter()
        #: this run's nonce: every task carries it, an update counts only when it echoes it (a
        #: replay of another run's updates does not, whatever the fit id)
        self.run_nonce = new_nonce()
        #: site -> the nonce of its hello (or of its latest rejoin), carried by every later task
        self._site_nonces: dict[str, str] = {}
        #: site -> when the message that gave its nonce was signed
        self._nonce_ts: dict[str, float] = {}
        #: round -> when its task was signed (unix s): an update signed before it is a replay
        self._opened: dict[int, float] = {}

    async def start(self) -> None:
        async def on_update(rcv: Received) -> None:
            env = rcv.envelope
            if env.payload.get("fit") != self.fit_id:
                return
            sender = env.sender
            self.report.bytes_up[sender] = self.report.bytes_up.get(sender, 0) + rcv.nbytes
            self.report.messages_up[sender] = self.report.messages_up.get(sender, 0) + 1
            phase = str(env.payload.get("phase"))
            self.report.bytes_by_phase[phase] = self.report.bytes_by_phase.get(phase, 0) + rcv.nbytes
            if env.payload.get("run") != self.run_nonce:
                self.refused["other_run"] += 1
                log.warning("refused update of %r: it answers another run", sender)
                return
            if phase == REJOIN:
                self._rejoin(env)
                return
            col = self._collectors.get(env.round)
            if col is None or col.closed:
                return
            if not is_fresh(env, self._opened[env.round]):
                self.refused["stale"] += 1
                log.warning("refused update of %r for round %d: signed at %s, outside the round", sender, env.round,
                            env.ts)
                return
            if sender not in self.sites:  # authenticated: the sender signed it; it must be a site of the fit
                self.refused["unknown_sender"] += 1
                log.warning("refused update of %r: not a site of this fit", sender)
                return
            if phase != self._phase_of.get(env.round):
                self.refused["wrong_phase"] += 1
                log.warning("refused update of %s: phase %r for round %d of phase %r", sender, phase, env.round,
                            self._phase_of.get(env.round))
                return
            if "failed" in env.payload:
                if col.fail(sender):
                    self._failures[env.round][sender] = str(env.payload["failed"])
                return
            labels = env.payload.get("labels")
            if phase == "hello" and "nonce" not in env.payload and "failed" not in env.payload:
                self.refused["no_nonce"] += 1
                log.warning("refused hello of %s: it carries no site nonce", sender)
                return
            if phase == "hello" and (not isinstance(labels, dict) or labels.get("site") != sender):
                self.refused["wrong_site"] += 1
                log.warning("refused hello of %s: it speaks for site %r", sender, (labels or {}).get("site"))
                return
            try:  # the plan's size for the phase is checked before anything is allocated
                vec = read_update(env, self._expected.get(env.round))
            except InputError as e:
                self.refused["wrong_size"] += 1
                log.warning("refused update of %s: %s", sender, e)
                return
            if col.submit(ClientUpdate(sender, vec, float(env.payload["num_samples"]), env.round)):
                self._envs[env.round][sender] = env

        self._sub = await self.bus.subscribe_durable(
            Subjects.update("twin", self.fit_id), f"twin-{self.fit_id}-coordinator", on_update
        )

    def _rejoin(self, env: Envelope) -> None:
        """A site of this fit that restarted (or missed the hello) asks that later tasks carry its
        new nonce: taken when signed since this run's first round opened and after the nonce it
        replaces (a replay of an earlier rejoin cannot bring back an old nonce)."""
        sender, nonce = env.sender, env.payload.get("nonce")
        since = max(self._opened.get(1, float("inf")), self._nonce_ts.get(sender, 0.0))
        if sender not in self.sites or not isinstance(nonce, str) or not is_fresh(env, since) or env.ts <= self._nonce_ts.get(sender, 0.0):
            self.refused["rejoin"] += 1
            log.warning("refused a rejoin of %r", sender)
            return
        self._site_nonces[sender] = nonce
        self._nonce_ts[sender] = float(env.ts)
        log.info("site %s rejoins from the next round", sender)

    async def stop(self) -> None:
        if self._sub is not None:
            with contextlib.suppress(Exception):
                await self._sub.unsubscribe()

    async def _round(self, phase: str, step: int = 0, member: int = 0, context: dict[str, Any] | None = None,
                     params: np.ndarray | None = None) -> tuple[list[ClientUpdate], dict[str, Envelope]]:
        self.seq += 1
        seq = self.seq
        col = RoundCollector(seq, self.sites, self.quorum, self.grace_s, self.timeout_s)
        self._collectors[seq] = col
        self._phase_of[seq] = phase
        # computed here, not per update: sizing the adversarial phase builds (seeded) modules, which
        # must not run on this thread while a site's thread trains (torch's generator is global)
        self._expected[seq] = self.plan_size(phase)
        ctx = {**self._base_ctx, **(context or {})}
        task = make_task(COORDINATOR, self.fit_id, seq, phase, step, member, ctx, params, run=self.run_nonce,
                         sites=None if phase == "hello" else self._site_nonces)
        self._opened[seq] = task.ts
        before = self.bus.stats.bytes_out
        await self.bus.publish_durable(Subjects.model("twin", self.fit_id), task)
        self.report.bytes_down += self.bus.stats.bytes_out - before
        t0 = time.perf_counter()
        out = await col.wait()
        # by site, not in arrival order: which site answers first is the threads' (or the network's)
        # timing, and what is built from the answers (k-means over the summaries' centroids, float
        # sums) depends on their order; sorted, the same seed and logs give the same twin
        envs = dict(sorted(self._envs.pop(seq, {}).items()))
        if phase == "hello":
            self._site_nonces = {k: str(e.payload["nonce"]) for k, e in envs.items()}
            self._nonce_ts = {k: float(e.ts) for k, e in envs.items()}
        failures = self._failures.pop(seq, {})
        expected = self._expected[seq]
        ups = []
        for u in sorted(out.updates, key=lambda u: u.client_id):
            try:
                if expected is not None:
                    check_update_size(u.delta, expected, u.client_id, phase)
                ups.append(u)
            except InputError as e:
                log.warning("%s", e)
        rec = {"seq": seq, "phase": phase, "step": step, "member": member, "sites": sorted(u.client_id for u in ups),
               "missing": out.missing, "reason": out.reason, "seconds": round(time.perf_counter() - t0, 3)}
        if failures:
            rec["failed"] = dict(sorted(failures.items()))
        if out.reason == "failed":
            errors = ", ".join(f"{k} ({v})" for k, v in sorted(failures.items()))
            which = "" if phase not in ("weights", "residual", "adversarial", "causal_sums", "causal_grad") \
                else f", member {member}"
            raise FederatedFitFailed(f"round {seq} ({phase} step {step + 1}{which}) failed at {len(failures)} of "
                                     f"{len(self.sites)} sites: {errors}; the quorum cannot be reached{self._dp_hint()}")
        if not out.quorum_met or not ups:
            raise InputError(f"round {seq} ({phase}) closed without a quorum: {out.missing} missing "
                             f"({out.reason})", where="federated fit")
        self.report.rounds.append(rec)
        if self.on_round is not None:
            self.on_round(rec)
        return ups, envs

    def plan_size(self, phase: str) -> int | None:
        if phase == "hello" or self.asm.plan is None:
            return None
        return self.asm.plan.size(phase)

    def _sum(self, ups: list[ClientUpdate], size: int) -> np.ndarray:
        """The total of the sites' vectors (uniform FedAvg from 0 = their mean; times their count)."""
        res = self.stats_agg.aggregate(ups, np.zeros(size, np.float32), self.seq)
        self._count_secure(self.stats_agg)
        return np.asarray(res.params, np.float64) * len(ups)

    def _count_secure(self, agg: Aggregator) -> None:
        tr = getattr(agg, "last_transcript", None)
        if tr is None:
            return
        n = max(len(tr.masked), 1)
        for cid, masked in tr.masked.items():
            self.report.secure_bytes[cid] = self.report.secure_bytes.get(cid, 0) + int(masked.nbytes) + tr.ciphertext_bytes // n
        agg.last_transcript = None  # type: ignore[attr-defined]

    def _check_finite(self, params: np.ndarray, phase: str, r: int, member: int | None) -> None:
        """Stop the fit with one clear line when an aggregate is no longer finite (rather than
        sending NaN weights to the sites, whose next round then fails and times out)."""
        if np.isfinite(params).all():
            return
        which = "" if member is None else f" (member {member})"
        raise FederatedFitDiverged(f"the federated {phase} models are no longer finite after round {r + 1}{which}"
                                   f"{self._dp_hint()}")

    def _dp_hint(self) -> str:
        """What to change when a fit under Gaussian DP fails ('' under any other rule)."""
        if self.strategy != "dp_gaussian":
            return ""
        return ("; Gaussian DP's noise swamps the updates at this many rounds and sites: use fewer rounds "
                "(--fed-rounds), a larger clip norm or more sites")

    async def _fit_causal(self, member: int) -> None:
        """The member's causal response models (`edgetwin.federation.twin.causal`): per step a
        ``causal_sums`` round (the pooled per-policy sums at the current weights) and a
        ``causal_grad`` round (the pooled loss's gradient), then one Adam step; a last
        ``causal_sums`` round measures the residual spread. Sums and gradients are added up by the
        statistics rule (secure aggregation when the fit is secure). With a quorum below every
        site, the two rounds of a step may hear different sites: the step is then on the loss of
        the sites that answered its gradient round, centred with the other round's moments."""
        from edgetwin.federation.twin.causal import CausalAggregate

        plan, o = self.asm.plan, self.options
        assert plan is not None and plan.layout is not None
        agg = CausalAggregate(plan.layout, o.to_dict(), member, plan.policies)
        n_sums, n_grad = plan.size("causal_sums"), plan.size("causal_grad")
        for t in range(o.causal_steps):
            theta = agg.vector()
            ups, _ = await self._round("causal_sums", step=t, member=member, params=theta)
            coef = agg.coefficients(self._sum(ups, n_sums), t)
            ups, _ = await self._round("causal_grad", step=t, member=member, params=np.concatenate([theta, coef]))
            agg.step(self._sum(ups, n_grad))
            self._check_finite(agg.vector(), "causal", t, member)
        ups, _ = await self._round("causal_sums", step=o.causal_steps, member=member, params=agg.vector())
        total = self._sum(ups, n_sums)
        counted = total.reshape(plan.n_scen, len(plan.policies), -1)[:, :, 0].sum(axis=1)
        self.asm.set_causal(member, agg.models(total), counted,
                            [{"round": o.rounds + int(h["step"]) + 1, "phase": "causal", **h} for h in agg.history])

    async def run(self) -> Twin:
        """The whole fit; returns the twin (also publishes a final task so that site agents stop)."""
        t_start = time.perf_counter()
        o = self.options
        dims: dict[str, int] = {}  # the size of each model phase's aggregated vector
        ups, envs = await self._round("hello", context={"options": o.to_dict()})
        labels = {k: e.payload["labels"] for k, e in envs.items()}
        if o.response_model == "auto":  # decided here, from the policies the sites logged (FitOptions.resolved)
            o = self.options = self.asm.options = o.resolved(
                [str(p) for lab in labels.values() for p in lab.get("policies", [])])
        plan = self.asm.hello(labels)
        self._base_ctx = {"scenarios": plan.scenarios, "columns": sorted(set.intersection(
            *(set(lab["columns"]) for lab in labels.values()))), "has_reward": plan.has_reward,
            "options": o.to_dict(), **({"policies": plan.policies} if o.response_model == "causal" else {})}
        ups, _ = await self._round("stats1")
        ctx2 = self.asm.context1(self._sum(ups, plan.size("stats1")))
        ups, _ = await self._round("stats2", context={"stats": ctx2})
        enc = self.asm.layout2(self._sum(ups, plan.size("stats2")))
        self._base_ctx.update(enc)
        ups, _ = await self._round("summary")
        self.asm.summaries({u.client_id: u.delta for u in ups})
        ll = float("nan")
        for it in range(o.em_iters):
            ups, _ = await self._round("em", step=it, context=self.asm.gmm_context())
            ll = self.asm.em_step(self._sum(ups, plan.size("em")))
        self.report.rounds[-1]["loglik_per_agent"] = ll
        if o.gan_population:
            self.asm.build_population()
            gan_ctx = self.asm.gmm_context()
            params = self.asm.population_vector()
            dims["population"] = params.size
            rounds: list[dict[str, Any]] = []
            for r in range(o.gan_rounds):
                ups, _ = await self._round("population", step=r, context=gan_ctx, params=params)
                res = self.gan_agg.aggregate(ups, np.zeros_like(params), self.seq)
                self._count_secure(self.gan_agg)
                params = (params.astype(np.float64) + np.asarray(res.params, np.float64)).astype(np.float32)
                self._check_finite(params, "population", r, None)  # one population for every member
                rounds.append({"round": r + 1, "sites": len(ups), "update_norm": float(np.linalg.norm(res.params))})
            self.asm.set_population(params, rounds)
        for m in range(o.members):
            params = self.asm.initial_vector(m)
            dims["weights"] = params.size
            rounds = []
            for r in range(o.rounds):
                ups, _ = await self._round("weights", step=r, member=m, params=params)
                res = self.weight_agg.aggregate(ups, np.zeros_like(params), self.seq)
                self._count_secure(self.weight_agg)
                params = self.asm.apply_weights(params, np.asarray(res.params, np.float64))
                self._check_finite(params, "weights", r, m)
                rounds.append({"round": r + 1, "sites": len(ups), "update_norm": float(res.info.get("update_norm", 0.0))})
            ups, _ = await self._round("residual", member=m, params=params)
            self.asm.add_member(m, params, self._sum(ups, plan.size("residual")), rounds)
            if o.response_model == "causal":
                await self._fit_causal(m)
            if o.adversarial:
                adv, engines = self.asm.adversarial_vector(m)
                dims["adversarial"] = adv.size
                rounds = []
                for r in range(o.adv_rounds):
                    ups, _ = await self._round("adversarial", step=r, member=m,
                                               params=np.concatenate([adv, engines]))
                    res = self.adv_agg.aggregate(ups, np.zeros_like(adv), self.seq)
                    self._count_secure(self.adv_agg)
                    adv = self.asm.apply_adversarial(m, adv, np.asarray(res.params, np.float64))
                    self._check_finite(adv, "adversarial", r, m)
                    rounds.append({"round": o.rounds + r + 1, "phase": "adversarial", "sites": len(ups),
                                   "update_norm": float(np.linalg.norm(res.params))})
                self.asm.finish_adversarial(m, adv, rounds)
        self.seq += 1
        await self.bus.publish_durable(Subjects.model("twin", self.fit_id),
                                       make_task(COORDINATOR, self.fit_id, self.seq, "done", 0, 0, final=True,
                                                 run=self.run_nonce, sites=self._site_nonces))
        self.report.seconds = time.perf_counter() - t_start
        eps, nts, delta = {}, {}, 0.0
        used = (("weights", self.weight_agg, True), ("adversarial", self.adv_agg, o.adversarial),
                ("population", self.gan_agg, o.gan_population))
        for phase, agg, ran in used:
            dp = agg if isinstance(agg, GaussianDP) else getattr(agg, "inner", None)
            if ran and isinstance(dp, GaussianDP):
                eps[phase] = float(dp.epsilon())
                delta = float(dp.delta)
                # the noise's norm on the mean, z C sqrt(D) / n, over the largest norm the mean of
                # clipped updates can have, C: above 1 the noise outweighs any update
                n = dp.expected_clients or len(self.sites)
                nts[phase] = float(dp.noise_multiplier * np.sqrt(dims[phase]) / n)
        if eps:
            # three mechanisms on the same sites' data: sequential composition bounds the total by the sum
            self.report.privacy = {"epsilon": float(sum(eps.values())), "epsilon_by_phase": dict(eps), "delta": delta,
                                   "composition": "sum over phases (sequential composition, an upper bound)",
                                   "noise_to_signal": nts}
        return self.asm.twin({"report": {"bytes_up": self.report.bytes_up, "bytes_down": self.report.bytes_down,
                                         "rounds": len(self.report.rounds)}})


# ------------------------------------------------------------------------------------ entry points
async def fit_federated_async(
    logs: Mapping[str, pd.DataFrame], spec: TwinSpec, bus: str | Callable[[str], Bus] = "memory", options: FitOptions | None = None,
    strategy: str = "fedavg", secure: bool = False, dp: Mapping[str, Any] | None = None,
    compression: str = "dense", quorum: float | int = 1.0, grace_s: float = 2.0, timeout_s: float = 900.0,
    on_round: Callable[[dict[str, Any]], None] | None = None, fail_after: Mapping[str, int] | None = None,
    keys: FederationKeys | None = None, min_agents: int = MIN_AGENTS,
) -> tuple[Twin, FederatedFitReport]:
    """Fit a twin from per-site logs, each site an agent on its own bus client (in this process).

    ``bus``: ``"memory"`` (one in-process broker), ``"nats://..."``, or a factory ``name -> Bus``.
    ``fail_after``: tests: site -> answers after which that site goes silent (a killed agent).
    ``keys``: every party's key (`COORDINATOR` and each site's name); None: fresh keys for all of
    them. Every message is signed by its sender and checked on receipt (`edgetwin.edge.message_auth`).
    ``min_agents``: every site's privacy setting (`SiteFitter`).
    """
    if len(logs) < 1:
        raise InputError("a federated fit needs at least one site", where="sites")
    codec = _codec(compression)
    fit_id = uuid.uuid4().hex[:12]
    buses: list[Bus] = []
    from edgetwin.edge.bus.memory_bus import InMemoryBus, MemoryBroker

    broker = MemoryBroker() if bus == "memory" else None  # one broker shared by every in-process agent
    keys = keys or FederationKeys.generate([COORDINATOR, *sorted(logs)])

    async def client(name: str, identity: str) -> Bus:
        if broker is not None:
            b: Bus = InMemoryBus(broker, name=name)
        else:
            b = bus(name) if callable(bus) else make_bus(bus, name=name)
        b.auth = keys.auth(identity)
        await b.connect()
        buses.append(b)
        return b

    coord = TwinCoordinator(spec, sorted(logs), await client("twin-coordinator", COORDINATOR), options, quorum, grace_s,
                            timeout_s, strategy, secure, dp, fit_id, on_round, compression)
    await coord.start()
    agents = []
    for name, df in sorted(logs.items()):
        a = TwinSiteAgent(name, df, spec, await client(f"twin-site-{name}", name), fit_id,
                          _codec(compression) if codec is not None else None,
                          (fail_after or {}).get(name), min_agents)
        await a.start()
        agents.append(a)
    try:
        twin = await coord.run()
    finally:
        # bounded: a bus that does not close (a server gone mid-shutdown) must not hold the fit's result
        for a in agents:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(a.stop(), 10)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(coord.stop(), 10)
        for b in buses:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(b.close(), 10)
    return twin, coord.report


def fit_federated(logs: Mapping[str, pd.DataFrame], spec: TwinSpec, **kw: Any) -> tuple[Twin, FederatedFitReport]:
    """Synchronous `fit_federated_async`."""
    return asyncio.run(fit_federated_async(logs, spec, **kw))


def _codec(name: str) -> UpdateCodec | None:
    if name == "dense":
        return None
    if name == "int8":
        return UpdateCodec(topk=None, quantize_bits=8, error_feedback=True)
    if name == "topk+int8":
        return UpdateCodec(topk=0.1, quantize_bits=8, error_feedback=True)
    raise InputError(f"unknown compression {name!r}; expected dense, int8 or topk+int8", where="--compression")


# ------------------------------------------------------------------------------------ one process each
def _process_auth(identity: str, bus: str, insecure: bool) -> MessageAuth | None:
    """The keys of a party run as its own process: from the keys directory in `KEYS_ENV` (every
    party's ``*.pub.pem`` and this one's ``*.key.pem``). Without one it refuses a bus outside this
    process unless ``insecure`` (`edgetwin.edge.message_auth.require_auth`)."""
    return require_auth(identity, bus=bus, insecure=insecure)


async def run_twin_site(log: pd.DataFrame, spec: TwinSpec, bus: str, name: str, fit_id: str,
                        compression: str = "dense", emit: Callable[[dict[str, Any]], None] | None = None,
                        min_agents: int = MIN_AGENTS, insecure: bool = False) -> int:
    """One site's agent as its own process (`edgetwin agent --fit-twin`): answers until the fit ends.

    ``insecure``: run without a keys directory on a bus outside this process (`_process_auth`).
    Returns the number of tasks it answered.
    """
    auth = _process_auth(name, bus, insecure)
    b = make_bus(bus, name=f"twin-site-{name}")
    b.auth = auth
    await b.connect()
    agent = TwinSiteAgent(name, log, spec, b, fit_id, _codec(compression), min_agents=min_agents)
    try:
        await agent.start()
        if emit is not None:
            emit({"event": "ready", "site": name, "fit": fit_id, "rows": len(log)})
        await agent.done.wait()
    finally:
        await agent.stop()
        await b.close()
    return agent.answered


async def run_twin_coordinator(spec: TwinSpec, sites: list[str], bus: str, fit_id: str,
                               options: FitOptions | None = None, insecure: bool = False,
                               **kw: Any) -> tuple[Twin, FederatedFitReport]:
    """The coordinator as its own process: drives the fit of ``sites`` and returns the twin.

    ``insecure``: run without a keys directory on a bus outside this process (`_process_auth`)."""
    auth = _process_auth(COORDINATOR, bus, insecure)
    b = make_bus(bus, name="twin-coordinator")
    b.auth = auth
    await b.connect()
    coord = TwinCoordinator(spec, sites, b, options, fit_id=fit_id, **kw)
    try:
        await coord.start()
        twin = await coord.run()
    finally:
        await coord.stop()
        await b.close()
    return twin, coord.report
