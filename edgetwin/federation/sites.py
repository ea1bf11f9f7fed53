"""A federation's sites: who each ESA trains for (`SiteSpec`, built from archetypes by
`heterogeneous_sites`), and what an ESA knows about its site now (`SiteTelemetry`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from edgetwin.contract.errors import InputError
from edgetwin.edge.bus import Subjects

__all__ = [
    "SiteSpec",
    "SiteTelemetry",
    "heterogeneous_sites",
]

#: Site archetypes (seed 000 Table 3: clients differ in workload and machines). Each is a scenario
#: mix (mbb video-heavy, iot, iov), a provisioning level and a drift (days of behaviour change).
SITE_ARCHETYPES: tuple[dict[str, Any], ...] = (
    {"scenario_weights": {"mbb": 0.8, "iot": 0.1, "iov": 0.1}, "target_util": 0.35, "drift": "0d"},
    {"scenario_weights": {"mbb": 0.1, "iot": 0.8, "iov": 0.1}, "target_util": 0.65, "drift": "1w"},
    {"scenario_weights": {"mbb": 0.1, "iot": 0.1, "iov": 0.8}, "target_util": 0.8, "drift": "1m"},
    {"scenario_weights": {"mbb": 0.34, "iot": 0.33, "iov": 0.33}, "target_util": 0.5, "drift": "1d"},
)


@dataclass
class SiteSpec:
    """One edge site of a federation: its name, its aggregation group and its local system.

    Attributes:
        name: the site (a subject token: no '.', '*', '>' or spaces).
        cluster: the aggregation group (COA) it belongs to.
        n_agents: service groups of its emulated cluster.
        steps: ticks per episode of its emulated cluster.
        step_seconds: simulated seconds per tick (``steps · step_seconds`` = one episode; 24 ×
            3600 s is a whole day at hourly decisions).
        target_util: how busy its edge sites are under random actions (provisioning level).
        scenario_weights: its scenario mix (None: the built-in mix).
        drift: ``"0d" | "1d" | "1w" | "1m"`` or days: how far its behaviour has drifted.
        trace: a real trace for task shapes and arrivals (path), or None.
        twin: a twin directory to train in instead of the emulated cluster (PPO learner only).
        seed: the site's own randomness (data, environment).
        reward_weights: what the site's operator optimises, as weights of ``response.*`` / ``kpi.*``
            columns (None: the emulated cluster's default, `REWARD_WEIGHTS`, the operator's multi-objective
            over revenue, offload, SLO violations, task time, energy and carbon).
    """

    name: str
    cluster: str = "cluster-0"
    n_agents: int = 8
    steps: int = 24
    step_seconds: float = 900.0
    target_util: float = 0.45
    scenario_weights: dict[str, float] | None = None
    drift: str | float = "0d"
    trace: str | None = None
    twin: str | None = None
    seed: int = 0
    reward_weights: dict[str, float] | None = None

    def __post_init__(self) -> None:
        Subjects._tok(self.name, "site name")
        Subjects._tok(self.cluster, f"cluster of site {self.name}")

    def cluster_config(self, n_agents: int | None = None, steps: int | None = None) -> Any:
        """The `ClusterConfig` of this site's emulated system."""
        from edgetwin.emulator.cluster import ClusterConfig

        return ClusterConfig(
            n_agents=int(n_agents or self.n_agents),
            steps=int(steps or self.steps),
            step_seconds=float(self.step_seconds),
            drift=self.drift,
            trace=self.trace,
            target_util=float(self.target_util),
            scenario_weights=self.scenario_weights,
            reward_weights=self.reward_weights,
        )

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any], where: str = "site") -> SiteSpec:
        known = {f for f in cls.__dataclass_fields__}
        unknown = sorted(set(d) - known)
        if unknown:
            raise InputError(f"unknown keys {unknown}; known: {sorted(known)}", where=where)
        try:
            return cls(**d)
        except TypeError as e:
            raise InputError(str(e), where=where) from None


def heterogeneous_sites(
    n: int,
    clusters: int = 1,
    seed: int = 0,
    n_agents: int = 8,
    steps: int = 24,
    traces: Sequence[str] | None = None,
    step_seconds: float = 900.0,
) -> list[SiteSpec]:
    """``n`` sites cycling through `SITE_ARCHETYPES` (jittered), spread round-robin over clusters.

    Args:
        n: number of sites (ESAs).
        clusters: aggregation groups; site ``i`` goes to ``cluster-(i mod clusters)``.
        seed: jitter of the provisioning level and the sites' own seeds.
        n_agents, steps, step_seconds: size of each site's emulated cluster and its episode.
        traces: real traces assigned round-robin (None: the built-in distributions).
    """
    if n < 1 or clusters < 1 or clusters > n:
        raise InputError(
            f"need 1 <= clusters <= sites, got sites={n}, clusters={clusters}", where="--sites/--clusters"
        )
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        arch = SITE_ARCHETYPES[i % len(SITE_ARCHETYPES)]
        util = float(np.clip(arch["target_util"] + rng.uniform(-0.05, 0.05), 0.1, 0.9))
        out.append(
            SiteSpec(
                name=f"site-{i}",
                cluster=f"cluster-{i % clusters}",
                n_agents=n_agents,
                steps=steps,
                step_seconds=float(step_seconds),
                target_util=round(util, 3),
                scenario_weights=dict(arch["scenario_weights"]),
                drift=arch["drift"],
                trace=None if not traces else str(traces[i % len(traces)]),
                seed=int(rng.integers(0, 2**31 - 1)),
            )
        )
    return out


@dataclass
class SiteTelemetry:
    """What an ESA knows about its site for intents.

    Attributes:
        util: edge utilisation now, in [0, 1].
        predicted_util: forecast utilisation a few ticks ahead.
        backlog_s: seconds of queued work now.
        vcpu: edge vCPU of the site.
    """

    util: float
    predicted_util: float
    backlog_s: float
    vcpu: float
