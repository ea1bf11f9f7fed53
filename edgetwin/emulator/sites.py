"""Sites of the emulated edge-cloud continuum: edge clusters and cloud regions.

The default topology follows seed 003 §5.3: three edge clusters of 10-16 heterogeneous nodes
(64-96 vCPUs, 1-3 GPUs) and two cloud regions of 200 vCPUs and 8 GPUs each; RTTs of 5-15 ms from a
service group to its edge cluster and 20-40 ms to the cloud, with jitter up to 2x. Each site has an
energy source (a grid zone with hourly carbon intensity) and air or liquid cooling (seed 002).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from edgetwin.contract.errors import InputError
from edgetwin.emulator.energy import SPECPOWER_CURVES, Cooling, PowerModel

SiteKind = Literal["edge", "cloud"]


@dataclass(frozen=True)
class NodeGroup:
    """``count`` identical nodes.

    Attributes:
        count: number of nodes.
        vcpu: vCPUs per node.
        memory_gb: memory per node (GB).
        gpus: GPUs per node.
        power: the node's power model (W as a function of utilisation).
        speed: per-vCPU speed relative to the reference core that profile task times are given for.
    """

    count: int
    vcpu: int
    memory_gb: float
    gpus: int = 0
    power: PowerModel = field(default_factory=lambda: PowerModel(SPECPOWER_CURVES["IbmX3250XeonX3470"]))
    speed: float = 1.0

    def scaled(self, factor: float) -> NodeGroup:
        return replace(self, count=max(1, int(round(self.count * factor))))


@dataclass(frozen=True)
class Site:
    """An edge cluster or cloud region.

    Attributes:
        name: site label (the ``site`` column of the log for edge sites).
        kind: ``"edge"`` or ``"cloud"``.
        nodes: its node groups (heterogeneous hardware).
        rtt_ms: (low, high) base round-trip time from a service group homed at an edge site; the
            base RTT of each group is drawn in this range.
        jitter: relative RTT jitter: each tick multiplies the base RTT by ``1 + jitter·Beta(2, 5)``
            (``1.0`` = up to 2x, seed 003).
        zone: grid zone of its energy source (carbon intensity series).
        cooling: its cooling model.
        cloud: for an edge site, the cloud region it offloads to.
        weight: share of the service-group population homed at this (edge) site.
        background_util: mean utilisation by other tenants (diurnal around this mean).
        gpu_slots_per_gpu: concurrent GPU tasks one GPU serves (time-slicing / MIG).
    """

    name: str
    kind: SiteKind
    nodes: tuple[NodeGroup, ...]
    rtt_ms: tuple[float, float]
    zone: str
    cooling: Cooling = field(default_factory=Cooling)
    jitter: float = 1.0
    cloud: str | None = None
    weight: float = 1.0
    background_util: float = 0.25
    gpu_slots_per_gpu: int = 4

    def __post_init__(self) -> None:
        if self.kind not in ("edge", "cloud"):
            raise InputError(f"site {self.name!r}: kind must be 'edge' or 'cloud', got {self.kind!r}", "sites")
        if not self.nodes:
            raise InputError(f"site {self.name!r} has no nodes", "sites")
        if not 0 <= self.rtt_ms[0] <= self.rtt_ms[1]:
            raise InputError(f"site {self.name!r}: rtt_ms must be (low, high) with 0 <= low <= high", "sites")

    @property
    def vcpu(self) -> int:
        return sum(g.count * g.vcpu for g in self.nodes)

    @property
    def gpus(self) -> int:
        return sum(g.count * g.gpus for g in self.nodes)

    @property
    def memory_gb(self) -> float:
        return float(sum(g.count * g.memory_gb for g in self.nodes))

    @property
    def n_nodes(self) -> int:
        return sum(g.count for g in self.nodes)

    @property
    def speed(self) -> float:
        """vCPU-weighted mean per-vCPU speed."""
        return float(sum(g.count * g.vcpu * g.speed for g in self.nodes) / self.vcpu)

    def power_watts(self, util: np.ndarray | float) -> np.ndarray:
        """IT power (W) of the whole site when all nodes run at utilisation ``util`` (load balanced)."""
        return sum(g.count * g.power.watts(util) for g in self.nodes)  # type: ignore[return-value]

    @property
    def idle_watts(self) -> float:
        return float(self.power_watts(0.0))

    @property
    def dynamic_watts_per_vcpu(self) -> float:
        """Extra IT power (W) per busy vCPU: the slope of the site's power curve."""
        return float((self.power_watts(1.0) - self.power_watts(0.0)) / self.vcpu)

    def scaled(self, factor: float) -> Site:
        """The same site with ``factor`` times as many nodes (at least one per group)."""
        nodes = tuple(g.scaled(factor) for g in self.nodes)
        air_peak = self.cooling.air_peak_w * (sum(g.count for g in nodes) / self.n_nodes)
        return replace(self, nodes=nodes, cooling=replace(self.cooling, air_peak_w=air_peak))


