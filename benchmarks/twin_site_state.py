"""Site-level state: does the twin's `SiteStateModel` follow a policy it never saw in the logs?

A site property (here the emulated cluster's ``state.site_reserved``, reserved / total vCPU at an
edge site) is what the twin drifts on most in free runs (docs/benchmarks/twin_fidelity/README.md, "Where the return
error comes from"). This isolates that one model: it is fitted on 3 days logged under uniformly
random actions, then, teacher forced (the real run's states, actions and outputs of each tick as
inputs), predicts every (episode, site, tick)'s next value on 2 other days run under six platform
policies. Baseline in the same run: the training days' mean level, which is where a model of single
agents (the twin's default, the mean of its agents' predictions) drifts back to.

Run (2 CPU cores, ~2 min a seed):  python benchmarks/twin_site_state.py --seeds 0 1 2
Writes the `## Twin site-level state (SiteStateModel)` section of docs/benchmarks/twin_site_state/README.md.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pandas as pd
import torch
from _docs import write_section

from edgetwin.contract.policy import FunctionPolicy, RandomPolicy
from edgetwin.emulator.cluster import ClusterConfig
from edgetwin.emulator.logs import SLOAwarePolicy, generate_logs
from edgetwin.imitation.layout import Layout
from edgetwin.imitation.site_model import SiteStateModel
from edgetwin.imitation.steps import build_steps

SECTION = "## Twin site-level state (SiteStateModel)"
COLUMN = "state.site_reserved"


def constant(edge: float, cap: float, price: float) -> FunctionPolicy:
    return FunctionPolicy(lambda o: np.tile([edge, cap, price], (len(o), 1)), name=f"{edge}/{cap}/{price}")


def teacher_forced(model: SiteStateModel, layout: Layout, log: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """``(real, predicted)`` raw next values ``(G, k)`` of the model's columns, every logged group."""
    steps = build_steps(log, layout)
    who, did, codes, site_x, zs_next = model.logged_groups(steps, layout)
    pred = model.predict(who, did, codes, site_x)
    ok = np.isfinite(zs_next).all(axis=1)

    def raw(z: np.ndarray) -> np.ndarray:
        full = np.zeros((len(z), len(layout.state)))
        full[:, model.columns] = z
        return layout.scalers["state"].inverse(full)[:, model.columns]

    return raw(zs_next[ok]), raw(pred[ok])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args()
    torch.set_num_threads(1)
    cfg = ClusterConfig(n_agents=100, steps=96)
    rows: list[dict[str, object]] = []
    r2: dict[int, dict[str, float]] = {}
    products: dict[int, dict[str, bool]] = {}
    t0 = time.perf_counter()
    for seed in args.seeds:
        train, spec = generate_logs(cfg, episodes=3, seed=seed)
        layout = Layout.fit(train, spec)
        model = SiteStateModel.fit(build_steps(train, layout), layout, seed=seed)
        assert model is not None
        names = [layout.state[c] for c in model.columns]
        j = names.index(COLUMN)
        r2[seed] = dict(zip(names, map(float, model.val_r2), strict=True))
        products[seed] = dict(zip(names, map(bool, model.products), strict=True))
        level = float(train.groupby(["episode", "site", "t"])[COLUMN].first().mean())
        policies = {
            "random (the logging policy)": RandomPolicy(spec, 1),
            "heuristic (SLO-aware)": SLOAwarePolicy(spec),
            "all edge, cap 1, price .5": constant(1.0, 1.0, 0.5),
            "half, cap 2, price .2": constant(0.5, 2.0, 0.2),
            "half, cap .3, price .9": constant(0.5, 0.3, 0.9),
            "edge, cap 1.5, price .1": constant(1.0, 1.5, 0.1),
        }
        for name, pol in policies.items():
            real_log, _ = generate_logs(cfg, episodes=2, policy=pol, seed=seed + 500)
            y, yhat = teacher_forced(model, layout, real_log)
            rows.append({"seed": seed, "policy": name, "real": y[:, j].mean(), "model": yhat[:, j].mean(),
                         "level": level, "mae": np.abs(y[:, j] - yhat[:, j]).mean()})
            print(rows[-1], flush=True)
    df = pd.DataFrame(rows)
    minutes = (time.perf_counter() - t0) / 60
    seeds = " ".join(map(str, args.seeds))
    L = [SECTION, "",
         f"Command: `python benchmarks/twin_site_state.py --seeds {seeds}` (2 shared CPU cores, {minutes:.0f} min). "
         "Per seed: `SiteStateModel` fitted on 3 days of the emulated cluster (100 groups, 96 ticks) logged under "
         "uniformly random actions; scored teacher forced on 2 other days (seed + 500) per policy. `real` and "
         f"`model`: mean next `{COLUMN}` over every (episode, site, tick); `training level`: its mean on the training "
         "days (where the default twin, the mean of single agents' predictions, drifts back to); MAE per group and "
         "tick.", "",
         "| seed | policy | real | model | training level | model MAE |", "|---|---|---|---|---|---|"]
    for _, r in df.iterrows():
        L.append(f"| {r['seed']} | {r['policy']} | {r['real']:.2f} | {r['model']:.2f} | {r['level']:.2f} | "
                 f"{r['mae']:.2f} |")
    fixed = df[~df["policy"].str.startswith("random")]
    err_model = (fixed["model"] - fixed["real"]).abs().mean()
    err_level = (fixed["level"] - fixed["real"]).abs().mean()
    L += ["", f"Over the policies other than the logging one: mean |model - real| {err_model:.2f}, "
          f"mean |training level - real| {err_level:.2f}.", "",
          "Held-out R² of each site column's next value (15 % of the training episodes, logging policy; "
          "- where the column hardly moves there; x where the column kept the pairwise products of actions "
          "and outputs, which it does only where they lower this held-out error):", "",
          "| seed | " + " | ".join(next(iter(r2.values()))) + " |", "|---|" + "---|" * len(next(iter(r2.values())))]
    for seed, vals in r2.items():
        cells = [(f"{v:.2f}" if np.isfinite(v) else "- (constant)") + (" x" if products[seed][c] else "")
                 for c, v in vals.items()]
        L.append(f"| {seed} | " + " | ".join(cells) + " |")
    md = "\n".join(L) + "\n"
    print(md)
    if not args.no_write:
        write_section(SECTION, md)


if __name__ == "__main__":
    main()
