"""Issue 44: where the multi-member MAIL twin's reward offset came from (the diagnosis behind the twin
fidelity page's subsection "The offset diagnosed"; a diagnostic, not a table of the paper).

For each configuration (members x training days; the quick run's other settings: 100 agents, 96 ticks,
the uniformly random logging policy, 10 GAIL rounds, 10 BC epochs, GAN-SMMSG ``--pop-steps`` steps) one
twin is fitted; then every member's output noise model is fitted twice from the same training log
(`Member.fit_output_noise`, ``source="held-out"``: the days its bootstrap draw left out, the former
default; ``source="training"``: the days of its draw, the default since issue 44), and under each the
random policy runs on ``--eval-days`` cluster days and in the twin (`Twin.rollout(all_members=True)`,
as the full benchmark's section 3, and each member alone). Per run: the mean per-step reward and each
reward term (weight x the column's mean over agent-steps, `REWARD_WEIGHTS`), and each member's
task time one step ahead, teacher forced on the cluster days (`one_step_outputs`), over their logged
mean. Also the training days' mean task time and each member's draw.

    python benchmarks/_twin_offset.py --json docs/benchmarks/twin_fidelity/offset.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from edgetwin.contract.policy import RandomPolicy
from edgetwin.emulator.cluster import ClusterConfig, cluster_spec
from edgetwin.emulator.logs import generate_logs
from edgetwin.twin.fidelity import one_step_outputs
from edgetwin.twin.member import NOISE_SOURCES
from edgetwin.twin.twin import Twin

N_AGENTS, STEPS = 100, 96
TASK = "kpi.task_time_ms"


def terms(df: pd.DataFrame, weights: dict[str, float]) -> dict[str, float]:
    """The mean per-step reward and each weighted term's mean over the agent-steps of ``df``."""
    out = {"reward": float(df["reward"].mean())}
    out.update({c: float(w * df[c].mean()) for c, w in weights.items()})
    return out


def draws(seed: int, members: int, days: int) -> list[list[int]]:
    """Each member's bootstrap draw of the training days (`edgetwin.twin.twin._plan_members`' draws)."""
    if members == 1:
        return [list(range(days))]
    return [sorted(int(d) for d in np.random.default_rng([seed, m]).choice(days, size=days, replace=True))
            for m in range(members)]


def one_config(members: int, days: int, args: argparse.Namespace) -> dict[str, Any]:
    cfg = ClusterConfig(n_agents=N_AGENTS, steps=STEPS)
    spec = cluster_spec(cfg)
    weights = dict(spec.reward_weights)
    train, _ = generate_logs(cfg, episodes=days, policy=RandomPolicy(spec, seed=args.seed), seed=args.seed)
    t0 = time.perf_counter()
    twin = Twin.fit(train, spec, seed=args.seed, members=members, population_hyper={"steps": args.pop_steps},
                    progress=False, rounds=args.rounds, bc_epochs=10, workers=args.workers)
    fit_s = time.perf_counter() - t0
    twin.profile_retries = 4
    pol = RandomPolicy(spec, seed=args.seed + 7)
    seed = args.seed + 500
    real, _ = generate_logs(cfg, episodes=args.eval_days, policy=pol, seed=seed)
    episodes = train["episode"].unique()
    picks = draws(args.seed, members, days)
    out: dict[str, Any] = {
        "members": members, "days": days, "fit_s": fit_s, "draws": picks,
        "train_day_task_time_ms": [float(v) for v in train.groupby("episode", sort=False)[TASK].mean()],
        "cluster": terms(real, weights), "sources": {},
    }
    for source in NOISE_SOURCES:
        for m, mem in enumerate(twin.members):
            mem.fit_output_noise(train, episodes, None if members == 1 else np.asarray(picks[m]), twin.layout,
                                 args.seed * 1000 + m + 700, source=source)
        every = twin.rollout(pol, episodes=args.eval_days, seed=seed, n_agents=N_AGENTS, steps=STEPS, all_members=True)
        res: dict[str, Any] = {"all_members": terms(every, weights), "member": [], "one_step_task_time_ratio": [],
                               "noise_source": [mem.noise_source for mem in twin.members]}
        for m in range(members):
            res["member"].append(terms(every[every["episode"].str.endswith(f"-m{m}")], weights))
            one = one_step_outputs(twin, real, seed=seed, member=m)
            res["one_step_task_time_ratio"].append(float(one[TASK].mean() / real[TASK].mean()))
        out["sources"][source] = res
        print(f"{members} members, {days} days, noise on {source} episodes: all members "
              f"{res['all_members']['reward']:+.3f} (task-time term {res['all_members'][TASK]:+.3f}); cluster "
              f"{out['cluster']['reward']:+.3f} ({out['cluster'][TASK]:+.3f}); per member "
              f"{[round(r['reward'], 3) for r in res['member']]}; one-step task time / logged "
              f"{[round(r, 2) for r in res['one_step_task_time_ratio']]}", flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--configs", default="1x3,3x3,1x6,3x6",
                    help="members x training days, comma-separated (default 1x3,3x3,1x6,3x6)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--pop-steps", type=int, default=1500, help="GAN-SMMSG steps (the full run's 1500)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--eval-days", type=int, default=10)
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    runs = []
    for c in args.configs.split(","):
        members, days = (int(v) for v in c.lower().split("x"))
        runs.append(one_config(members, days, args))
    result = {"command": "python benchmarks/_twin_offset.py" + (f" --seed {args.seed}" if args.seed else ""),
              "seed": args.seed, "eval_days": args.eval_days, "rounds": args.rounds, "pop_steps": args.pop_steps,
              "minutes": (time.perf_counter() - t0) / 60, "runs": runs}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