def _pm(model: str, iota: float = 1.0) -> PowerModel:
    return PowerModel(SPECPOWER_CURVES[model], iota=iota)


def default_sites() -> tuple[Site, ...]:
    """Three edge clusters and two cloud regions (seed 003 §5.3 sizes, seed 002 energy mix)."""
    return (
        Site(
            name="edge-ams",
            kind="edge",
            nodes=(
                NodeGroup(8, 8, 32, 0, _pm("IbmX3250XeonX3470"), speed=0.9),
                NodeGroup(2, 12, 64, 1, _pm("IbmX3550XeonX5670"), speed=1.1),
            ),
            rtt_ms=(5.0, 10.0),
            zone="NL",
            cooling=Cooling(mode="air", air_peak_w=1500.0),
            cloud="cloud-par",
            weight=0.40,
            background_util=0.20,
        ),
        Site(
            name="edge-fra",
            kind="edge",
            nodes=(
                NodeGroup(12, 6, 24, 0, _pm("HpProLiantMl110G5Xeon3075", iota=0.95), speed=0.8),
                NodeGroup(1, 12, 64, 1, _pm("IbmX3550XeonX5675"), speed=1.1),
            ),
            rtt_ms=(7.0, 12.0),
            zone="DE",
            cooling=Cooling(mode="air", air_peak_w=1700.0),
            cloud="cloud-par",
            weight=0.35,
            background_util=0.30,
        ),
        Site(
            name="edge-waw",
            kind="edge",
            nodes=(
                NodeGroup(12, 4, 16, 0, _pm("HpProLiantMl110G4Xeon3040", iota=1.05), speed=0.7),
                NodeGroup(2, 12, 48, 1, _pm("IbmX3550XeonX5670"), speed=1.0),
            ),
            rtt_ms=(10.0, 15.0),
            zone="PL",
            cooling=Cooling(mode="liquid", air_peak_w=1400.0),
            cloud="cloud-sto",
            weight=0.25,
            background_util=0.25,
        ),
        Site(
            name="cloud-par",
            kind="cloud",
            nodes=(
                NodeGroup(12, 12, 96, 0, _pm("IbmX3550XeonX5675"), speed=1.2),
                NodeGroup(4, 14, 128, 2, _pm("IbmX3550XeonX5670"), speed=1.2),
            ),
            rtt_ms=(20.0, 35.0),
            zone="FR",
            cooling=Cooling(mode="liquid", air_peak_w=3500.0),
            background_util=0.45,
        ),
        Site(
            name="cloud-sto",
            kind="cloud",
            nodes=(
                NodeGroup(12, 12, 96, 0, _pm("IbmX3550XeonX5675"), speed=1.2),
                NodeGroup(4, 14, 128, 2, _pm("IbmX3550XeonX5670"), speed=1.2),
            ),
            rtt_ms=(25.0, 40.0),
            zone="SE",
            cooling=Cooling(mode="liquid", air_peak_w=3500.0, adaptive=False),
            background_util=0.40,
        ),
    )


def check_topology(sites: tuple[Site, ...]) -> None:
    """Raise `InputError` unless there is an edge site and every edge site names a known cloud."""
    names = [s.name for s in sites]
    if len(set(names)) != len(names):
        raise InputError(f"site names must be unique, got {names}", "sites")
    clouds = {s.name for s in sites if s.kind == "cloud"}
    edges = [s for s in sites if s.kind == "edge"]
    if not edges:
        raise InputError("the topology needs at least one edge site", "sites")
    for s in edges:
        if s.cloud not in clouds:
            raise InputError(f"edge site {s.name!r} offloads to {s.cloud!r}, not a cloud site of {sorted(clouds)}", "sites")
        if s.weight <= 0:
            raise InputError(f"edge site {s.name!r}: weight must be > 0", "sites")
