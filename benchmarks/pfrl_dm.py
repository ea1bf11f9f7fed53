"""PFRL-DM (seed 000) on heterogeneous emulated edge sites, over the MA-FL agents.

Four (or more) sites built from different workload archetypes (scenario mix, provisioning level,
drift: `edgetwin.edge.agents.SITE_ARCHETYPES`, in the spirit of seed 000 Table 3) each train a
platform policy on their own emulated cluster. Compared, as in seed 000 §5.2 / Fig. 15:

- PFRL-DM: dual-critic PPO, only the public critic federated, multi-head attention aggregation
  (personalised critics, seed 000 eqs. 18-22, Algorithm 1);
- FedAvg: PPO with actor and critic federated and averaged;
- FedAvgM (server momentum 0.9, server step 1 - β = 0.1): a momentum stand-in for MFPO;
- independent PPO: no federation.

Every federated method runs through the real agents (GCA + one ESA per site) on the in-process
bus, full participation, dense updates (the paper does not compress). Reported: the reward curve
per site episode (PNG), the final reward (mean of the last 5 rounds), and the number of site
episodes until the smoothed curve first makes 95 % of the way from the common starting reward to
the best final reward of any method. Seed 000 gives no table for this: its claim (Fig. 15) is that
PFRL-DM converges in fewer episodes than FedAvg and independent PPO and that FedAvg ends lower.

    python benchmarks/pfrl_dm.py                    # writes docs/benchmarks.md + PNG
    python benchmarks/pfrl_dm.py --quick --no-write
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import _docs
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from edgetwin.edge.agents import heterogeneous_sites  # noqa: E402
from edgetwin.edge.federation import make_federation_config, run_federation, train_independent  # noqa: E402

SECTION = "## MA-FL: PFRL-DM personalised federated RL (seed 000)"
ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks.md"
OUT = ROOT / "docs" / "benchmarks" / "mafl"

PPO = {"kind": "ppo", "algo": "ppo", "federate": "policy", "net_arch": [32, 32]}
DUAL = {"kind": "ppo", "algo": "dual_critic_ppo", "federate": "public_critic", "net_arch": [32, 32]}
METHODS: dict[str, dict | None] = {
    "PFRL-DM (dual-critic PPO, attention on the public critic)": {"learner": DUAL, "strategy": "attention"},
    "FedAvg (PPO, actor + critic)": {"learner": PPO, "strategy": "fedavg"},
    "FedAvgM β=0.9 (MFPO stand-in)": {
        "learner": PPO,
        "strategy": {"name": "fedavgm", "momentum": 0.9, "server_lr": 0.1},
    },
    "Independent PPO": None,
}
PAPER = {
    "PFRL-DM (dual-critic PPO, attention on the public critic)": "fastest; best final reward",
    "FedAvg (PPO, actor + critic)": "sub-optimal under heterogeneity",
    "FedAvgM β=0.9 (MFPO stand-in)": "improves steadily, below PFRL-DM",
    "Independent PPO": "slower than PFRL-DM",
}


def smooth(x: np.ndarray, k: int = 3) -> np.ndarray:
    """Trailing moving average over ``k`` rounds (the first values average what there is)."""
    c = np.cumsum(np.insert(x, 0, 0.0))
    out = np.empty_like(x, dtype=np.float64)
    for i in range(len(x)):
        lo = max(0, i - k + 1)
        out[i] = (c[i + 1] - c[lo]) / (i + 1 - lo)
    return out


def run_method(name: str, spec: dict | None, sites, rounds: int, episodes: int, seed: int) -> dict:
    """Per-site reward per round (sites x rounds) and the uplink bytes per round."""
    t0 = time.perf_counter()
    if spec is None:
        learner = {**PPO, "federate": "none", "episodes_per_round": episodes, "model_seed": seed}
        hist = train_independent(sites, learner, rounds, progress=True)
        curves = np.array([[m["reward"] for m in hist[s.name]] for s in sites])
        uplink = 0.0
    else:
        learner = {**spec["learner"], "episodes_per_round": episodes, "model_seed": seed}
        cfg = make_federation_config(
            sites=sites,
            rounds=rounds,
            hierarchy=False,
            strategy=spec["strategy"],
            learner=learner,
            compression=False,
            timeout_s=600.0,
            seed=seed,
        )
        res = run_federation(cfg, bus="memory", progress=True)
        assert all(r["reason"] == "complete" for r in res.rounds), [r["reason"] for r in res.rounds]
        curves = np.array(
            [[r["reward"] for r in sorted(res.sites[s.name], key=lambda r: r["round"])] for s in sites]
        )
        uplink = float(np.mean([row.get("site", 0) for row in res.bytes_per_round]))
    return {"curves": curves, "uplink": uplink, "seconds": time.perf_counter() - t0}


def episodes_to(curve: np.ndarray, start: float, target: float, episodes: int) -> int | None:
    """Site episodes until the smoothed ``curve`` first reaches ``start + 0.95 (target - start)``."""
    if target <= start:
        return None
    s = smooth(curve)
    hit = np.flatnonzero(s >= start + 0.95 * (target - start))
    return None if hit.size == 0 else int((hit[0] + 1) * episodes)


def figure(results: dict, episodes: int, path: Path, n_sites: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    for name, runs in results.items():
        m = np.stack([r["curves"].mean(axis=0) for r in runs])  # seeds x rounds (site mean)
        x = (np.arange(m.shape[1]) + 1) * episodes
        mu, sd = smooth(m.mean(axis=0)), smooth(m.std(axis=0))
        ax.plot(x, mu, label=name.split(" (")[0])
        ax.fill_between(x, mu - sd, mu + sd, alpha=0.15)
    ax.set_xlabel("site episodes (one episode = one emulated-cluster episode of a site)")
    ax.set_ylabel("training reward per service group (mean over sites)")
    ax.set_title(f"{n_sites} heterogeneous sites: reward curves (3-round moving average, ± sd over seeds)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_section(text: str, doc: Path = DOC) -> None:
    """Replace this script's section of docs/benchmarks.md (or append it), in one write."""
    _docs.write_section(SECTION, text, doc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--episodes", type=int, default=2, help="site episodes of local training per round")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="tiny run (a smoke test of the script)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks.md alone")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.quick:
        args.rounds, args.seeds = 3, 1
    results: dict[str, list[dict]] = {name: [] for name in METHODS}
    for seed in range(args.seeds):
        sites = heterogeneous_sites(args.sites, seed=seed, n_agents=8, steps=24)
        for name, spec in METHODS.items():
            print(f"seed {seed}: {name}", flush=True)
            results[name].append(run_method(name, spec, sites, args.rounds, args.episodes, seed))
    ep = args.episodes
    start = float(np.mean([r["curves"].mean(axis=0)[0] for runs in results.values() for r in runs]))
    finals = {n: [float(r["curves"].mean(axis=0)[-5:].mean()) for r in runs] for n, runs in results.items()}
    best = max(np.mean(v) for v in finals.values())
    png = OUT / "pfrl_dm_rewards.png"
    figure(results, ep, png, args.sites)
    rows = []
    for name, runs in results.items():
        reach = [episodes_to(r["curves"].mean(axis=0), start, best, ep) for r in runs]
        per_site = [episodes_to(c, float(c[0]), float(c[-5:].mean()), ep) for r in runs for c in r["curves"]]
        rows.append(
            {
                "method": name,
                "final": finals[name],
                "reach": reach,
                "per_site": per_site,
                "uplink": float(np.mean([r["uplink"] for r in runs])),
                "seconds": float(np.mean([r["seconds"] for r in runs])),
            }
        )

    def fmt_reach(xs: list[int | None]) -> str:
        return ", ".join("never" if x is None else str(x) for x in xs)

    cmd = (
        "python benchmarks/pfrl_dm.py"
        + (" --quick" if args.quick else "")
        + f" --sites {args.sites} --rounds {args.rounds} --episodes {args.episodes} --seeds {args.seeds}"
    )
    machine = f"{os.cpu_count()} CPU cores, {platform.machine()}, Python {platform.python_version()}, torch {torch.__version__}, CPU only, cores shared with other jobs"
    lines = [
        SECTION,
        "",
        f"Command: `{cmd}`. Machine: {machine}.",
        "",
        f"{args.sites} heterogeneous sites (scenario mix, provisioning level and drift differ: "
        "`SITE_ARCHETYPES`), each an emulated cluster of 8 service groups × 24 ticks; "
        f"{args.episodes} site episodes of local PPO per round, {args.rounds} rounds, {args.seeds} seeds; "
        "γ 0.985, GAE λ 0.95, clip 0.2, entropy 0.01 (seed 003 §5.3), MLP 32×32. All federated methods run "
        "through the GCA and one ESA per site on the in-process bus, every site every round, dense updates. "
        "Reward = mean training-episode return per service group (offload ratio − 0.5 × SLO violations, summed "
        f"over the 24 ticks). 'Episodes to 95 %': site episodes until the 3-round moving average of the site-mean "
        f"curve first makes 95 % of the way from the common start ({start:.2f}) to the best final reward of any "
        f"method ({best:.2f}); per seed. 'Per-site' does the same for each site against its own final reward "
        "(median over sites and seeds).",
        "",
        "| method | final reward (last 5 rounds), per seed | episodes to 95 % of best final, per seed | per-site episodes to 95 % of own final (median) | uplink / round | wall s / run | paper (seed 000 Fig. 15) |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for r in rows:
        ps = [x for x in r["per_site"] if x is not None]
        lines.append(
            f"| {r['method']} | {', '.join(f'{v:.2f}' for v in r['final'])} | {fmt_reach(r['reach'])} | "
            f"{int(np.median(ps)) if ps else 'never'} | {r['uplink'] / 1024:.1f} KiB | {r['seconds']:.0f} | {PAPER[r['method']]} |"
        )
    lines += ["", f"![reward curves]({png.relative_to(ROOT / 'docs').as_posix()})", ""]
    text = "\n".join(lines) + "\n"
    print(text)
    (OUT / "pfrl_dm.json").write_text(json.dumps({"rows": rows, "start": start, "best": best}, indent=1))
    if not args.no_write:
        write_section(text)
        print(f"wrote {DOC}")


if __name__ == "__main__":
    main()
