"""Does `edgetwin train` with its defaults ever export something worse than a simple policy?

`edgetwin train` trains PPO in the twin with the support-aware penalty (ensemble disagreement in the
reward), then scores the trained network beside simple candidates (constant actions on a grid of
the action box, the logging clone) in the twin and exports the best by the lower bound of its 90 %
interval of the return. Here the emulated cluster is the real system: for three seeds, the exported
policy's real return is compared with the real return of every simple candidate it scored, beside
PPO trained with seed 004's action-norm pull (λ = 0.4, no support penalty) and with no regulariser
(λ = 0), which export the network as trained.

    python benchmarks/train_selection.py [--logging random|production] [--seeds 0,1,2] [--steps 40000]
        [--work DIR] [--no-write]

Writes the `## Training that stays where the twin is right` section of docs/benchmarks/train_selection/README.md and
docs/benchmarks/train_selection/results_<logging>.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import torch
from _docs import write_section
from _scale_args import add_scale_args, scale_kwargs
from scipy.stats import spearmanr
from whatif_gate import LOGGING_TEXT, fit_or_load, logging_policy

from edgetwin.emulator.cluster import ClusterConfig, cluster_spec
from edgetwin.emulator.logs import generate_logs
from edgetwin.policies.candidates import select_export, simple_candidates
from edgetwin.policies.export import load_policy
from edgetwin.policies.train import train_policy

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks" / "train_selection"
SECTION = "## Training that stays where the twin is right (support-aware penalty, selection by lower bound)"


#: hand-written subsections of the docs section that a rerun keeps
KEEP: tuple[str, ...] = ()  # no hand-written subsections; past runs are in docs/benchmarks/CHANGELOG.md


def real_return(cfg: ClusterConfig, policy: Any, seed: int, episodes: int = 2) -> float:
    """Mean per-step reward over ``episodes`` days of the cluster under ``policy`` (paired seeds)."""
    log, _ = generate_logs(cfg, episodes=episodes, policy=policy, seed=seed)
    return float(log["reward"].mean())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--logging", choices=sorted(LOGGING_TEXT), default="random")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--steps", type=int, default=40_000)
    ap.add_argument("--members", type=int, default=5)
    ap.add_argument("--work", type=Path, default=Path("/tmp/edgetwin-whatif-gate"))
    ap.add_argument("--no-write", action="store_true")
    add_scale_args(ap)
    args = ap.parse_args()
    torch.set_num_threads(1)
    t_all = time.perf_counter()
    cfg = ClusterConfig(n_agents=100, steps=96)
    spec = cluster_spec(cfg)
    train, _ = generate_logs(cfg, episodes=6, policy=logging_policy(args.logging, spec, 0), seed=0)
    twin = fit_or_load(args.work, args.logging, args.members, train, spec, scale_kwargs(args))
    eval_seed = 4242
    logging_real = real_return(cfg, logging_policy(args.logging, spec, eval_seed), eval_seed)
    simple = simple_candidates(twin, seed=0)
    simple_real = {name: real_return(cfg, p, eval_seed) for name, p in simple.items()}
    runs = []
    for seed in [int(s) for s in args.seeds.split(",")]:
        row: dict[str, Any] = {"seed": seed}
        for variant, lam, penalty in (("default", None, None), ("lambda=0.4", 0.4, 0.0), ("lambda=0", 0.0, 0.0)):
            out = args.work / f"sel-{args.logging}-{variant}-{seed}-{args.steps}"
            opts: dict[str, Any] = {"n_agents": 64}
            if penalty is not None:
                opts["disagreement_penalty"] = penalty
            res = train_policy(twin, "ppo", steps=args.steps, seed=seed, out=out, checkpoint_every=0, resume=False,
                               twin_opts=opts, action_norm_lambda=lam, progress=True)  # fmt: skip
            net_real = real_return(cfg, load_policy(res.path), eval_seed)
            row[variant] = {"network_real": net_real}
            if variant == "default":
                sel = select_export(twin, res.path, seed=seed, episodes=2, n_agents=64)
                row["selection"] = sel.to_dict()
                row[variant]["exported"] = sel.chosen
                row[variant]["exported_real"] = net_real if not sel.replaced else real_return(
                    cfg, load_policy(sel.path), eval_seed)
                scored_best = max((s for s in sel.scores if not s.trained), key=lambda s: s.low)
                row["twin_best_simple"] = scored_best.name
                row["twin_best_simple_real"] = simple_real[scored_best.name]
            print(seed, variant, row[variant], flush=True)
        row["best_simple_real"] = max(simple_real.values())
        row["never_below_best_simple"] = bool(row["default"]["exported_real"] >= row["best_simple_real"] - 1e-12)
        row["never_below_twin_best_simple"] = bool(row["default"]["exported_real"] >= row["twin_best_simple_real"] - 1e-12)
        runs.append(row)
    doc = {"logging": args.logging, "steps": args.steps, "logging_real": logging_real, "simple_real": simple_real,
           "runs": runs, "minutes": (time.perf_counter() - t_all) / 60}  # fmt: skip
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"results_{args.logging}.json").write_text(json.dumps(doc, indent=1, default=float))
    docs = {n: json.loads((OUT / f"results_{n}.json").read_text()) for n in LOGGING_TEXT
            if (OUT / f"results_{n}.json").is_file()}  # fmt: skip
    text = section(docs)
    print(text)
    if not args.no_write:
        write_section(SECTION, text, keep=KEEP)


def candidate_reals(doc: dict[str, Any], run: dict[str, Any]) -> list[tuple[dict[str, Any], float]]:
    """Each candidate the selection of ``run`` scored in the twin, with its real return (the trained
    network's is the default network's)."""
    return [(s, run["default"]["network_real"] if s["trained"] else doc["simple_real"][s["name"]])
            for s in run["selection"]["scores"]]  # fmt: skip


def why(doc: dict[str, Any]) -> str:
    """Where the default loses, per seed, from the selection's own record: which candidate it exported
    and why, and how the twin's ranking of the scored candidates agrees with their real returns."""
    parts = []
    for r in doc["runs"]:
        sel, scored = r["selection"], candidate_reals(doc, r)
        trained = next(s for s, _ in scored if s["trained"])
        if sel["exported_trained_network"]:
            reason = "exported the trained network"
        elif trained["out_of_support"] > sel["max_out_of_support"]:
            reason = (f"set aside the trained network ({100 * trained['out_of_support']:.0f} % of its agent-steps outside "
                      f"the logs' support, over the {100 * sel['max_out_of_support']:.0f} % rule; real "
                      f"{r['default']['network_real']:.4f}) for {sel['chosen']} (real {r['default']['exported_real']:.4f})")
        else:
            reason = (f"preferred {sel['chosen']} (real {r['default']['exported_real']:.4f}) to the trained network (real "
                      f"{r['default']['network_real']:.4f}) by the lower bound in the twin")
        best, _ = max(((s, real) for s, real in scored if not s["trained"]), key=lambda x: x[1])
        eligible = "eligible" if best["out_of_support"] <= sel["max_out_of_support"] else "not eligible"
        rho = spearmanr([s["mean"] for s, _ in scored], [real for _, real in scored])[0]
        parts.append(f"seed {r['seed']} {reason}; the best simple candidate on the cluster, {best['name']}, had "
                     f"{100 * best['out_of_support']:.0f} % outside the support ({eligible}); twin's mean return vs "
                     f"real return over the {len(scored)} scored candidates: Spearman ρ {rho:+.2f}")
    return "; ".join(parts) + "."


