"""Energy, cooling and carbon of the emulated cluster's sites.

* Node power follows seed 001 (WA3C, eq. 5): ``P = W_base + U·ι·(W_max − W_base)``, where the
  load curve between ``W_base`` (idle) and ``W_max`` (full load) is a measured SPECpower curve
  (11 points at 0, 10, .., 100 % load) when one is given; with a straight line it is exactly eq. 5.
* Cooling follows seed 002 (ERLFC): cooling energy is a fixed ratio ``cr`` of IT energy, different
  for air and liquid cooling; a room switches to liquid cooling when its IT power exceeds the air
  cooling's peak and back when it falls below it, paying a start-up energy on each switch.
* Carbon is energy (kWh) times the grid's hourly carbon intensity (gCO2eq/kWh) at the site.

The built-in curves and carbon profiles below are small summaries of real published data (sources
inline) so that a fresh clone runs without ``../shared``; `load_specpower` and `CarbonSeries.from_file`
read the full files when they are available.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from edgetwin.contract.errors import InputError

# ------------------------------------------------------------------------------------ power curves
#: SPECpower_ssj2008 results: server power (W) at 0, 10, .., 100 % load, as shipped with CloudSim
#: Plus (cloudsimplus-examples/src/main/resources/power-specs/*.txt, GPL-3.0 code; the numbers are
#: the published SPEC results linked in each file).
SPECPOWER_CURVES: dict[str, tuple[float, ...]] = {
    # https://www.spec.org/power_ssj2008/results/res2011q1/power_ssj2008-20110127-00342.html
    "HpProLiantMl110G3PentiumD930": (105, 112, 118, 125, 131, 137, 147, 153, 157, 164, 169),
    "HpProLiantMl110G4Xeon3040": (86, 89.4, 92.6, 96, 99.5, 102, 106, 108, 112, 114, 117),
    # https://www.spec.org/power_ssj2008/results/res2011q1/power_ssj2008-20110124-00339.html
    "HpProLiantMl110G5Xeon3075": (93.7, 97, 101, 105, 110, 116, 121, 125, 129, 133, 135),
    # https://www.spec.org/power_ssj2008/results/res2009q4/power_ssj2008-20091104-00213.html
    "IbmX3250XeonX3470": (41.6, 46.7, 52.3, 57.9, 65.4, 73, 80.7, 89.5, 99.6, 105, 113),
    # https://www.spec.org/power_ssj2008/results/res2010q4/power_ssj2008-20101001-00297.html
    "IbmX3250XeonX3480": (42.3, 46.7, 49.7, 55.4, 61.8, 69.3, 76.1, 87, 96.1, 106, 113),
    # https://www.spec.org/power_ssj2008/results/res2010q2/power_ssj2008-20100315-00239.html
    "IbmX3550XeonX5670": (66, 107, 120, 131, 143, 156, 173, 191, 211, 229, 247),
    # https://www.spec.org/power_ssj2008/results/res2011q2/power_ssj2008-20110406-00368.html
    "IbmX3550XeonX5675": (58.4, 98, 109, 118, 128, 140, 153, 170, 189, 205, 222),
}


def load_specpower(path: str | Path) -> tuple[float, ...]:
    """Read a CloudSim-style SPECpower file: 11 numbers (W at 0..100 % load), then comments.

    Raises:
        InputError: the file is missing or does not start with 11 increasing non-negative numbers.
    """
    path = Path(path)
    if not path.is_file():
        raise InputError("SPECpower file not found", str(path))
    numbers: list[float] = []
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        for token in line.split():
            if len(numbers) == 11:
                break
            try:
                numbers.append(float(token))
            except ValueError:
                raise InputError(
                    f"expected 11 power values (W at 0,10,..,100 % load) before any text, got {token!r}",
                    f"{path}:{lineno}",
                ) from None
        if len(numbers) == 11:
            break
    if len(numbers) != 11:
        raise InputError(f"expected 11 power values, found {len(numbers)}", str(path))
    arr = np.asarray(numbers)
    if (arr < 0).any() or (np.diff(arr) < 0).any():
        raise InputError("power values must be non-negative and non-decreasing with load", str(path))
    return tuple(numbers)


@dataclass(frozen=True)
class PowerModel:
    """Power of one node as a function of its CPU utilisation (seed 001 eq. 5 with a SPEC curve).

    Attributes:
        curve: node power (W) at 0, 10, .., 100 % utilisation.
        iota: the performance coefficient ι of seed 001 (CPI/MAPI mix); 1.0 = the measured curve.
    """

    curve: tuple[float, ...]
    iota: float = 1.0

    @property
    def w_base(self) -> float:
        return float(self.curve[0])

    @property
    def w_max(self) -> float:
        return float(self.curve[-1])

    def watts(self, util: np.ndarray | float) -> np.ndarray:
        """Node power (W) at utilisation ``util`` in [0, 1] (any shape)."""
        u = np.clip(np.asarray(util, dtype=np.float64), 0.0, 1.0)
        shape = np.interp(u, np.linspace(0.0, 1.0, len(self.curve)), self.curve)
        # W_base + ι·(curve(U) − W_base): with a straight curve this is W_base + U·ι·(W_max − W_base).
        return self.w_base + self.iota * (shape - self.w_base)

    def dynamic_watts_per_util(self) -> float:
        """Average slope (W per unit utilisation): used to charge a tenant's own load."""
        return self.iota * (self.w_max - self.w_base)


