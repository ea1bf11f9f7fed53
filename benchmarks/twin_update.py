"""Twin.update from a canary: what it costs against a full refit, and what it buys.

On the emulated cluster: a production-like log (the SLO-aware heuristic), a twin fitted on it, a
candidate far from the logging policy (a constant action: everything at the edge, a fixed
reservation and price), a canary of that candidate on two of the three edge sites through a real
edge runtime (`edgetwin.loop.fleet.canary_on_cluster`), then

- **update**: `Twin.update(canary log, old log)` (warm start + fine-tune, support rebuilt);
- **refit**: `Twin.fit(old log + canary log)` with the parent's settings (the baseline);

timed in the same process (the ratio is the number), and the candidate rolled out in the parent,
the updated and the refitted twin: its out-of-support share and the width of its 90 % intervals
(per guarded KPI, mean over the KPIs and the reward) before and after.

    python benchmarks/twin_update.py            # writes docs/benchmarks/twin_update/README.md and
                                                # docs/benchmarks/twin_update/results.json
    python benchmarks/twin_update.py --quick    # smaller (a minute), same outputs
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _docs  # noqa: E402

from edgetwin.edge.canary import CanaryConfig  # noqa: E402
from edgetwin.edge.canary_slice import CanarySlice  # noqa: E402
from edgetwin.edge.kpi_watch import KPIMargin  # noqa: E402
from edgetwin.emulator.cluster import ClusterConfig  # noqa: E402
from edgetwin.emulator.logs import SLOAwarePolicy, generate_logs  # noqa: E402
from edgetwin.loop.fleet import canary_on_cluster  # noqa: E402
from edgetwin.twin.twin import Twin  # noqa: E402

RESULTS = ROOT / "docs" / "benchmarks" / "twin_update" / "results.json"
SECTION = "## Twin update from a canary"
COLUMNS = ("reward", "kpi.slo_violation", "kpi.task_time_ms", "kpi.revenue")


class Constant:
    """The candidate: one action for every agent (far from the heuristic that logged)."""

    def __init__(self, spec, action):  # type: ignore[no-untyped-def]
        self.spec = spec
        self.action = np.asarray(action, dtype=np.float64)

    def act(self, obs: np.ndarray) -> np.ndarray:
        return np.tile(self.action, (len(obs), 1))


def probe(twin: Twin, policy: Constant, episodes: int, seed: int) -> dict[str, float]:
    df = twin.rollout(policy, episodes=episodes, seed=seed, all_members=True)
    sup, summ = df.attrs["support"], df.attrs["summary"]
    out = {"out_of_support": float(sup["out_of_support"])}
    widths = []
    for c in COLUMNS:
        s = summ[c]
        w = (s["high"] - s["low"]) / max(abs(s["mean"]), 1e-9)
        out[f"width_rel.{c}"] = float(w)
        widths.append(w)
    out["width_rel.mean"] = float(np.mean(widths))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a smaller cluster and twin (about a minute)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-docs", action="store_true", help="print only")
    ap.add_argument("--update-epochs", type=int, default=5, help="Twin.update's fine-tune passes")
    ap.add_argument("--update-steps", type=int, default=1000, help="Twin.update's gradient-step cap per model")
    args = ap.parse_args()
    torch.set_num_threads(1)
    seed = args.seed
    if args.quick:
        cluster, days, fit = ClusterConfig(n_agents=40, steps=48), 3, {"members": 3, "rounds": 1, "bc_epochs": 5}
        hours, episodes = 10.0, 2
    else:
        cluster, days, fit = ClusterConfig(n_agents=80, steps=96), 4, {"members": 3, "rounds": 3, "bc_epochs": 10}
        hours, episodes = 23.0, 3
    fit_kw = {"seed": seed, "progress": False, "population_model": "gmm", **fit}
    log, spec = generate_logs(cluster, days, "heuristic", seed=seed)
    t0 = time.perf_counter()
    parent = Twin.fit(log, spec, **fit_kw)
    parent_s = time.perf_counter() - t0
    candidate = Constant(spec, [1.0, 0.3, 0.2])
    config = CanaryConfig("candidate", CanarySlice(sites=("edge-ams", "edge-fra"), seed=seed), hours,
                          (KPIMargin("kpi.slo_violation", max_regression=0.5),))  # fmt: skip
    canary = canary_on_cluster(cluster, SLOAwarePolicy(spec), candidate, config, seed=seed + 1, episode=1000)
    new = canary.log
    t0 = time.perf_counter()
    updated = parent.update(new, [log], seed=seed, epochs=args.update_epochs, max_steps=args.update_steps)
    update_s = time.perf_counter() - t0
    union = pd.concat([log, new.assign(episode=new["episode"].astype(str) + "-canary")], ignore_index=True)
    t0 = time.perf_counter()
    refit = Twin.fit(union, spec, **fit_kw)
    refit_s = time.perf_counter() - t0
    before, after, after_refit = (probe(t, candidate, episodes, seed + 7) for t in (parent, updated, refit))
    res = {
        "config": {"quick": args.quick, "seed": seed, "agents": cluster.n_agents, "steps": cluster.steps,
                   "days": days, "fit": fit, "update": {"epochs": args.update_epochs, "max_steps": args.update_steps},
                   "canary_hours": hours, "canary_rows": len(new),
                   "canary_stop": canary.stop_reason, "candidate_rows": int((new["policy"] == "candidate").sum()),
                   "machine": f"{platform.machine()} {platform.processor() or ''} x{torch.get_num_threads()} thread"},
        "seconds": {"parent_fit": parent_s, "update": update_s, "refit": refit_s},
        "update_over_refit": update_s / refit_s,
        "candidate": {"parent": before, "updated": after, "refit": after_refit},
    }  # fmt: skip
    print(json.dumps(res, indent=1))
    if args.no_docs:
        return
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(res, indent=1))
    rows = []
    for label, key in (("out-of-support share", "out_of_support"), ("90 % interval width / mean, mean of 4", "width_rel.mean"),
                       *((f"width / mean: {c}", f"width_rel.{c}") for c in COLUMNS)):  # fmt: skip
        rows.append(f"| {label} | {before[key]:.3f} | {after[key]:.3f} | {after_refit[key]:.3f} |")
    text = f"""{SECTION}

`python benchmarks/twin_update.py{' --quick' if args.quick else ''}` (seed {seed}; {res['config']['machine']}).
A twin fitted on {days} days x {cluster.n_agents} service groups of the SLO-aware heuristic's log, a
canary of a constant candidate (edge share 1, capacity 0.3, price 0.2) on two of the three edge
sites for {hours:g} h through a real edge runtime ({len(new)} rows, {res['config']['candidate_rows']}
of them the candidate's; stop: {canary.stop_reason}), then `Twin.update` (warm start + fine-tune,
support rebuilt) against a full refit on the same rows, timed in the same process.

| | update | full refit |
|---|---|---|
| seconds | {update_s:.1f} | {refit_s:.1f} |
| update / refit | **{res['update_over_refit']:.2f}** | 1 |

The candidate rolled out in each twin ({episodes} episodes x every member):

| candidate in the twin | parent | updated | refitted |
|---|---|---|---|
""" + "\n".join(rows) + "\n"
    _docs.write_section(SECTION, text)


if __name__ == "__main__":
    main()
