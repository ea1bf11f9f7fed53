"""Why the verdict's day-to-day term is too small (issue 48): the twin's replayed day spread against
the logs' observed one and the emulator's truth days, on a cached 1,000-group setup of the scale run.

Per seed, for the scale run's four candidates and the KPI columns the bound section reports:

* ``twin_same_seed``: `edgetwin.loop.verdict.day_to_day_variance` as the loop called it before
  this change (the last 6 recent days of the fleet's own size, member 0, every day replayed on the
  same world seed): the sd of the daily fleet-wide change and of the baseline level;
* ``twin_per_day_seed``: the same replay with each day on its own world seed;
* ``observed_level``: the sd over the same 6 logged days of the baseline fleet mean *as logged*
  (what any operator's logs show; no twin, no emulator);
* ``truth``: the emulator's sd of the daily fleet-wide change and of the current policy's level
  over the 20 truth days (`scale/day_truth_seed<S>.json`, `_closed_loop_bound.day_truth`);
* ``product``: the day term the loop now carries (`day_to_day_variance`, calibrated).

Everything relative to the baseline level (the verdict's units). The product never sees ``truth``.

    python benchmarks/closed_loop.py --day-diagnosis --seed S --work /tmp/l48b-fc
"""

from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SCALE_DIR = ROOT / "docs" / "benchmarks" / "closed_loop" / "scale"
COLUMNS = ("kpi.carbon_g", "kpi.energy_j", "kpi.revenue", "kpi.slo_violation", "kpi.task_time_ms",
           "response.offload_ratio", "reward")  # fmt: skip
FLEET, RECENT_DAYS = 1000, 6


def _replay(twin: Any, day: Any, cols: list[str], cand: Any, base: Any, seed: int) -> tuple[list[float], list[float]]:
    from edgetwin.loop.ppi import twin_group_predictions

    pr = twin_group_predictions(twin, {"candidate": cand, "baseline": base}, day, cols, episodes=1, seed=seed,
                                members=[0])  # fmt: skip
    return ([float(np.mean(pr[("candidate", c)] - pr[("baseline", c)])) for c in cols],
            [float(np.mean(pr[("baseline", c)])) for c in cols])  # fmt: skip


