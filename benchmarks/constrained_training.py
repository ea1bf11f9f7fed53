"""Constrained vs plain PPO (issue 44): trained in a twin, scored on the emulated cluster per declared KPI.

A twin is learned from 3 days of the cluster's logs under the random logging policy (the
twin-fidelity benchmark's quick settings). In it, two policies are trained with the same seed and
steps:

* **PPO** on the spec's reward, the operator's weighted multi-objective (`REWARD_WEIGHTS`);
* **PPO-Lagrangian** (`edgetwin.policies.lagrangian`) on the same reward, with every KPI the spec
  declares a direction for as a constraint: its per-step mean within its margin of the logging
  policy's. The limits are the logging policy's means *in the twin* (`constraints_from_log` on the
  twin's rollout of its clone of the logging policy), so that a constraint bounds the change against
  the logging policy as the twin sees it, the quantity the gate checks; limits from the logged means
  would also charge the twin's level error on a KPI (e.g. its revenue level) to the policy.

Both are then run on the cluster on unseen episodes beside the logging policy (`random`), the same
episodes for all three (paired), and scored per declared KPI with `edgetwin.demo.cluster_change`
(relative change, paired Student-t 90 % interval, regressed beyond the margin or not): what the demo
prints and gates on. The twin's own prediction of each change (the same policies, 4 generated days,
common random numbers) stands beside it.

    python benchmarks/constrained_training.py [--seed 0] [--steps 30000] [--episodes 4] [--work DIR]

Writes docs/benchmarks/twin_fidelity/constrained.json and the "### Constrained policy vs plain PPO"
subsection of docs/benchmarks/twin_fidelity/README.md (machine: 2 CPU cores shared with other jobs).
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path
from typing import Any

import torch
from _policy_bench import KPIS

from edgetwin.contract.policy import RandomPolicy
from edgetwin.demo import cluster_change
from edgetwin.emulator.cluster import ClusterConfig, EdgeCluster, cluster_spec
from edgetwin.emulator.logs import generate_logs
from edgetwin.policies.evaluate import ArraySystem, evaluate_policy
from edgetwin.policies.export import load_policy
from edgetwin.policies.lagrangian import constraints_from_log
from edgetwin.policies.train import train_policy
from edgetwin.twin.twin import Twin

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks" / "twin_fidelity" / "README.md"
JSON = ROOT / "docs" / "benchmarks" / "twin_fidelity" / "constrained.json"
SECTION = "### Constrained policy vs plain PPO, scored on the cluster (issue 44)"


def fit(work: Path, seed: int) -> tuple[Twin, Any]:
    """The quick twin of `twin_fidelity.py --quick` (3 days, 1 member, 10 GAIL rounds), cached."""
    cfg = ClusterConfig(n_agents=100, steps=96)
    spec = cluster_spec(cfg)
    path = work / f"twin-s{seed}"
    if (path / "meta.json").is_file():
        return Twin.load(path), spec
    train, _ = generate_logs(cfg, episodes=3, policy=RandomPolicy(spec, seed=seed), seed=seed)
    twin = Twin.fit(train, spec, seed=seed, members=1, population_hyper={"steps": 500}, progress=True,
                    rounds=10, bc_epochs=10)
    twin.save(path)
    return twin, spec


def twin_change(twin: Twin, pols: dict[str, Any], cols: list[str], seed: int, days: int) -> dict[str, dict[str, float]]:
    """The twin's relative change of each of ``cols``' means vs ``random``, every policy on the same
    generated days (one seed: common random numbers)."""
    means = {n: twin.rollout(p, episodes=days, seed=seed, n_agents=100, steps=96)[cols].mean() for n, p in pols.items()}
    return {n: {k: float((m[k] - means["random"][k]) / abs(means["random"][k])) for k in cols}
            for n, m in means.items() if n != "random"}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=30_000, help="PPO steps of each policy (the demo's 30,000)")
    ap.add_argument("--episodes", type=int, default=4, help="unseen cluster episodes per policy")
    ap.add_argument("--dual-lr", type=float, default=0.5, help="the multipliers' dual-ascent step per rollout")
    ap.add_argument("--work", type=Path, default=Path("/tmp/edgetwin-constrained"))
    ap.add_argument("--no-write", action="store_true", help="print only; do not update the docs")
    args = ap.parse_args()
    torch.set_num_threads(1)
    args.work.mkdir(parents=True, exist_ok=True)
    t_all = time.perf_counter()
    twin, spec = fit(args.work, args.seed)
    base = twin.rollout(twin.logging_policy(seed=args.seed + 1), episodes=2, seed=args.seed + 2, n_agents=100, steps=96)
    constraints = constraints_from_log(spec, base)
    trained: dict[str, Any] = {}
    meta: dict[str, Any] = {}
    for name, extra in (("PPO", {}), ("PPO-Lagrangian", {"constraints": constraints, "dual_lr": args.dual_lr})):
        out = args.work / (f"{name}-s{args.seed}-{args.steps}" + (f"-dual{args.dual_lr}" if extra else ""))
        try:  # trained by an earlier run of the same configuration (the twin is cached too)
            trained[name] = load_policy(out)
        except Exception:
            res = train_policy(twin, algo="ppo", steps=args.steps, seed=args.seed, out=out, progress=False,
                               checkpoint_every=0, resume=False, **extra)
            trained[name] = load_policy(res.path)
        meta[name] = trained[name].metadata.get("constraints")
    cluster = EdgeCluster(ClusterConfig(n_agents=100, steps=96))
    system = ArraySystem(cluster, cluster.spec)
    eval_seed = args.seed + 10_000  # episodes the twin never saw
    pols = {"random": RandomPolicy(spec, seed=args.seed), **trained}
    results = {n: evaluate_policy(p, system, episodes=args.episodes, seed=eval_seed, kpis=KPIS, name=n)
               for n, p in pols.items()}
    changes = {n: cluster_change(results[n], results["random"], cluster.spec) for n in trained}
    predicted = twin_change(twin, pols, list(changes["PPO"]), args.seed + 500, 4)
    out = {"args": {k: str(v) for k, v in vars(args).items()},
           "constraints": [{"column": c.column, "limit": c.limit, "higher_is_better": c.higher_is_better}
                           for c in constraints],
           "multipliers": meta, "cluster_change": changes, "twin_change": predicted,
           "returns": {n: r.mean["return"] for n, r in results.items()},
           "seconds": time.perf_counter() - t_all}
    print(section({"": out}))
    if not args.no_write:
        runs = json.loads(JSON.read_text()) if JSON.is_file() else {}
        runs[run_key(args)] = out
        JSON.write_text(json.dumps(runs, indent=1, default=float))
        write_section(section(runs))


def run_key(args: argparse.Namespace) -> str:
    """One run's key in constrained.json: every run of another configuration stays beside it."""
    return f"seed={args.seed} steps={args.steps} dual_lr={args.dual_lr} episodes={args.episodes}"


