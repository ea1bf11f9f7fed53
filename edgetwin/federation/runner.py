"""Run a whole MA-FL federation on one machine: agents in-process or as subprocesses, over any bus.

A federation is described by a `FederationConfig` (JSON-able: what ``edgetwin agent ... --config``
reads): the sites, the aggregation tree (``edgetwin.federation.hierarchy.build_hierarchy`` format:
site -> cluster [-> region] -> global, strategies, participation, quorum, grace, timeouts), the
learner every ESA runs, the uplink compression, the number of rounds, Byzantine clients (tests
and benchmarks) and the seed::

    cfg = make_federation_config(sites=4, rounds=10, clusters=2, strategy="fedavg",
                                 global_strategy="fedavgm", learner={"kind": "forecast"})
    res = run_federation(cfg, bus="memory")                 # in-process, embedded bus
    res = run_federation(cfg, bus="nats://127.0.0.1:4222")  # in-process agents over NATS
    res = run_federation(cfg, bus="nats://...", processes=True)  # one OS process per agent

`FederationResult` holds the global round records (reason, quorum, staleness, reward), every
group's records, the ESAs' own records, bytes per round and per level, the bus counters
(rejections) and, in-process, each site's final reward with the final (personalised) model.

Configurations that cannot work are refused before anything starts (`build_tree`): the tree's
own checks (Krum with n < 2f + 3, a trimmed-mean cut below the assumed Byzantine fraction, robust
rules behind secure aggregation, quorum above participation, ...) plus a child group whose round
(model wait + timeout) cannot finish within its parent's timeout, a site that is in no group or
in a group other than its cluster, or a learner that cannot be built.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgetwin.contract.errors import InputError
from edgetwin.edge.bus import Bus, make_bus
from edgetwin.edge.message_auth import INSECURE_FLAG, KEYS_ENV, FederationKeys, require_auth, write_keys
from edgetwin.federation.agents import (
    AggregatorAgent,
    ClusterOrchestratorAgent,
    EdgeServiceAgent,
    GlobalCoordinationAgent,
    RoundRecord,
)
from edgetwin.federation.attacks import Attack
from edgetwin.federation.compression import DampedErrorFeedbackCodec, UpdateCodec
from edgetwin.federation.hierarchy import HierarchyNode, build_hierarchy
from edgetwin.federation.learners import make_learner
from edgetwin.federation.sites import SiteSpec, heterogeneous_sites

__all__ = [
    "Federation",
    "FederationConfig",
    "FederationResult",
    "agent_command",
    "build_federation",
    "build_tree",
    "federation_identities",
    "make_federation_config",
    "rounds_to_fraction",
    "run_agent",
    "run_federation",
    "run_federation_async",
    "train_independent",
]

log = logging.getLogger("edgetwin.federation")


# ------------------------------------------------------------------------------ config
@dataclass
class FederationConfig:
    """Everything a federation's agents need (the ``--config`` of ``edgetwin agent``).

    Attributes:
        sites: the sites (`SiteSpec` dicts).
        aggregation: the aggregation tree (`build_hierarchy` format; leaves list sites as members).
        learner: the ESA learner (`make_learner` table).
        rounds: federated rounds.
        codec: uplink compression ``{"topk": 0.1 | None, "quantize_bits": 8 | None,
            "error_feedback": bool, "residual_decay": 0.5}`` (`DampedErrorFeedbackCodec`).
        attacks: site -> `Attack` fields, for Byzantine clients.
        model_wait_s: how long an agent waits for a round's model before using the one it has.
        seed: sampling of participants, attacks.
        run: run id (messages of other runs on the same server are ignored).
    """

    sites: list[dict[str, Any]]
    aggregation: dict[str, Any]
    learner: dict[str, Any] = field(default_factory=lambda: {"kind": "forecast"})
    rounds: int = 10
    codec: dict[str, Any] = field(
        default_factory=lambda: {
            "topk": 0.1,
            "quantize_bits": 8,
            "error_feedback": True,
            "residual_decay": 0.5,
        }
    )
    attacks: dict[str, dict[str, Any]] = field(default_factory=dict)
    model_wait_s: float = 2.0
    seed: int = 0
    run: str = field(default_factory=lambda: uuid.uuid4().hex[:12])

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "federation config") -> FederationConfig:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - known)
        if unknown:
            raise InputError(f"unknown keys {unknown}; known: {sorted(known)}", where=where)
        for key in ("sites", "aggregation"):
            if key not in d:
                raise InputError(f"missing {key!r}", where=where)
        try:
            return cls(**d)
        except TypeError as e:
            raise InputError(str(e), where=where) from None

    @classmethod
    def load(cls, path: str | Path) -> FederationConfig:
        p = Path(path)
        try:
            d = json.loads(p.read_text())
        except OSError as e:
            raise InputError(f"cannot read: {e.strerror}", where=str(p)) from None
        except json.JSONDecodeError as e:
            raise InputError(f"not valid JSON: {e}", where=str(p)) from None
        return cls.from_dict(d, where=str(p))

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.write_text(json.dumps(self.to_dict(), indent=2))
        return p

    def site_specs(self) -> list[SiteSpec]:
        return [SiteSpec.from_dict(s, where=f"sites[{i}]") for i, s in enumerate(self.sites)]

    def make_codec(self) -> UpdateCodec:
        """The uplink codec of one agent (each agent keeps its own error-feedback residuals)."""
        c = dict(self.codec)
        unknown = sorted(set(c) - {"topk", "quantize_bits", "error_feedback", "residual_decay"})
        if unknown:
            raise InputError(f"unknown codec keys {unknown}", where="codec")
        return DampedErrorFeedbackCodec(
            topk=c.get("topk", 0.1),
            quantize_bits=c.get("quantize_bits", 8),
            error_feedback=bool(c.get("error_feedback", True)),
            residual_decay=float(c.get("residual_decay", 0.5)),
        )


def make_federation_config(
    sites: int | Sequence[SiteSpec] = 4,
    rounds: int = 10,
    clusters: int = 1,
    strategy: str | Mapping[str, Any] = "fedavg",
    global_strategy: str | Mapping[str, Any] = "fedavgm",
    hierarchy: bool = True,
    learner: Mapping[str, Any] | None = None,
    participation: float | tuple[float, float] | None = None,
    quorum: float | int | None = None,
    grace_s: float = 0.5,
    timeout_s: float = 30.0,
    staleness: Mapping[str, Any] | None = None,
    compression: bool = True,
    attacks: Mapping[str, Mapping[str, Any]] | None = None,
    model_wait_s: float = 2.0,
    seed: int = 0,
    site_kwargs: Mapping[str, Any] | None = None,
) -> FederationConfig:
    """A `FederationConfig` for the common shapes.

    Args:
        sites: a number of `heterogeneous_sites`, or the sites themselves.
        rounds: federated rounds.
        clusters: COAs; with ``hierarchy`` each aggregates its sites with ``strategy`` and the
            GCA aggregates the clusters with ``global_strategy``. Without the hierarchy (or with
            one cluster) the GCA aggregates all sites directly with ``strategy``.
        participation: share (or ``(low, high)``) of inputs sampled per round at the site level.
        quorum: k (int) or share of the inputs the site-level round closes on (default: all
            sampled inputs, i.e. wait for everyone up to the timeout).
        grace_s, timeout_s: of the site-level rounds; parents get ``2 · timeout_s + model wait``.
        staleness: ``{"exponent", "max_staleness"}`` of late-update discounting (default 0.5, 8).
        compression: top-k 10 % + int8 with damped error feedback on the uplink (else dense
            float32); see `DampedErrorFeedbackCodec`.
        attacks: site name -> `Attack` fields.
        site_kwargs: passed to `heterogeneous_sites` (``n_agents``, ``steps``, ``traces``).
    """
    site_list = (
        list(sites)
        if not isinstance(sites, int)
        else heterogeneous_sites(sites, clusters, seed=seed, **dict(site_kwargs or {}))
    )
    if not site_list:
        raise InputError("a federation needs at least one site", where="--sites")
    if rounds < 1:
        raise InputError(f"rounds must be >= 1, got {rounds}", where="--rounds")
    st = dict(staleness or {"exponent": 0.5, "max_staleness": 8})
    leaf_extra: dict[str, Any] = {"grace_s": grace_s, "timeout_s": timeout_s, "staleness": st}
    if participation is not None:
        leaf_extra["participation"] = (
            list(participation) if isinstance(participation, tuple) else participation
        )
    if quorum is not None:
        leaf_extra["quorum"] = quorum
    root_timeout = 2.0 * timeout_s + model_wait_s + 2.0 * grace_s + 1.0
    groups: dict[str, list[str]] = defaultdict(list)
    for s in site_list:
        groups[s.cluster].append(s.name)
    agg: dict[str, Any]
    if hierarchy and len(groups) > 1:
        children = [
            {"name": c, "level": "cluster", "strategy": strategy, "members": m, **leaf_extra}
            for c, m in sorted(groups.items())
        ]
        agg = {
            "name": "global",
            "level": "global",
            "strategy": global_strategy,
            "children": children,
            "grace_s": grace_s,
            "timeout_s": root_timeout,
        }
    else:
        agg = {
            "name": "global",
            "level": "global",
            "strategy": strategy,
            "members": [s.name for s in site_list],
            **leaf_extra,
        }
    codec = (
        {"topk": 0.1, "quantize_bits": 8, "error_feedback": True, "residual_decay": 0.5}
        if compression
        else {"topk": None, "quantize_bits": None, "error_feedback": False}
    )
    return FederationConfig(
        sites=[s.to_dict() for s in site_list],
        aggregation=agg,
        learner=dict(learner or {"kind": "forecast"}),
        rounds=int(rounds),
        codec=codec,
        attacks={k: dict(v) for k, v in (attacks or {}).items()},
        model_wait_s=float(model_wait_s),
        seed=int(seed),
    )


def build_tree(
    cfg: FederationConfig,
) -> tuple[HierarchyNode, dict[str, HierarchyNode], dict[str, HierarchyNode]]:
    """Check the config and build its aggregation tree.

    Returns:
        ``(root, parent_of, leaf_of_site)``: the root node, each non-root node's parent by name,
        and the leaf group of each site.
    """
    sites = cfg.site_specs()
    names = [s.name for s in sites]
    if len(set(names)) != len(names):
        raise InputError(f"site names must be unique, got {names}", where="sites")
    root = build_hierarchy(cfg.aggregation, seed=cfg.seed)
    parent_of: dict[str, HierarchyNode] = {}
    leaf_of: dict[str, HierarchyNode] = {}
    for node in root.walk():
        for c in node.children:
            parent_of[c.name] = node
            if c.timeout_s + cfg.model_wait_s + c.grace_s >= node.timeout_s:
                raise InputError(
                    f"group {c.name!r} may take {c.timeout_s + cfg.model_wait_s + c.grace_s:.1f}s (timeout + model wait + "
                    f"grace), not less than its parent {node.name!r}'s timeout {node.timeout_s:.1f}s: the parent "
                    "would close every round without it",
                    where=f"aggregation config: {c.name}: timeout_s",
                )
        for m in node.members:
            leaf_of[m] = node
    missing = [n for n in names if n not in leaf_of]
    unknown = [m for m in leaf_of if m not in names]
    if missing or unknown:
        raise InputError(
            f"sites in no group: {missing}; groups name unknown sites: {unknown}", where="aggregation config"
        )
    for s in sites:
        leaf = leaf_of[s.name]
        if leaf is not root and leaf.name != s.cluster:
            raise InputError(
                f"site {s.name!r} is in group {leaf.name!r} but says cluster {s.cluster!r}", where="sites"
            )
    for name, a in cfg.attacks.items():
        if name not in names:
            raise InputError(f"attack on unknown site {name!r}", where="attacks")
        Attack(**a)
    if cfg.rounds < 1:
        raise InputError(f"rounds must be >= 1, got {cfg.rounds}", where="rounds")
    cfg.make_codec()
    return root, parent_of, leaf_of


# ------------------------------------------------------------------------------ result
@dataclass
class FederationResult:
    """What a federation run produced.

    Attributes:
        rounds: the root's `RoundRecord` dicts, one per round.
        groups: every aggregation group's records (by group name).
        sites: each ESA's own per-round records (in-process runs).
        final_rewards: each site's reward with its final model (in-process runs; forecast skill or
            the last training episodes' mean return).
        bytes_per_round: per round, bytes of updates received per level (``site`` = ESA uplinks,
            ``cluster`` = COA uplinks) and models sent down.
        bus: summed counters of the agents' bus clients (``rejected`` by reason, bytes).
        refused: updates / models refused by the agents, by reason.
        elapsed_s: wall time.
        config: the configuration.
    """

    rounds: list[dict[str, Any]]
    groups: dict[str, list[dict[str, Any]]]
    sites: dict[str, list[dict[str, Any]]]
    final_rewards: dict[str, float]
    bytes_per_round: list[dict[str, int]]
    bus: dict[str, Any]
    refused: dict[str, int]
    elapsed_s: float
    config: dict[str, Any]

    @property
    def reward_curve(self) -> list[float]:
        """The root's reward per round (sample-weighted over what it aggregated)."""
        return [float("nan") if r["reward"] is None else float(r["reward"]) for r in self.rounds]

    def site_curve(self, site: str) -> list[float]:
        """A site's own reward per round it trained in."""
        return [float(r["reward"]) for r in self.sites.get(site, [])]

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["final_rewards"] = {k: (None if not math.isfinite(v) else v) for k, v in self.final_rewards.items()}
        return d

    def plot(self, path: str | Path, title: str = "federation") -> Path:
        """A PNG of the reward per round and the uplink bytes per round and level."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.6))
        a.plot(self.reward_curve, marker="o", ms=3)
        a.set_xlabel("round")
        a.set_ylabel("reward (root, sample-weighted)")
        a.set_title(title)
        levels = sorted({k for row in self.bytes_per_round for k in row})
        for lv in levels:
            b.plot([row.get(lv, 0) / 1024 for row in self.bytes_per_round], label=lv)
        b.set_xlabel("round")
        b.set_ylabel("KiB per round")
        b.legend()
        fig.tight_layout()
        p = Path(path)
        fig.savefig(p, dpi=120)
        plt.close(fig)
        return p


def rounds_to_fraction(
    curve: Sequence[float], fraction: float = 0.95, baseline: float | None = None
) -> int | None:
    """First round (1-based) at which ``curve`` has made ``fraction`` of its best improvement.

    Improvement is measured from ``baseline`` (default: the first value), so the measure also works
    for rewards that are negative: ``curve[i] >= baseline + fraction · (max(curve) - baseline)``.
    None if the curve never improves.
    """
    c = np.asarray([x for x in curve], dtype=np.float64)
    if c.size == 0 or not np.isfinite(c).any():
        return None
    c = np.where(np.isfinite(c), c, -np.inf)
    base = float(c[np.isfinite(c)][0]) if baseline is None else float(baseline)
    best = float(c.max())
    if best <= base:
        return None
    target = base + fraction * (best - base)
    return int(np.argmax(c >= target)) + 1


def _bytes_per_round(
    groups: Mapping[str, Sequence[RoundRecord]], root: HierarchyNode
) -> list[dict[str, int]]:
    level_of_inputs = {n.name: ("site" if n.members else n.children[0].level) for n in root.walk()}
    rounds = max((r.round for recs in groups.values() for r in recs), default=-1) + 1
    out: list[defaultdict[str, int]] = [defaultdict(int) for _ in range(rounds)]
    for name, recs in groups.items():
        for r in recs:
            out[r.round][level_of_inputs[name]] += r.bytes_up
            out[r.round]["down"] += r.bytes_down
    return [dict(x) for x in out]


def _sum_stats(buses: Sequence[Bus]) -> dict[str, Any]:
    seen: set[int] = set()
    total: dict[str, Any] = {
        "rejected": Counter(),
        "bytes_out": 0,
        "bytes_in": 0,
        "published": 0,
        "received": 0,
        "handler_errors": 0,
        "reconnects": 0,
        "disconnects": 0,
        "redelivered": 0,
    }
    for b in buses:
        if id(b) in seen:
            continue
        seen.add(id(b))
        s = b.stats
        total["rejected"].update(s.rejected)
        for k in (
            "bytes_out",
            "bytes_in",
            "published",
            "received",
            "handler_errors",
            "reconnects",
            "disconnects",
            "redelivered",
        ):
            total[k] += getattr(s, k)
    total["rejected"] = dict(total["rejected"])
    return total


# ------------------------------------------------------------------------------ in-process
@dataclass
class Federation:
    """The agents of an in-process federation (what `run_federation_async` builds and runs)."""

    config: FederationConfig
    root: HierarchyNode
    gca: GlobalCoordinationAgent
    coas: list[ClusterOrchestratorAgent]
    esas: list[EdgeServiceAgent]
    buses: list[Bus]

    @property
    def aggregators(self) -> list[AggregatorAgent]:
        return [self.gca, *self.coas]


def _build_learners(cfg: FederationConfig, sites: Sequence[SiteSpec], progress: bool) -> list[Any]:
    from tqdm.auto import tqdm

    return [
        make_learner(cfg.learner, s)
        for s in tqdm(sites, desc="building sites", unit="site", disable=not progress, leave=False)
    ]


async def build_federation(
    cfg: FederationConfig,
    bus: str | Callable[[str], Bus] = "memory",
    learners: Sequence[Any] | None = None,
    share_bus: str = "none",
    on_round: Callable[[RoundRecord], None] | None = None,
    progress: bool = False,
    exclude_sites: Sequence[str] = (),
    state_dir: str | Path | None = None,
    keys: FederationKeys | None = None,
    insecure: bool = False,
) -> Federation:
    """Build and start every agent of ``cfg`` in this process (without running rounds).

    Every message is signed by its sender's key and checked against the keyring on receipt
    (`edgetwin.edge.message_auth`): ``keys`` holds every agent's public key and the private keys
    of the agents built here; None: fresh keys for every agent (all in this process, so a
    keyring made here is complete and nobody else holds its private keys). With
    ``exclude_sites`` and no ``keys``, the agents elsewhere could hold no key of such a keyring,
    so this refuses (`InputError` naming ``keys``): pass ``keys`` from a keys directory, or
    ``insecure=True`` to run the federation unauthenticated (one warning line).

    Args:
        bus: ``"memory"`` (a fresh in-process broker), ``"nats://..."``, or a factory
            ``name -> Bus`` (not yet connected).
        learners: one per site (default: built from ``cfg.learner``).
        share_bus: ``"none"`` (a bus client per agent), ``"cluster"`` (the ESAs of a group share
            one client: hundreds of agents on one machine) or ``"all"``.
        exclude_sites: sites whose ESA runs elsewhere (e.g. a subprocess).
        state_dir: ESA checkpoints go to ``state_dir/<site>`` (None: no checkpoints).
    """
    root, parent_of, leaf_of = build_tree(cfg)
    sites = cfg.site_specs()
    if keys is None and exclude_sites and not insecure:  # before any bus is connected
        raise InputError(f"sites {sorted(exclude_sites)} run outside this process: pass keys from a keys directory "
                         f"(FederationKeys.load) or insecure=True ({INSECURE_FLAG}) to run unauthenticated",
                         where="keys")
    if share_bus not in ("none", "cluster", "all"):
        raise InputError(
            f"share_bus must be 'none', 'cluster' or 'all', got {share_bus!r}", where="share_bus"
        )
    factory: Callable[[str], Bus]
    if isinstance(bus, str):
        spec = bus if bus != "memory" else f"memory://fed-{cfg.run}"

        def make(name: str) -> Bus:
            return make_bus(spec, name=name)

        factory = make
    else:
        factory = bus
    buses: list[Bus] = []
    shared: dict[str, Bus] = {}
    speaks: dict[int, list[str]] = defaultdict(list)  # id(bus) -> identities it signs for

    async def client(name: str, key: str | None = None, identity: str = "") -> Bus:
        if key is not None and key in shared:
            speaks[id(shared[key])].append(identity)
            return shared[key]
        b = factory(name)
        await b.connect()
        buses.append(b)
        speaks[id(b)].append(identity)
        if key is not None:
            shared[key] = b
        return b

    if learners is None:
        learners = _build_learners(cfg, [s for s in sites if s.name not in exclude_sites], progress)
        it = iter(learners)
        learners = [None if s.name in exclude_sites else next(it) for s in sites]
    if len(learners) != len(sites):
        raise InputError(f"{len(learners)} learners for {len(sites)} sites", where="learners")
    learners = [None if s.name in exclude_sites else ln for s, ln in zip(sites, learners, strict=True)]
    init = (
        next(ln for ln in learners if ln is not None).get_params()
        if any(ln is not None for ln in learners)
        else make_learner(cfg.learner, sites[0]).get_params()
    )
    gca = GlobalCoordinationAgent(
        await client("gca", "all" if share_bus == "all" else None, f"agg/{root.name}"),
        root,
        cfg.run,
        initial_params=init,
        on_round=on_round,
        codec=cfg.make_codec(),
        model_wait_s=cfg.model_wait_s,
    )
    coas = []
    for node in list(root.walk())[1:]:
        parent = parent_of[node.name]
        key = "all" if share_bus == "all" else (node.name if share_bus == "cluster" else None)
        coas.append(
            ClusterOrchestratorAgent(
                await client(f"coa-{node.name}", key, f"agg/{node.name}"),
                node,
                cfg.run,
                parent=(parent.level, parent.name),
                codec=cfg.make_codec(),
                model_wait_s=cfg.model_wait_s,
            )
        )
    esas = []
    peers: dict[str, list[str]] = defaultdict(list)
    for s in sites:
        peers[s.cluster].append(s.name)
    for i, (s, ln) in enumerate(zip(sites, learners, strict=True)):
        if ln is None:
            continue
        leaf = leaf_of[s.name]
        key = "all" if share_bus == "all" else (leaf.name if share_bus == "cluster" else None)
        attack = Attack(**cfg.attacks[s.name]) if s.name in cfg.attacks else None
        esas.append(
            EdgeServiceAgent(
                await client(f"esa-{s.name}", key, f"esa/{s.name}"),
                s,
                ln,
                parent=(leaf.level, leaf.name),
                run=cfg.run,
                peers=peers[s.cluster],
                codec=cfg.make_codec(),
                attack=attack,
                state_dir=None if state_dir is None else Path(state_dir) / s.name,
                model_wait_s=cfg.model_wait_s,
                seed=cfg.seed * 1000 + i,
            )
        )
    if keys is None and not exclude_sites:
        keys = FederationKeys.generate(i for ids in speaks.values() for i in ids)
    if keys is None:
        log.warning("federation %s runs unauthenticated (%s): agents outside this process and no keys",
                    cfg.run, INSECURE_FLAG)
    else:
        for b in buses:
            b.auth = keys.auth(*speaks[id(b)])
    # Subscribe bottom-up so that nobody misses the first round's messages.
    for a in esas:
        await a.start()
    for c in reversed(coas):
        await c.start()
    await gca.start()
    return Federation(cfg, root, gca, coas, esas, buses)


async def _finish(fed: Federation, timeout: float) -> None:
    """Wait (bounded) until every agent saw the close, then stop the agents and close the buses."""
    waits = [a.done.wait() for a in [*fed.coas, *fed.esas]]
    if waits:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.gather(*waits), timeout)
    for a in [*fed.esas, *fed.coas, fed.gca]:
        await a.stop()
    for b in fed.buses:
        with contextlib.suppress(Exception):
            await b.close()


def _result(fed: Federation, elapsed: float, final_rewards: dict[str, float]) -> FederationResult:
    groups = {a.node.name: a.records for a in fed.aggregators}
    refused: Counter[str] = Counter()
    for a in [*fed.aggregators, *fed.esas]:
        refused.update(a.refused)
    return FederationResult(
        rounds=[r.to_dict() for r in fed.gca.records],
        groups={k: [r.to_dict() for r in v] for k, v in groups.items()},
        sites={e.site.name: list(e.records) for e in fed.esas},
        final_rewards=final_rewards,
        bytes_per_round=_bytes_per_round(groups, fed.root),
        bus=_sum_stats(fed.buses),
        refused=dict(refused),
        elapsed_s=elapsed,
        config=fed.config.to_dict(),
    )


def _final_reward(learner: Any) -> float:
    if hasattr(learner, "evaluate"):
        return float(learner.evaluate())
    rets = getattr(learner, "last_returns", [])
    return float(np.mean(rets)) if rets else float("nan")


async def run_federation_async(
    cfg: FederationConfig,
    bus: str | Callable[[str], Bus] = "memory",
    processes: bool = False,
    progress: bool = True,
    learners: Sequence[Any] | None = None,
    share_bus: str = "none",
    workdir: str | Path | None = None,
) -> FederationResult:
    """Run ``cfg`` to the end and return its `FederationResult` (see `run_federation`)."""
    if processes:
        if not isinstance(bus, str) or not bus.startswith(("nats://", "tls://")):
            raise InputError("--processes needs a NATS bus (--bus nats://host:port)", where="--bus")
        return await _run_processes(cfg, bus, progress, workdir)
    from tqdm.auto import tqdm

    bars: list[Any] = []

    def on_round(rec: RoundRecord) -> None:
        if bars:
            bars[0].update(1)
            bars[0].set_postfix(reward=f"{rec.reward:.3f}", reason=rec.reason, late=len(rec.late))

    t0 = time.perf_counter()
    fed = await build_federation(
        cfg, bus, learners=learners, share_bus=share_bus, on_round=on_round, progress=progress
    )
    bar = tqdm(total=cfg.rounds, desc="federated rounds", unit="round", disable=not progress)
    bars.append(bar)
    try:
        await fed.gca.run(cfg.rounds)
        await _finish(fed, timeout=cfg.model_wait_s + 5.0)
    finally:
        bar.close()
        for a in [*fed.esas, *fed.coas, fed.gca]:
            await a.stop()
        for b in fed.buses:
            with contextlib.suppress(Exception):
                await b.close()
        if isinstance(bus, str) and bus == "memory":
            from edgetwin.edge.bus import MemoryBroker

            MemoryBroker.forget(f"fed-{cfg.run}")
    final = {e.site.name: _final_reward(e.learner) for e in fed.esas}
    return _result(fed, time.perf_counter() - t0, final)


def run_federation(
    cfg: FederationConfig,
    bus: str | Callable[[str], Bus] = "memory",
    processes: bool = False,
    progress: bool = True,
    learners: Sequence[Any] | None = None,
    share_bus: str = "none",
    workdir: str | Path | None = None,
) -> FederationResult:
    """Run a federation on this machine.

    Args:
        cfg: the federation.
        bus: ``"memory"`` (embedded), ``"nats://host:port"``, or a bus factory.
        processes: one OS process per agent (``edgetwin agent ...``), over NATS.
        progress: a progress bar over rounds.
        learners: prebuilt learners, one per site (in-process only).
        share_bus: see `build_federation`.
        workdir: where subprocess agents keep their config, logs and state (default: a temp dir).
    """
    return asyncio.run(run_federation_async(cfg, bus, processes, progress, learners, share_bus, workdir))


def train_independent(
    sites: Sequence[SiteSpec],
    learner: Mapping[str, Any],
    rounds: int,
    progress: bool = False,
    learners: Sequence[Any] | None = None,
) -> dict[str, list[dict[str, float]]]:
    """The no-federation baseline: every site trains its learner alone for ``rounds`` rounds.

    Returns:
        site -> its per-round training metrics (``reward`` etc.).
    """
    from tqdm.auto import tqdm

    lns = list(learners) if learners is not None else [make_learner(learner, s) for s in sites]
    out: dict[str, list[dict[str, float]]] = {s.name: [] for s in sites}
    for _ in tqdm(range(rounds), desc="independent rounds", unit="round", disable=not progress):
        for s, ln in zip(sites, lns, strict=True):
            out[s.name].append(ln.train())
    return out


# ------------------------------------------------------------------------------ processes
def federation_identities(cfg: FederationConfig) -> list[str]:
    """Every party of ``cfg`` as it signs: ``agg/<group>`` per aggregator (the GCA is the root
    group), ``esa/<site>`` per site (what `edgetwin agent-keys` needs to make its keys directory)."""
    root, _, _ = build_tree(cfg)
    return [f"agg/{n.name}" for n in root.walk()] + [f"esa/{s.name}" for s in cfg.site_specs()]


async def run_agent(
    role: str,
    cfg: FederationConfig,
    bus_spec: str,
    name: str | None = None,
    state_dir: str | Path | None = None,
    result_path: str | Path | None = None,
    emit: Callable[[dict[str, Any]], None] | None = None,
    insecure: bool = False,
) -> dict[str, Any]:
    """Run one agent of ``cfg`` until the federation closes (what ``edgetwin agent`` does).

    Its keys come from the keys directory in `KEYS_ENV`; without one it refuses to talk over a
    bus outside this process (`InputError` naming ``--keys``) unless ``insecure``
    (`edgetwin.edge.message_auth.require_auth`).

    Args:
        role: ``"esa"``, ``"coa"`` or ``"gca"``.
        name: the site (ESA) or group (COA) it runs; not needed for the GCA.
        state_dir: ESA checkpoint directory (a restarted ESA finishes the round it was in).
        result_path: the GCA writes the `FederationResult` JSON here.
        emit: called with one JSON-able dict per event (the GCA: per round).
    """
    root, parent_of, leaf_of = build_tree(cfg)
    if role not in ("esa", "coa", "gca"):
        raise InputError(f"role must be esa, coa or gca, got {role!r}", where="ROLE")
    sites = {s.name: s for s in cfg.site_specs()}
    identity = f"esa/{name}" if role == "esa" else f"agg/{name}" if role == "coa" else f"agg/{root.name}"
    auth = require_auth(identity, bus=bus_spec, insecure=insecure)
    bus = make_bus(bus_spec, name=f"{role}-{name or 'global'}")
    bus.auth = auth
    await bus.connect()
    t0 = time.perf_counter()
    try:
        if role == "esa":
            if name not in sites:
                raise InputError(f"unknown site {name!r}; the config has {sorted(sites)}", where="--name")
            s = sites[name]
            leaf = leaf_of[name]
            peers = [x.name for x in sites.values() if x.cluster == s.cluster]
            attack = Attack(**cfg.attacks[name]) if name in cfg.attacks else None
            esa = EdgeServiceAgent(
                bus,
                s,
                make_learner(cfg.learner, s),
                parent=(leaf.level, leaf.name),
                run=cfg.run,
                peers=peers,
                codec=cfg.make_codec(),
                attack=attack,
                state_dir=state_dir,
                model_wait_s=cfg.model_wait_s,
                seed=cfg.seed * 1000 + list(sites).index(name),
            )
            await esa.start()
            if emit:
                emit({"event": "ready", "agent": esa.name, "version": esa.version})
            await esa.done.wait()
            await esa.stop()
            return {"agent": esa.name, "records": esa.records, "final_reward": _final_reward(esa.learner)}
        if role == "coa":
            nodes = {n.name: n for n in root.walk()}
            if name not in nodes or name == root.name:
                raise InputError(
                    f"unknown group {name!r}; the config has {sorted(set(nodes) - {root.name})}",
                    where="--name",
                )
            parent = parent_of[name]
            coa = ClusterOrchestratorAgent(
                bus,
                nodes[name],
                cfg.run,
                parent=(parent.level, parent.name),
                codec=cfg.make_codec(),
                model_wait_s=cfg.model_wait_s,
            )
            await coa.start()
            if emit:
                emit({"event": "ready", "agent": coa.name})
            await coa.done.wait()
            await coa.stop()
            return {
                "agent": coa.name,
                "records": [r.to_dict() for r in coa.records],
                "refused": dict(coa.refused),
            }
        init = make_learner(cfg.learner, next(iter(sites.values()))).get_params()

        def on_round(rec: RoundRecord) -> None:
            if emit:
                emit({"event": "round", **rec.to_dict()})

        gca = GlobalCoordinationAgent(
            bus,
            root,
            cfg.run,
            initial_params=init,
            on_round=on_round,
            codec=cfg.make_codec(),
            model_wait_s=cfg.model_wait_s,
        )
        await gca.start()
        await gca.run(cfg.rounds)
        groups = {root.name: gca.records}
        res = FederationResult(
            rounds=[r.to_dict() for r in gca.records],
            groups={k: [r.to_dict() for r in v] for k, v in groups.items()},
            sites={},
            final_rewards={},
            bytes_per_round=_bytes_per_round(groups, root),
            bus=_sum_stats([bus]),
            refused=dict(gca.refused),
            elapsed_s=time.perf_counter() - t0,
            config=cfg.to_dict(),
        )
        # summaries from the COAs carry their byte counts: add the site level
        for name_, stats in gca.summaries.items():
            for st in stats:
                r = int(st.get("round", -1))
                if 0 <= r < len(res.bytes_per_round) and name_ != root.name:
                    res.bytes_per_round[r]["site"] = res.bytes_per_round[r].get("site", 0) + int(
                        st.get("bytes_up", 0)
                    )
        await gca.stop()
        doc = res.to_dict()
        if result_path is not None:
            Path(result_path).write_text(json.dumps(doc, default=_json_default))
        return doc
    finally:
        await bus.close()


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    raise TypeError(f"not JSON serialisable: {type(o).__name__}")


def agent_command(
    role: str,
    config_path: Path,
    bus: str,
    name: str | None = None,
    state_dir: Path | None = None,
    result: Path | None = None,
) -> list[str]:
    """The command line of one subprocess agent."""
    cmd = [sys.executable, "-m", "edgetwin.cli", "agent", role, "--bus", bus, "--config", str(config_path)]
    if name is not None:
        cmd += ["--name", name]
    if state_dir is not None:
        cmd += ["--state-dir", str(state_dir)]
    if result is not None:
        cmd += ["--result", str(result)]
    return cmd


async def _run_processes(
    cfg: FederationConfig, bus: str, progress: bool, workdir: str | Path | None
) -> FederationResult:
    import tempfile

    from tqdm.auto import tqdm

    root, _, _ = build_tree(cfg)
    tmp = None
    if workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="edgetwin-fed-")
        workdir = tmp.name
    wd = Path(workdir)
    wd.mkdir(parents=True, exist_ok=True)
    cfg_path = cfg.save(wd / "federation.json")
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    if not env.get(KEYS_ENV):  # every agent on this machine: one keys directory with all their keys
        env[KEYS_ENV] = str(write_keys(wd / "keys", federation_identities(cfg), overwrite=True))
    procs: list[asyncio.subprocess.Process] = []
    logs = []

    async def spawn(role: str, name: str | None, **kw: Any) -> asyncio.subprocess.Process:
        log_path = wd / f"{role}-{name or 'global'}.log"
        f = log_path.open("wb")
        logs.append(f)
        p = await asyncio.create_subprocess_exec(
            *agent_command(role, cfg_path, bus, name, **kw),
            stdout=asyncio.subprocess.PIPE if role == "gca" else f,
            stderr=f,
            env=env,
        )
        procs.append(p)
        return p

    bar = tqdm(total=cfg.rounds, desc="federated rounds", unit="round", disable=not progress)
    t0 = time.perf_counter()
    result_path = wd / "result.json"
    try:
        ready = []
        for s in cfg.site_specs():
            ready.append(await spawn("esa", s.name, state_dir=wd / f"state-{s.name}"))
        for node in list(root.walk())[1:]:
            ready.append(await spawn("coa", node.name))
        # Give the subscribers time to start before the GCA opens round 0; the rounds tolerate
        # late joiners anyway (a missed round closes on its quorum or timeout).
        await asyncio.sleep(min(30.0, 2.0 + 0.1 * len(ready)))
        gca = await spawn("gca", None, result=result_path)
        assert gca.stdout is not None
        while True:
            line = await gca.stdout.readline()
            if not line:
                break
            with contextlib.suppress(json.JSONDecodeError):
                ev = json.loads(line)
                if ev.get("event") == "round":
                    bar.update(1)
                    bar.set_postfix(reward=ev.get("reward"), reason=ev.get("reason"))
        rc = await gca.wait()
        if rc != 0:
            raise RuntimeError(f"the GCA process exited with {rc}; see {wd / 'gca-global.log'}")
        for p in procs:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(p.wait(), timeout=cfg.model_wait_s + 10.0)
    finally:
        bar.close()
        for p in procs:
            if p.returncode is None:
                p.terminate()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(p.wait(), 5.0)
                if p.returncode is None:
                    p.kill()
                    await p.wait()
        for f in logs:
            f.close()
    doc = json.loads(result_path.read_text())
    doc["elapsed_s"] = time.perf_counter() - t0
    if tmp is not None:
        tmp.cleanup()
    return FederationResult(**doc)