def diagnose(seed: int, work: Path, log: Any = print) -> dict[str, Any]:
    """The diagnosis of one seed (see the module docstring); ``work``: the scale run's cache."""
    from _closed_loop_scale import SCALE_CANDIDATES, seed_twin
    from whatif_gate import candidates, logging_policy

    from edgetwin.emulator.cluster import ClusterConfig
    from edgetwin.emulator.logs import generate_logs
    from edgetwin.loop.ppi import replay_spec
    from edgetwin.loop.verdict import day_to_day_variance

    t0 = time.perf_counter()
    spec, _train, twin = seed_twin(seed, work)
    allp = candidates(spec, twin, "production", seed)
    current = logging_policy("production", spec, seed + 500)
    cfg = ClusterConfig(n_agents=FLEET, steps=96)
    recent = generate_logs(cfg, RECENT_DAYS, copy.deepcopy(current), seed=seed * 1000 + 300)[0]  # as run_size draws it
    cols = [c for c in COLUMNS if c in recent.columns]
    names = list(pd_unique(recent["episode"]))
    days = [recent[recent["episode"] == e] for e in names]
    obs = np.array([[float(d[c].mean()) for c in cols] for d in days])  # (days, cols): the logged baseline fleet means
    truth = json.loads((SCALE_DIR / f"day_truth_seed{seed}.json").read_text())["values"]
    tb = {c: np.asarray(truth["current"][c], dtype=float) for c in cols}
    base_spec = replay_spec("current", current)
    out: dict[str, Any] = {"seed": seed, "days": len(names), "fleet": FLEET, "columns": cols, "candidates": {}}
    out["observed_level_sd"] = {c: float(np.std(obs[:, j], ddof=1) / abs(np.mean(obs[:, j]))) for j, c in enumerate(cols)}
    out["truth_level_sd"] = {c: float(np.std(tb[c], ddof=1) / abs(np.mean(tb[c]))) for c in cols}
    for name in SCALE_CANDIDATES[:4]:
        cand = replay_spec(name, allp[name])
        rows: dict[str, Any] = {}
        for variant in ("same_seed", "per_day_seed"):
            d_, b_ = zip(*[_replay(twin, day, cols, cand, base_spec,
                                   seed if variant == "same_seed" else seed * 7919 + 101 * i + 1)
                           for i, day in enumerate(days)], strict=True)  # fmt: skip
            d, b = np.asarray(d_), np.asarray(b_)
            lvl = np.abs(obs.mean(axis=0))
            rows[variant] = {"effect_sd": {c: float(np.std(d[:, j], ddof=1) / lvl[j]) for j, c in enumerate(cols)},
                             "level_sd": {c: float(np.std(b[:, j], ddof=1) / lvl[j]) for j, c in enumerate(cols)}}  # fmt: skip
        prod = day_to_day_variance(twin, [recent], cols, cand, base_spec, seed=seed)
        rows["product"] = {c: {"effect_sd": float(np.sqrt(prod[c][0]) / abs(np.mean(obs[:, j]))), "df": prod[c][2]}
                           for j, c in enumerate(cols) if c in prod}  # fmt: skip
        te = {c: np.asarray(truth[name][c], dtype=float) - tb[c] for c in cols}
        rows["truth_effect_sd"] = {c: float(np.std(te[c], ddof=1) / abs(np.mean(tb[c]))) for c in cols}
        out["candidates"][name] = rows
        log(f"seed {seed} {name!r} done [{time.perf_counter() - t0:.0f} s]")
    out["seconds"] = time.perf_counter() - t0
    return out


def pd_unique(s: Any) -> list[Any]:
    import pandas as pd

    return list(pd.unique(s))


def _median(docs: list[dict[str, Any]], col: str, where: str, key: str) -> float | None:
    """Median over seeds and candidates of one sd: ``where`` "seed" (a seed's own entry ``key``),
    else the candidate's ``where`` entry's ``key`` (``product``: its ``effect_sd``)."""
    if where == "seed":
        v = [d[key][col] for d in docs]
    elif where == "truth":
        v = [r["truth_effect_sd"][col] for d in docs for r in d["candidates"].values()]
    elif where == "product":
        v = [r["product"][col]["effect_sd"] for d in docs for r in d["candidates"].values() if col in r["product"]]
    else:
        v = [r[where][key][col] for d in docs for r in d["candidates"].values()]
    return float(np.median(v)) if v else None


#: the table's columns: (header, where, key) for `_median`
TABLE = (("emulator: sd of the daily effect (20 truth days)", "truth", ""),
         ("twin, one seed for every day (before)", "same_seed", "effect_sd"),
         ("twin, a seed per day", "per_day_seed", "effect_sd"),
         ("the day term now carried (calibrated)", "product", ""),
         ("logs: sd of the baseline level (6 days)", "seed", "observed_level_sd"),
         ("emulator: sd of the level (20 days)", "seed", "truth_level_sd"),
         ("twin, a seed per day: sd of the level", "per_day_seed", "level_sd"))  # fmt: skip


def table(docs: list[dict[str, Any]]) -> str:
    """Markdown: per KPI, medians over seeds and candidates of each sd (percent of the baseline)."""
    lines = ["| KPI | " + " | ".join(h for h, _, _ in TABLE) + " |", "|---|" + "---:|" * len(TABLE)]
    for c in docs[0]["columns"]:
        vals = [_median(docs, c, w, k) for _, w, k in TABLE]
        lines.append(f"| {c} | " + " | ".join("—" if v is None else f"{100 * v:.2f} %" for v in vals) + " |")
    return "\n".join(lines)
