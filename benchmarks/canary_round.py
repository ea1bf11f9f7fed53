"""One canary round on the emulated cluster after the gate abstains: what the plan expected, what the
prediction-powered verdict measured, against the candidate on the whole cluster (the truth).

Quick configuration (one seed): a 2-member twin (``rounds=0, bc_epochs=2``, empirical population)
on ``--agents`` groups × 2 random-policy days, a ``--train-steps`` PPO candidate, the demo's
promotion step (`edgetwin.demo._promote_and_serve`: gate -> plan on <= 10 % of the groups for
<= 1 day -> canary through an edge runtime -> PPI verdict). The truth is the candidate and the
random policy each run on the whole cluster for one day (``evaluate_policy``, seed ``seed + 30_000``; not
the very world the canary ran in, so the truth carries that day-to-day noise).
Writes ``docs/benchmarks/canary_round/results.json``. The three arms (twin alone, canary alone,
twin + canary) over the what-if gate's candidates are `benchmarks/closed_loop.py`'s.

    python benchmarks/canary_round.py [--agents 100] [--train-steps 2000] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "canary_round"


def main(argv: list[str] | None = None) -> dict:
    import torch

    from edgetwin.contract.policy import RandomPolicy
    from edgetwin.demo import _promote_and_serve
    from edgetwin.emulator.cluster import ClusterConfig, EdgeCluster, cluster_kpi_columns
    from edgetwin.emulator.logs import generate_logs
    from edgetwin.policies.evaluate import ArraySystem, evaluate_policy
    from edgetwin.policies.export import load_policy
    from edgetwin.policies.train import train_policy
    from edgetwin.twin.twin import Twin

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--agents", type=int, default=100)
    ap.add_argument("--train-steps", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    cfg = ClusterConfig(n_agents=a.agents, steps=96)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        df, spec = generate_logs(cfg, 2, "random", seed=a.seed)
        twin = Twin.fit(df, spec, seed=a.seed, members=2, progress=False, rounds=0, bc_epochs=2,
                        population_model="empirical")  # fmt: skip
        pol = train_policy(twin, algo="ppo", steps=a.train_steps, seed=a.seed, out=out / "policy", progress=False)
        recent, _ = generate_logs(cfg, 2, "random", seed=a.seed + 10_000)  # the gate's recent log, as the demo's
        nums = _promote_and_serve(twin, recent, Path(pol.path), out, cfg, a.seed, print)
        canary = json.loads((out / "canary.json").read_text()) if (out / "canary.json").exists() else None
        # truth: the candidate and the current (random) policy on the whole cluster for one day
        system = ArraySystem(EdgeCluster(cfg), EdgeCluster(cfg).spec)
        kpis = cluster_kpi_columns()
        day = a.seed + 30_000
        cand = evaluate_policy(load_policy(pol.path), system, episodes=1, seed=day, kpis=kpis, name="candidate")
        cur = evaluate_policy(RandomPolicy(spec, seed=a.seed), system, episodes=1, seed=day, kpis=kpis, name="current")
    truth = {k: (cand.mean[k] - cur.mean[k]) / abs(cur.mean[k]) for k in ("offload_ratio", "slo_violation_rate")
             if k in cand.mean and cur.mean.get(k)}  # fmt: skip
    res = {
        "config": {"agents": a.agents, "train_steps": a.train_steps, "seed": a.seed},
        "gate_abstained": "gate_abstained" in nums, "promoted_version": nums.get("promoted_version"),
        "canary": nums.get("canary"), "rounds": (canary or {}).get("rounds", []),
        "truth_relative_change": truth, "seconds": time.perf_counter() - t0,
    }  # fmt: skip
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "results.json").write_text(json.dumps(res, indent=1, default=float))
    print(json.dumps({"canary": res["canary"], "truth": truth}, indent=1, default=float))
    return res


if __name__ == "__main__":
    main()