# ------------------------------------------------------------------------------------ cooling
@dataclass(frozen=True)
class Cooling:
    """Air/liquid cooling of a server room after seed 002 (ERLFC).

    Attributes:
        mode: the initial method, ``"air"`` or ``"liquid"``.
        cr_air, cr_liquid: cooling energy as a fraction of IT energy for each method.
        air_peak_w: above this IT power the room must switch to liquid cooling.
        air_start_j, liquid_start_j: start-up energy paid on switching to that method.
        adaptive: switch by load (seed 002) or keep ``mode`` fixed.
    """

    mode: str = "air"
    cr_air: float = 0.45
    cr_liquid: float = 0.15
    air_peak_w: float = float("inf")
    air_start_j: float = 2.0e5
    liquid_start_j: float = 1.2e6
    adaptive: bool = True

    def __post_init__(self) -> None:
        if self.mode not in ("air", "liquid"):
            raise InputError(f"cooling mode must be 'air' or 'liquid', got {self.mode!r}", "cooling")

    def step(self, liquid: np.ndarray, it_watts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Advance the cooling state of rooms given their IT power for the next interval.

        Args:
            liquid: (S,) bool, whether each room is on liquid cooling now.
            it_watts: (S,) IT power of each room (W).

        Returns:
            (liquid_next (S,) bool, cr (S,) cooling ratio in force, switch_j (S,) start-up energy J).
        """
        if not self.adaptive:
            return liquid, np.where(liquid, self.cr_liquid, self.cr_air), np.zeros_like(it_watts)
        to_liquid = ~liquid & (it_watts > self.air_peak_w)
        to_air = liquid & (it_watts < self.air_peak_w)
        nxt = (liquid | to_liquid) & ~to_air
        switch = np.where(to_liquid, self.liquid_start_j, 0.0) + np.where(to_air, self.air_start_j, 0.0)
        return nxt, np.where(nxt, self.cr_liquid, self.cr_air), switch


# ------------------------------------------------------------------------------------ carbon
#: Hourly mean carbon intensity (gCO2eq/kWh) by UTC hour 0..23 in 2023, and the monthly mean
#: relative to the annual mean (Jan..Dec), computed from Electricity Maps data as published in
#: atlarge-research/opendc-traces carbon/traces/electricity_maps/<zone>_2021-2024.parquet (ODbL).
CARBON_PROFILES: dict[str, tuple[tuple[float, ...], tuple[float, ...]]] = {
    "NL": (
        (323.4, 321.8, 321.1, 322.9, 326.3, 324.1, 310.6, 285.1, 252.3, 224.5, 206.8, 197.3,
         196.9, 205.5, 224.4, 256.8, 292.9, 322.2, 341.2, 349.3, 348.4, 343.4, 334.8, 326.4),
        (1.118, 1.268, 1.118, 1.106, 0.891, 0.886, 0.768, 0.974, 1.042, 0.911, 0.974, 0.945),
    ),
    "DE": (
        (383.6, 382.0, 382.8, 387.0, 388.9, 385.9, 375.6, 356.0, 331.6, 310.8, 299.4, 294.9,
         297.8, 309.7, 331.4, 361.5, 390.3, 407.5, 414.7, 414.4, 411.1, 406.4, 396.5, 387.6),
        (1.135, 1.266, 1.041, 1.036, 0.84, 0.905, 0.778, 0.946, 1.034, 0.972, 1.049, 0.997),
    ),
    "FR": (
        (48.0, 47.2, 46.1, 46.1, 48.2, 50.2, 51.4, 51.1, 50.0, 48.0, 46.8, 45.3,
         44.3, 44.2, 44.4, 46.3, 50.0, 53.9, 55.2, 54.4, 53.5, 53.4, 51.9, 49.0),
        (1.451, 1.812, 1.464, 0.923, 0.643, 0.848, 0.854, 0.845, 0.671, 0.635, 0.941, 0.913),
    ),
    "SE": (
        (23.0, 23.2, 23.3, 23.1, 22.8, 22.8, 23.6, 24.4, 25.4, 26.3, 26.9, 27.5,
         27.4, 26.1, 24.6, 23.4, 22.6, 22.0, 21.8, 21.6, 21.6, 21.5, 21.9, 22.3),
        (1.177, 1.077, 1.25, 1.088, 0.962, 0.857, 0.839, 0.722, 0.708, 0.721, 1.092, 1.507),
    ),
    "PL": (
        (784.8, 786.4, 786.6, 785.7, 783.7, 771.2, 741.8, 704.5, 668.5, 646.8, 638.2, 640.1,
         650.9, 676.8, 714.5, 758.5, 797.9, 820.9, 822.2, 812.5, 801.5, 791.9, 784.8, 782.6),
        (1.047, 1.038, 0.988, 0.991, 0.953, 0.973, 0.946, 0.996, 1.037, 0.994, 1.046, 0.99),
    ),
    "US-CAL-CISO": (
        (243.9, 274.5, 295.4, 300.9, 302.7, 306.5, 308.0, 308.1, 307.0, 306.8, 307.2, 307.6,
         310.0, 303.1, 275.5, 238.5, 207.8, 194.5, 191.2, 189.4, 187.7, 187.6, 192.7, 211.5),
        (1.129, 1.093, 0.982, 0.824, 0.641, 0.726, 0.996, 1.072, 0.988, 1.193, 1.161, 1.197),
    ),
}


@dataclass(frozen=True)
class CarbonSeries:
    """Hourly grid carbon intensity (gCO2eq/kWh) of one zone, from a real series or a profile.

    ``at(t_hours)`` gives the intensity ``t_hours`` after the series' start (any shape, wraps
    around at the end of the series). A built-in profile repeats its 24-hour shape scaled by the
    month's mean.
    """

    zone: str
    hourly: np.ndarray  # (H,) gCO2eq/kWh, one value per hour from the start

    def at(self, t_hours: np.ndarray | float) -> np.ndarray:
        h = np.floor(np.asarray(t_hours, dtype=np.float64)).astype(np.int64) % len(self.hourly)
        return self.hourly[h]

    @classmethod
    def builtin(cls, zone: str) -> CarbonSeries:
        """A year of hours from the built-in 24-hour profile × monthly factor of ``zone``."""
        if zone not in CARBON_PROFILES:
            raise InputError(f"no built-in carbon profile for zone {zone!r}; have {sorted(CARBON_PROFILES)}", "zone")
        daily, monthly = CARBON_PROFILES[zone]
        days = pd.date_range("2023-01-01", periods=365, freq="D")
        month_factor = np.asarray(monthly)[days.month.to_numpy() - 1]
        hourly = (month_factor[:, None] * np.asarray(daily)[None, :]).ravel()
        return cls(zone=zone, hourly=hourly)

    @classmethod
    def from_file(cls, path: str | Path, zone: str | None = None, year: int | None = 2023) -> CarbonSeries:
        """Read an hourly series: OpenDC/Electricity Maps Parquet (``timestamp, carbon_intensity``)
        or a green-dcc CSV (``Datetime (UTC)``, ``Carbon Intensity gCO₂eq/kWh (direct)``).

        Args:
            year: keep only this year when the series covers several (None keeps all).

        Raises:
            InputError: missing file, missing columns or non-numeric intensities (with the row).
        """
        path = Path(path)
        if not path.is_file():
            raise InputError("carbon intensity file not found", str(path))
        try:
            df = pd.read_parquet(path) if path.suffix in (".parquet", ".pq") else pd.read_csv(path)
        except (OSError, ValueError, pd.errors.ParserError) as e:
            raise InputError(f"cannot read ({type(e).__name__}: {e})", str(path)) from None
        time_col = next((c for c in ("timestamp", "Datetime (UTC)") if c in df.columns), None)
        ci_col = next(
            (c for c in df.columns if c == "carbon_intensity" or c.startswith("Carbon Intensity") and "direct" in c),
            None,
        )
        if time_col is None or ci_col is None:
            raise InputError(
                "expected columns 'timestamp' + 'carbon_intensity' (OpenDC) or 'Datetime (UTC)' + "
                f"'Carbon Intensity gCO₂eq/kWh (direct)' (green-dcc); got {list(df.columns)[:6]}",
                str(path),
            )
        ts = pd.to_datetime(df[time_col], errors="coerce")
        ci = pd.to_numeric(df[ci_col], errors="coerce")
        bad = np.flatnonzero(ts.isna().to_numpy() | ci.isna().to_numpy() | (ci.to_numpy() < 0))
        if len(bad):
            row = int(bad[0]) + 2  # 1-based, after the header line
            raise InputError(
                f"{len(bad)} rows have an unparsable time or a missing/negative intensity (first shown)",
                f"{path}:{row}:{ci_col}",
            )
        series = pd.Series(ci.to_numpy(), index=ts).sort_index()
        if year is not None and (series.index.year == year).any():
            series = series[series.index.year == year]
        # Hourly grid; short gaps are interpolated so that hour h is always index h.
        series = series.groupby(series.index.floor("h")).mean().asfreq("h").interpolate(limit_direction="both")
        return cls(zone=zone or path.name.split("_")[0], hourly=series.to_numpy(dtype=np.float64))


def joules_to_grams_co2(energy_j: np.ndarray, intensity_g_per_kwh: np.ndarray) -> np.ndarray:
    """Carbon (g) of ``energy_j`` (J) at a grid intensity (gCO2eq/kWh); 1 kWh = 3.6e6 J."""
    return np.asarray(energy_j) / 3.6e6 * np.asarray(intensity_g_per_kwh)


def carbon_series_for(zone: str, source: str | Path | Mapping[str, str | Path] | None) -> CarbonSeries:
    """The carbon series of a zone: from ``source`` (a file, or a directory holding
    ``<zone>_*.parquet``/``<zone>_*hourly.csv``, or a mapping zone -> file) or the built-in profile."""
    if source is None:
        return CarbonSeries.builtin(zone)
    if isinstance(source, Mapping):
        return CarbonSeries.from_file(source[zone], zone=zone) if zone in source else CarbonSeries.builtin(zone)
    path = Path(source)
    if path.is_dir():
        hits = sorted(path.rglob(f"{zone}_*.parquet")) + sorted(path.rglob(f"{zone}_*hourly.csv"))
        return CarbonSeries.from_file(hits[0], zone=zone) if hits else CarbonSeries.builtin(zone)
    return CarbonSeries.from_file(path, zone=zone)
