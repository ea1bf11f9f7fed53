"""Hierarchical aggregation (site -> cluster -> region -> global) from config.

A hierarchy is a tree of groups; each node names its strategy and either its member sites (a leaf
group) or its child groups. In TOML::

    [aggregation]
    name = "global"
    strategy = { name = "fedavgm", momentum = 0.9 }

    [[aggregation.children]]
    name = "cluster-0"
    strategy = { name = "trimmed_mean", beta = 0.2, byzantine_fraction = 0.1 }
    members = ["site-0", "site-1", "site-2", "site-3", "site-4"]
    participation = [0.6, 0.8]      # share of members sampled per round
    quorum = 3                      # the round closes on k-of-n (+ grace), see RoundCollector
    staleness = { exponent = 0.5, max_staleness = 4 }
    secure = false                  # secure aggregation (linear strategies only)

Each node aggregates what its children produced: a child group contributes its new model minus
the current global model, weighted by the samples behind it. Configurations that cannot work are
refused by `build_hierarchy` with an `InputError` naming the node: Krum with fewer than ``2f + 3``
updates per round (counting the quorum the round may close with), a trimmed-mean cut below the
assumed Byzantine fraction, a robust / personalising rule behind secure aggregation, participation
outside (0, 1], a quorum above the fewest participants, a site in two groups.
"""

from __future__ import annotations

import json
import math
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from edgetwin.contract.errors import InputError
from edgetwin.federation.aggregation.base import AggregateResult, Aggregator, ClientUpdate, QuorumNotMet
from edgetwin.federation.aggregation.fedavg import ClientSampler, StalenessAware
from edgetwin.federation.aggregation.robust import Krum
from edgetwin.federation.aggregation.secure import SecureAggregator
from edgetwin.federation.aggregation.strategies import make_aggregator

__all__ = ["HierarchyNode", "build_hierarchy", "load_hierarchy"]

@dataclass
class HierarchyNode:
    """One aggregation group.

    Attributes:
        name: unique in the tree (a subject token: no '.', '*', '>' or spaces).
        level: ``"global"``, ``"region"``, ``"cluster"`` or as configured.
        aggregator: its strategy (wrapped for staleness / secure aggregation as configured).
        members: the sites it aggregates (leaf groups), else empty.
        children: child groups, else empty.
        sampler: partial participation among members / children (None: all).
        quorum: k, the fewest updates its round may close with.
        grace_s, timeout_s: of its `RoundCollector`.
    """

    name: str
    level: str
    aggregator: Aggregator
    members: list[str] = field(default_factory=list)
    children: list[HierarchyNode] = field(default_factory=list)
    sampler: ClientSampler | None = None
    quorum: int = 1
    grace_s: float = 1.0
    timeout_s: float = 30.0

    @property
    def inputs(self) -> list[str]:
        """Ids of what this node aggregates: member sites or child group names."""
        return list(self.members) if self.members else [c.name for c in self.children]

    def walk(self) -> Iterator[HierarchyNode]:
        """This node and all below it, parents first."""
        yield self
        for c in self.children:
            yield from c.walk()

    def sites(self) -> list[str]:
        """All sites under this node."""
        return [s for n in self.walk() for s in n.members]

    def participants(self, round: int) -> list[str]:
        """Inputs asked to report in ``round`` (a seeded sample under partial participation)."""
        return self.sampler.sample(self.inputs, round) if self.sampler else self.inputs

    def aggregate(self, updates: Mapping[str, ClientUpdate], global_params: np.ndarray, round: int = 0) -> AggregateResult:
        """Aggregate site ``updates`` up this subtree.

        Returns the node's new model; ``info["num_samples"]`` is the weight behind it, child
        groups' results are under ``info["children"]`` and site-level personalised models (from
        personalising leaf groups) are collected into ``personalized``.
        """
        g = np.asarray(global_params, dtype=np.float32)
        personalized: dict[str, np.ndarray] = {}
        child_info: dict[str, Any] = {}
        if self.members:
            ups = [updates[m] for m in self.members if m in updates]
        else:
            ups = []
            for c in self.children:
                try:
                    res = c.aggregate(updates, g, round)
                except QuorumNotMet as e:
                    child_info[c.name] = {"skipped": str(e)}
                    continue
                personalized.update(res.personalized)
                child_info[c.name] = res.info
                ups.append(ClientUpdate(c.name, res.params - g, float(res.info["num_samples"]), round))
        if len(ups) < self.quorum:
            raise QuorumNotMet(f"{self.level} {self.name!r}: {len(ups)} updates, quorum is {self.quorum}")
        res = self.aggregator.aggregate(ups, g, round)
        if self.members:
            personalized.update(res.personalized)
        res.personalized = personalized
        res.info.update({"node": self.name, "level": self.level, "num_samples": float(sum(u.num_samples for u in ups))})
        if child_info:
            res.info["children"] = child_info
        return res


def _where(path: Sequence[str]) -> str:
    return "aggregation config: " + "/".join(path)


def _check_name(name: Any, where: str) -> str:
    if not isinstance(name, str) or not name or any(c in name for c in ".*> \t\r\n"):
        raise InputError(f"name {name!r} must be a non-empty string without '.', '*', '>' or spaces", where=where)
    return name