def section(docs: dict[str, dict[str, Any]]) -> str:
    steps = sorted({int(d["steps"]) for d in docs.values()})
    minutes = " + ".join(f"{d['minutes']:.0f} min ({name})" for name, d in docs.items())
    lines = [
        SECTION, "",
        f"Command: `python benchmarks/train_selection.py --logging {{random,production}} --steps "
        f"{'/'.join(str(s) for s in steps)}` ({minutes} on 2 shared CPU cores; the script's default is 40k PPO "
        "steps). The "
        "whatif-gate benchmark's twin (MAIL-MMSG, 5 members, 6 logged days); PPO in it with 64 agents per episode; "
        "real return = mean per-step reward over 2 paired days of the cluster (100 service groups), the reward "
        "being the cluster's `REWARD_WEIGHTS` (the operator's multi-objective since bd3f855; the JSON files of "
        "runs before it, e.g. at 0e8be39, hold returns of another reward, not comparable). *default* = "
        "`edgetwin train`'s defaults: support-aware penalty (1 x ensemble disagreement), no action-norm pull, then "
        "selection among the trained network and the simple candidates by the lower bound of the 90 % interval of "
        "the return in the twin. The λ rows export the network as trained (no support penalty).", "",
        "| logs | seed | default: exported | its real return | λ = 0.4 network | λ = 0 network | default network "
        "| best simple candidate (real) | twin's best simple (real) | logging policy (real) | never below the best simple? |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]  # fmt: skip
    for name, d in docs.items():
        for r in d["runs"]:
            lines.append(
                f"| {name} | {r['seed']} | {r['default']['exported']} | {r['default']['exported_real']:.4f} | "
                f"{r['lambda=0.4']['network_real']:.4f} | {r['lambda=0']['network_real']:.4f} | "
                f"{r['default']['network_real']:.4f} | {r['best_simple_real']:.4f} | "
                f"{r['twin_best_simple']} ({r['twin_best_simple_real']:.4f}) | {d['logging_real']:.4f} | "
                f"{'yes' if r['never_below_best_simple'] else '**no**'} |"
            )
    lines.append("")
    for name, d in docs.items():
        runs = d["runs"]
        below = [r["seed"] for r in runs if not r["never_below_best_simple"]]
        margin = min(r["default"]["exported_real"] - r["best_simple_real"] for r in runs)
        lines.append(
            f"Reading, *{name} logs* (mean reward per step on the cluster, seeds in order): default "
            + " / ".join(f"{r['default']['exported_real']:.3f}" for r in runs) + ", λ = 0.4 "
            + " / ".join(f"{r['lambda=0.4']['network_real']:.3f}" for r in runs) + ", λ = 0 "
            + " / ".join(f"{r['lambda=0']['network_real']:.3f}" for r in runs)
            + f"; best simple candidate {runs[0]['best_simple_real']:.3f}, logging policy {d['logging_real']:.3f}; "
            f"below the best simple candidate on seed(s): {below or 'none'}; smallest margin over it "
            f"{margin:+.4f}. Why: {why(d)}"
        )
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