def section(runs: dict[str, dict[str, Any]]) -> str:
    """The page's subsection: a table per run (configuration) in ``runs``."""
    L = [SECTION, "",
         "The twin-fidelity quick twin (3 days under random actions, 1 member); PPO (the spec's reward) and "
         "PPO-Lagrangian (the same reward, every declared KPI within its margin of the logging policy's mean in the twin "
         "as a constraint) trained with the same seed and steps; scored on unseen cluster episodes, the same for every "
         "policy, against the logging policy (`random`): relative change [paired Student-t 90 % interval]; **bold**: "
         "beyond the KPI's margin in the bad direction with the whole interval (what the demo refuses). The twin's "
         "prediction (4 generated days, common random numbers) beside it. 2 CPU cores shared with other jobs."]
    for out in runs.values():
        L += _run_lines(out)
    return "\n".join(L) + "\n"


def _run_lines(out: dict[str, Any]) -> list[str]:
    a = out["args"]
    ch, tw = out["cluster_change"], out["twin_change"]
    kpis = list(next(iter(ch.values())))
    L = ["", f"`python benchmarks/constrained_training.py --seed {a['seed']} --steps {a['steps']} --episodes "
         f"{a['episodes']} --dual-lr {a['dual_lr']}` ({out['seconds'] / 60:.0f} min; {int(a['steps']):,} PPO steps each, "
         f"{a['episodes']} cluster episodes, dual step {a['dual_lr']}):", "",
         "| KPI | direction, margin | PPO on the cluster | PPO-Lagrangian on the cluster | PPO, twin | PPO-Lagrangian, twin |",
         "|---|---|---:|---:|---:|---:|"]
    for k in kpis:
        c0 = ch["PPO"][k]
        cells = []
        for n in ("PPO", "PPO-Lagrangian"):
            c = ch[n][k]
            t = f"{100 * c['change']:+.1f} % [{100 * c['interval'][0]:+.1f}, {100 * c['interval'][1]:+.1f}]"
            cells.append(f"**{t}**" if c["regressed"] else t)
        twin = [f"{100 * tw[n][k]:+.1f} %" if k in tw[n] else "—" for n in ("PPO", "PPO-Lagrangian")]
        L.append(f"| {k} | {c0['better']}, {100 * c0['margin']:g} % | {cells[0]} | {cells[1]} | {twin[0]} | {twin[1]} |")
    lam = out["multipliers"].get("PPO-Lagrangian") or []
    if lam:
        L += ["", "The multipliers at the end of training: " + ", ".join(
            f"{d.get('column')} {float(d.get('lambda', float('nan'))):.2f} (last mean violation "
            f"{float(d.get('last_violation') or 0.0):+.3f})" for d in lam) + "."]
    regressed = {n: [k for k, c in ch[n].items() if c["regressed"]] for n in ch}
    L += ["", "Regressed beyond the margin on the cluster: " + "; ".join(
        f"{n}: {', '.join(v) if v else 'none'}" for n, v in regressed.items()) + "."]
    return L


def write_section(text: str) -> None:
    """Replace (or append) this subsection of the twin-fidelity page, up to the next heading."""
    doc = DOC.read_text()
    pattern = re.compile(rf"^{re.escape(SECTION)}\n.*?(?=^## |^### |\Z)", re.S | re.M)
    doc = pattern.sub(text + "\n", doc) if pattern.search(doc) else doc.rstrip("\n") + "\n\n" + text + "\n"
    DOC.write_text(doc)


if __name__ == "__main__":
    main()