def _build(cfg: Mapping[str, Any], path: list[str], depth: int, seen: set[str], seed: int) -> HierarchyNode:
    if not isinstance(cfg, Mapping):
        raise InputError(f"a group is a table, got {type(cfg).__name__}", where=_where(path))
    allowed = {"name", "level", "strategy", "members", "children", "participation", "quorum", "staleness", "secure",
               "grace_s", "timeout_s", "seed"}
    unknown = sorted(set(cfg) - allowed)
    name = _check_name(cfg.get("name", "global" if depth == 0 else None), _where(path))
    path = [*path[:-1], name] if path and path[-1] == "?" else [*path, name]
    where = _where(path)
    if unknown:
        raise InputError(f"unknown keys {unknown}; allowed: {sorted(allowed)}", where=where)
    if name in seen:
        raise InputError(f"group or site {name!r} appears twice", where=where)
    seen.add(name)
    members, children_cfg = cfg.get("members"), cfg.get("children")
    if (members is None) == (children_cfg is None):
        raise InputError("a group has either 'members' (sites) or 'children' (groups)", where=where)
    children: list[HierarchyNode] = []
    if members is not None:
        if not isinstance(members, list) or not members:
            raise InputError("'members' must be a non-empty list of site names", where=where)
        for m in members:
            _check_name(m, where)
            if m in seen:
                raise InputError(f"site {m!r} is in two groups", where=where)
            seen.add(m)
        n = len(members)
    else:
        if not isinstance(children_cfg, list) or not children_cfg:
            raise InputError("'children' must be a non-empty list of groups", where=where)
        children = [_build(c, [*path, "?"], depth + 1, seen, seed) for c in children_cfg]
        n = len(children)
    level = cfg.get("level") or ("global" if depth == 0 else "cluster" if members is not None else "region")
    node_seed = int(cfg.get("seed", seed))
    participation = cfg.get("participation")
    sampler = None
    if participation is not None:
        if isinstance(participation, list) and len(participation) == 2:
            participation = (float(participation[0]), float(participation[1]))
        elif not isinstance(participation, int | float) or isinstance(participation, bool):
            raise InputError(f"participation is a share or [low, high], got {participation!r}", where=f"{where}: participation")
        try:
            sampler = ClientSampler(participation, seed=node_seed)
        except InputError as e:
            raise InputError(str(e), where=f"{where}: participation") from None
    fewest = sampler.expected_min(n) if sampler else n
    q = cfg.get("quorum", fewest)
    if isinstance(q, float):
        if not 0.0 < q <= 1.0:
            raise InputError(f"a quorum share must be in (0, 1], got {q}", where=f"{where}: quorum")
        q = max(1, math.ceil(q * n))
    if not isinstance(q, int) or isinstance(q, bool) or not 1 <= q <= n:
        raise InputError(f"quorum must be in [1, {n}] or a share, got {cfg.get('quorum')!r}", where=f"{where}: quorum")
    if q > fewest:
        raise InputError(f"quorum {q} exceeds the {fewest} inputs a round samples at the lowest participation", where=f"{where}: quorum")
    agg = make_aggregator(cfg.get("strategy", "fedavg"), num_clients=q, where=f"{where}: strategy")
    if isinstance(agg, Krum):
        try:
            agg.check_n(q, where=f"{where}: quorum")
        except InputError as e:
            raise InputError(f"{e} (a round may close with the quorum of {q} updates)", where=None) from None
    st = cfg.get("staleness")
    if st is not None:
        if not isinstance(st, Mapping):
            raise InputError("staleness is a table {exponent, max_staleness}", where=f"{where}: staleness")
        try:
            agg = StalenessAware(agg, **st)
        except TypeError as e:
            raise InputError(str(e), where=f"{where}: staleness") from None
    if cfg.get("secure", False):
        try:
            agg = SecureAggregator(agg, seed=cfg.get("seed"))
        except InputError as e:
            raise InputError(str(e), where=f"{where}: secure") from None
        if agg.threshold(n) > q:
            raise InputError(
                f"secure aggregation needs {agg.threshold(n)} survivors, above the quorum {q}", where=f"{where}: quorum"
            )
    grace_s, timeout_s = float(cfg.get("grace_s", 1.0)), float(cfg.get("timeout_s", 30.0))
    if not (grace_s >= 0 and timeout_s > 0):
        raise InputError(f"need grace_s >= 0 and timeout_s > 0, got {grace_s}, {timeout_s}", where=where)
    return HierarchyNode(name, level, agg, list(members or []), children, sampler, q, grace_s, timeout_s)


def build_hierarchy(config: Mapping[str, Any], seed: int = 0) -> HierarchyNode:
    """The root `HierarchyNode` of an ``[aggregation]`` table (or the table itself)."""
    cfg = config.get("aggregation", config) if isinstance(config, Mapping) else config
    return _build(cfg, [], 0, set(), seed)


def load_hierarchy(path: str | Path, seed: int = 0) -> HierarchyNode:
    """`build_hierarchy` from a TOML or JSON file."""
    p = Path(path)
    try:
        text = p.read_text()
        cfg = json.loads(text) if p.suffix == ".json" else tomllib.loads(text)
    except OSError as e:
        raise InputError(f"cannot read: {e.strerror}", where=str(p)) from None
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as e:
        raise InputError(f"not valid {'JSON' if p.suffix == '.json' else 'TOML'}: {e}", where=str(p)) from None
    try:
        return build_hierarchy(cfg, seed)
    except InputError as e:
        raise InputError(str(e), where=str(p)) from None
