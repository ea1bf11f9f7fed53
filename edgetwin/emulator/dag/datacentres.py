"""A federated cloud of data centres for seed 002 (ERLFC): servers, cooling, energy type, carbon.

Each `DataCentre` has heterogeneous servers (a SPECpower curve and a relative speed per server
model), a cooling method after seed 002 (air / liquid, or adaptive switching with a start-up
energy, `edgetwin.emulator.energy.Cooling`), the energy type of its grid and a real hourly carbon
intensity series of its zone (Electricity Maps; the built-in profiles of
`edgetwin.emulator.energy.CARBON_PROFILES`, or the full hourly files from ``../shared/data`` via
``carbon_source``).

Energy follows seed 002's room model (its eq. for ``TE_i``): for the servers a job uses,
``(busy·P_peak + idle·P_idle)·(1 + cr) + P_ctStart``, where ``idle`` is the time a server is held by
the job without running one of its tasks (waiting for a parent, or for the rest of the DAG to
finish), ``cr`` the cooling ratio in force and ``P_ctStart`` the start-up energy of a cooling
switch. Carbon is each part's energy times the zone's intensity in the hour it is used. A job that
HEFT spreads over several data centres (the HEFT-everywhere baseline) also pays WAN transfers:
a latency plus GB / bandwidth in time, and ``WAN_KWH_PER_GB`` in energy (Aslan et al., J. Ind.
Ecol. 2018: 0.06 kWh/GB for 2015), at the mean intensity of the two ends.

The six default centres follow seed 002's six energy types, each on a real grid zone:
coal (PL), solar (US-CAL-CISO), wind (DE), hydro (SE), gas (NL; seed 002 has hydrogen, which no
zone here runs on) and nuclear (FR). Relative server speeds (newer model = faster) and the
per-site cooling ratios are modelling choices, stated in `default_centres`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from edgetwin.contract.errors import InputError
from edgetwin.emulator.dag.heft import heft
from edgetwin.emulator.dag.jobs import DagJob
from edgetwin.emulator.energy import SPECPOWER_CURVES, CarbonSeries, Cooling, carbon_series_for

#: The energy types of seed 002 (codes are their index).
ENERGY_TYPES: tuple[str, ...] = ("coal", "solar", "wind", "hydro", "gas", "nuclear")
#: Network energy of moving data between data centres (kWh/GB), Aslan et al. 2018 (2015 value).
WAN_KWH_PER_GB = 0.06


@dataclass(frozen=True)
class ServerModel:
    """One server type: its SPECpower curve (W at 0..100 % load) and speed relative to the reference."""

    name: str
    speed: float

    @property
    def p_idle(self) -> float:
        return float(SPECPOWER_CURVES[self.name][0])

    @property
    def p_peak(self) -> float:
        return float(SPECPOWER_CURVES[self.name][-1])


@dataclass(frozen=True)
class DataCentre:
    """A data centre of the federation (one machine room, as the action of seed 002 picks rooms).

    Attributes:
        name: label.
        zone: Electricity Maps zone of its grid (carbon intensity).
        energy_type: one of `ENERGY_TYPES`.
        servers: the server model of each server.
        cooling: its cooling method (air/liquid ratio, switching threshold, start-up energies).
    """

    name: str
    zone: str
    energy_type: str
    servers: tuple[ServerModel, ...]
    cooling: Cooling

    def __post_init__(self) -> None:
        if self.energy_type not in ENERGY_TYPES:
            raise InputError(f"energy type must be one of {ENERGY_TYPES}, got {self.energy_type!r}", self.name)
        if not self.servers:
            raise InputError("a data centre needs at least one server", self.name)

    @property
    def speed(self) -> np.ndarray:
        return np.array([s.speed for s in self.servers])

    @property
    def p_peak(self) -> np.ndarray:
        return np.array([s.p_peak for s in self.servers])

    @property
    def p_idle(self) -> np.ndarray:
        return np.array([s.p_idle for s in self.servers])


def _room(model: str, speed: float, n: int) -> tuple[ServerModel, ...]:
    return tuple(ServerModel(model, speed) for _ in range(n))


def default_centres() -> tuple[DataCentre, ...]:
    """Six data centres, one per energy type of seed 002, 68 servers in all.

    Speeds: Xeon X5670/X5675 (2010-11) 1.5/1.4, Xeon X3470/X3480 1.0, Xeon 3075 0.8, Pentium D 0.6.
    Cooling ratios (cooling energy / IT energy, i.e. PUE - 1): air 0.3-0.6, liquid 0.1-0.15;
    the Nordic site cools by outside air (0.12). The low-carbon sites are the small or slow ones,
    so that sending everything to the cleanest grid is not free.
    """
    big = Cooling(mode="air", cr_air=0.5, cr_liquid=0.12, air_peak_w=6 * 230.0)
    return (
        DataCentre("dc-pl", "PL", "coal", _room("IbmX3550XeonX5670", 1.5, 8) + _room("IbmX3250XeonX3470", 1.0, 8),
                   Cooling(mode="liquid", cr_liquid=0.1, adaptive=False)),
        DataCentre("dc-cal", "US-CAL-CISO", "solar", _room("IbmX3550XeonX5675", 1.4, 12), big),
        DataCentre("dc-de", "DE", "wind", _room("IbmX3250XeonX3480", 1.0, 12),
                   Cooling(mode="air", cr_air=0.4, cr_liquid=0.15, air_peak_w=8 * 113.0)),
        DataCentre("dc-se", "SE", "hydro", _room("HpProLiantMl110G3PentiumD930", 0.6, 6),
                   Cooling(mode="air", cr_air=0.12, adaptive=False)),
        DataCentre("dc-nl", "NL", "gas", _room("HpProLiantMl110G5Xeon3075", 0.8, 14),
                   Cooling(mode="air", cr_air=0.6, adaptive=False)),
        DataCentre("dc-fr", "FR", "nuclear", _room("HpProLiantMl110G4Xeon3040", 0.8, 4) + _room("IbmX3250XeonX3480", 1.0, 4),
                   Cooling(mode="air", cr_air=0.3, cr_liquid=0.15, air_peak_w=4 * 110.0)),
    )


@dataclass(frozen=True)
class Placement:
    """What running one job cost, wherever it ran.

    Attributes:
        centre: index of the data centre (-1: spread over several, HEFT-everywhere).
        energy_j, carbon_g: the job's energy (J, cooling and switching included) and emissions (g).
        start_s, finish_s: its first task's start and last task's finish (s).
        wait_s: start - arrival.
        missed: finished after its deadline.
        wan_gb: data moved between data centres.
    """

    centre: int
    energy_j: float
    carbon_g: float
    start_s: float
    finish_s: float
    wait_s: float
    missed: bool
    wan_gb: float = 0.0


@dataclass
class Federation:
    """The federated cloud's state as jobs are placed: when each server is free, energy so far.

    Args:
        centres: the data centres.
        carbon_source: where the hourly carbon series come from (`carbon_series_for`: None = the
            built-in real profiles; a directory such as ``../shared/data/opendc-traces`` = full files).
        wan_latency_s, wan_gbps: WAN transfer time between two data centres = latency + GB·8/Gbps.
    """

    centres: Sequence[DataCentre] = field(default_factory=default_centres)
    carbon_source: str | Path | Mapping[str, str | Path] | None = None
    wan_latency_s: float = 0.1
    wan_gbps: float = 1.0

    def __post_init__(self) -> None:
        self.centres = tuple(self.centres)
        self.carbon: list[CarbonSeries] = [carbon_series_for(c.zone, self.carbon_source) for c in self.centres]
        self._offsets = np.cumsum([0] + [len(c.servers) for c in self.centres])
        self.reset(0.0)

    @property
    def n(self) -> int:
        return len(self.centres)

    def reset(self, start_hour: float) -> None:
        """Empty the federation; ``start_hour`` = hours into the carbon series at t = 0."""
        self.start_hour = float(start_hour)
        self.free = [np.zeros(len(c.servers)) for c in self.centres]
        self.liquid = np.array([c.cooling.mode == "liquid" for c in self.centres])
        self.energy_j = np.zeros(self.n)
        self.carbon_g = np.zeros(self.n)

    # --- observation helpers --------------------------------------------------------------------
    def intensity(self, t_s: float | np.ndarray, centre: int) -> np.ndarray:
        """gCO2eq/kWh of a centre's grid at simulated time ``t_s``."""
        if isinstance(t_s, float | int):
            h = self.carbon[centre].hourly
            return h[int(np.floor(self.start_hour + t_s / 3600.0)) % len(h)]
        return self.carbon[centre].at(self.start_hour + np.asarray(t_s, dtype=np.float64) / 3600.0)

    def waits(self, now: float) -> tuple[np.ndarray, np.ndarray]:
        """(min, max) over each centre's servers of the time until the server is free (s), ``(C,)``."""
        w = [np.maximum(f - now, 0.0) for f in self.free]
        return np.array([x.min() for x in w]), np.array([x.max() for x in w])

    def cooling_ratio(self) -> np.ndarray:
        return np.array([c.cooling.cr_liquid if liq else c.cooling.cr_air for c, liq in zip(self.centres, self.liquid, strict=True)])

    # --- placing jobs ---------------------------------------------------------------------------
    def _energy(self, centre: int, srv: np.ndarray, start: np.ndarray, finish: np.ndarray, job_end: float, cr: float) -> tuple[float, float]:
        """IT energy x (1 + cr) and carbon of a job's tasks on ``srv`` of ``centre`` (seed 002's TE)."""
        c = self.centres[centre]
        p_peak, p_idle = c.p_peak, c.p_idle
        busy_e = (finish - start) * p_peak[srv]
        mid = 0.5 * (start + finish)
        carbon = float(np.sum(busy_e * (1.0 + cr) / 3.6e6 * self.intensity(mid, centre)))
        energy = float(busy_e.sum())
        for s in np.unique(srv):
            on = srv == s
            held = job_end - start[on].min()
            idle = max(held - float((finish[on] - start[on]).sum()), 0.0)
            e_idle = idle * p_idle[s]
            energy += e_idle
            carbon += e_idle * (1.0 + cr) / 3.6e6 * float(self.intensity(0.5 * (start[on].min() + job_end), centre))
        return energy * (1.0 + cr), carbon

    def place(self, job: DagJob, centre: int, commit: bool = True) -> Placement:
        """Run ``job`` in ``centre``: HEFT on its servers (no transfer cost inside a centre)."""
        if not 0 <= centre < self.n:
            raise InputError(f"data centre index must be in 0..{self.n - 1}, got {centre}", "action")
        c = self.centres[centre]
        cost = job.work_s[:, None] / c.speed[None, :]
        sched = heft(cost, job.succ, ready=self.free[centre], release=job.arrival_s)
        end = sched.makespan
        # Cooling: IT power the room runs at once this job is in (servers busy at its start).
        busy_after = self.free[centre].copy()
        for p in range(len(c.servers)):
            on = sched.proc == p
            if on.any():
                busy_after[p] = max(busy_after[p], sched.finish[on].max())
        t0 = float(sched.start.min())
        it_w = float(np.sum(c.p_peak[busy_after > t0]))
        liquid_next, cr, switch_j = c.cooling.step(self.liquid[centre : centre + 1], np.array([it_w]))
        energy, carbon = self._energy(centre, sched.proc, sched.start, sched.finish, end, float(cr[0]))
        energy += float(switch_j[0])
        carbon += float(switch_j[0]) / 3.6e6 * float(self.intensity(t0, centre))
        if commit:
            self.free[centre] = busy_after
            self.liquid[centre] = bool(liquid_next[0])
            self.energy_j[centre] += energy
            self.carbon_g[centre] += carbon
        return Placement(centre, energy, carbon, t0, end, t0 - job.arrival_s, end > job.deadline_s + 1e-9)

    def place_everywhere(self, job: DagJob) -> Placement:
        """HEFT over the union of every centre's servers, paying WAN transfers between centres."""
        speed = np.concatenate([c.speed for c in self.centres])
        owner = np.repeat(np.arange(self.n), [len(c.servers) for c in self.centres])
        lat, bw = self.wan_latency_s, self.wan_gbps

        def comm(i: int, j: int, p: int, q: int) -> float:
            return 0.0 if owner[p] == owner[q] else lat + job.edge_gb.get((i, j), 0.0) * 8.0 / bw

        # Mean transfer time over processor pairs p != q (for the ranks): the share of pairs that
        # straddle two centres times the WAN cost.
        sizes = np.array([len(c.servers) for c in self.centres], dtype=np.float64)
        m = sizes.sum()
        cross = (m * m - float((sizes**2).sum())) / max(m * m - m, 1.0)
        mean = np.zeros((job.n_tasks, job.n_tasks))
        for (i, j), gb in job.edge_gb.items():
            mean[i, j] = cross * (lat + gb * 8.0 / bw)
        sched = heft(
            job.work_s[:, None] / speed[None, :],
            job.succ,
            comm_fn=comm,
            ready=np.concatenate(self.free),
            release=job.arrival_s,
            comm_mean=mean,
        )
        end = sched.makespan
        energy = carbon = 0.0
        cr = self.cooling_ratio()
        for k in range(self.n):
            on = owner[sched.proc] == k
            if not on.any():
                continue
            local = sched.proc[on] - self._offsets[k]
            e, g = self._energy(k, local, sched.start[on], sched.finish[on], end, float(cr[k]))
            self.energy_j[k] += e
            self.carbon_g[k] += g
            energy += e
            carbon += g
            f = self.free[k]
            for p in np.unique(local):
                f[p] = max(f[p], float(sched.finish[on][local == p].max()))
        wan_gb = 0.0
        for i, js in enumerate(job.succ):
            for j in js:
                a, b = owner[sched.proc[i]], owner[sched.proc[j]]
                if a != b:
                    gb = job.edge_gb.get((i, j), 0.0)
                    wan_gb += gb
                    e = gb * WAN_KWH_PER_GB * 3.6e6
                    ci = 0.5 * (float(self.intensity(sched.finish[i], a)) + float(self.intensity(sched.finish[i], b)))
                    energy += e
                    carbon += e / 3.6e6 * ci
                    self.energy_j[a] += e
                    self.carbon_g[a] += e / 3.6e6 * ci
        t0 = float(sched.start.min())
        return Placement(-1, energy, carbon, t0, end, t0 - job.arrival_s, end > job.deadline_s + 1e-9, wan_gb)
