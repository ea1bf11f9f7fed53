"""PFRL-DM (seed 000) on heterogeneous emulated edge sites, over the MA-FL agents.

Four (or more) sites built from different workload archetypes (scenario mix, provisioning level,
drift: `edgetwin.federation.agents.SITE_ARCHETYPES`, in the spirit of seed 000 Table 3) each train a
platform policy on their own emulated cluster. Compared, as in seed 000 §5.2 / Fig. 15:

- PFRL-DM: dual-critic PPO, only the public critic federated, multi-head attention aggregation
  (personalised critics, seed 000 eqs. 18-22, Algorithm 1); the actor stays local;
- FedAvg: PPO with actor and critic federated and averaged;
- FedAvgM (server momentum 0.9, server step 1 - β = 0.1): a momentum stand-in for MFPO;
- independent PPO: no federation.

Every federated method runs through the real agents (GCA + one ESA per site) on the in-process
bus, full participation, dense updates (the paper does not compress). Same network sizes, PPO
hyper-parameters, budget and seeds for every method.

What is measured. Every training episode of a site plays a freshly sampled population on the next
day, so the *training* return swings by ±1.5 from episode to episode for reasons that have nothing
to do with the policy (all methods see the same sequence of episodes, so their training curves
move together). The learning curve is therefore the return of the site's current policy
(deterministic actions) on a fixed set of held-out evaluation episodes (the same populations and
days at every round), measured each round on the model the site has just received, before it trains
on it (FedAvg: the global model; PFRL-DM and independent PPO: the site's own actor). Episodes to
95 %: per seed, site episodes until the 3-round trailing mean of the site-mean evaluation curve
first makes 95 % of the way from the common start (the mean starting value over methods) to the
best final value of any method (mean of its last 3 points); the same definition for every method.
Seed 000 gives no table for this: its claim (Fig. 15) is that PFRL-DM converges in fewer episodes
than FedAvg and independent PPO and that FedAvg ends lower.

``--env vm`` runs the same comparison on seed 000's own task-scheduling MDP
(`edgetwin.emulator.vm_scheduling`); there the evaluation scores the policy's sampled actions (seeded),
because its greedy policy repeats denied placements (`scheduler_evaluator`).

    python benchmarks/pfrl_dm.py                    # writes docs/benchmarks/mafl/README.md + PNG
    python benchmarks/pfrl_dm.py --quick --no-write
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import _docs
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from scipy import stats  # noqa: E402

from edgetwin.emulator.envs import EdgeClusterVecEnv  # noqa: E402
from edgetwin.emulator.logs import episode_seed  # noqa: E402
from edgetwin.emulator.vm_scheduling import VMSchedulingConfig, VMSchedulingEnv, vm_sites  # noqa: E402
from edgetwin.federation.aggregation import attention_weights  # noqa: E402
from edgetwin.federation.learners import PPOLearner, SchedulerLearner  # noqa: E402
from edgetwin.federation.runner import make_federation_config, run_federation, train_independent  # noqa: E402
from edgetwin.federation.sites import SiteSpec, heterogeneous_sites  # noqa: E402

SECTION = "## MA-FL: PFRL-DM personalised federated RL (seed 000)"
SECTION_VM = "## MA-FL: PFRL-DM on seed 000's own task-scheduling MDP"
ROOT = Path(__file__).resolve().parents[1]
DOC = _docs.page(SECTION)  # docs/benchmarks/<name>/README.md
OUT = ROOT / "docs" / "benchmarks" / "mafl"
#: Offset of the evaluation episodes' seeds from the site's training seed (held-out populations).
EVAL_SEED_OFFSET = 7919

PPO = {"kind": "ppo", "algo": "ppo", "federate": "policy", "net_arch": [32, 32]}
DUAL = {"kind": "ppo", "algo": "dual_critic_ppo", "federate": "public_critic", "net_arch": [32, 32]}
ATTENTION = {"name": "attention", "num_heads": 4, "d_model": 64, "temperature": 1.0}
PFRL = "PFRL-DM (dual-critic PPO, attention on the public critic)"
INDEP = "Independent PPO"
METHODS: dict[str, dict | None] = {
    PFRL: {"learner": DUAL, "strategy": ATTENTION},
    "FedAvg (PPO, actor + critic)": {"learner": PPO, "strategy": "fedavg"},
    "FedAvgM β=0.9 (MFPO stand-in)": {
        "learner": PPO,
        "strategy": {"name": "fedavgm", "momentum": 0.9, "server_lr": 0.1},
    },
    INDEP: None,
}
PAPER = {
    PFRL: "fastest; best final reward",
    "FedAvg (PPO, actor + critic)": "sub-optimal under heterogeneity",
    "FedAvgM β=0.9 (MFPO stand-in)": "improves steadily, below PFRL-DM",
    INDEP: "slower than PFRL-DM",
}


class EvaluatedLearner:
    """A learner that also scores its current policy on fixed held-out episodes of its site.

    ``train()`` first evaluates the policy the site holds (the model it has just received), then
    trains; the score goes out with the round's metrics as ``eval_reward``. Everything else is the
    wrapped learner's (the agents see an ordinary learner).

    Args:
        learner: the site's learner (`PPOLearner` or `SchedulerLearner`).
        evaluate: the score of the learner's current policy (the same episodes at every call).
    """

    def __init__(self, learner: Any, evaluate: Callable[[Any], float]) -> None:
        self.learner, self._evaluate = learner, evaluate
        self.evals: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.learner, name)

    def evaluate(self) -> float:
        """The score of the policy the site holds now."""
        return self._evaluate(self.learner)

    def train(self) -> dict[str, float]:
        score = self.evaluate()
        self.evals.append(score)
        return {**self.learner.train(), "eval_reward": score}


def cluster_evaluator(site: SiteSpec, n_eval: int) -> Callable[[PPOLearner], float]:
    """Mean return per service group (reward units summed over an episode's ticks) on ``n_eval``
    held-out episodes of the site's emulated cluster."""
    env = EdgeClusterVecEnv(site.cluster_config(), seed=site.seed)

    def evaluate(learner: PPOLearner) -> float:
        cluster, policy = env.cluster, learner.platform_policy()
        first_day = cluster.config.start_day + cluster.config.drift_days
        returns = []
        for j in range(n_eval):
            # The same populations and days every time: differences are the policy's.
            obs = cluster.reset(seed=episode_seed(site.seed + EVAL_SEED_OFFSET, j), day=first_day + j)
            total, done = np.zeros(cluster.n), False
            while not done:
                obs, reward, done, _ = cluster.step(policy.act(obs))
                total += reward
            returns.append(float(total.mean()))
        return float(np.mean(returns))

    return evaluate


def score_scheduler(config: VMSchedulingConfig, seed: int, n_eval: int, act: Callable[[np.ndarray, VMSchedulingEnv], int]) -> float:
    """Mean return of ``act(obs, env)`` on ``n_eval`` held-out episodes of a site's scheduling MDP
    (the same arrivals at every call)."""
    env = VMSchedulingEnv(config)
    returns = []
    for j in range(n_eval):
        obs, _ = env.reset(seed=episode_seed(seed + EVAL_SEED_OFFSET, j))
        total, done = 0.0, False
        while not done:
            obs, reward, terminated, truncated, _ = env.step(act(obs, env))
            total, done = total + reward, terminated or truncated
        returns.append(total)
    return float(np.mean(returns))


def scheduler_evaluator(
    config: VMSchedulingConfig, seed: int, n_eval: int, sampled: bool = True
) -> Callable[[SchedulerLearner], float]:
    """`score_scheduler` of a learner's current policy: its sampled actions (the policy it trains and
    acts with; the draws are seeded, the same at every call) or its most likely ones.

    Sampled is the default because the greedy policy of this MDP is degenerate: an argmax that names a
    VM the head task does not fit is denied, the state barely changes, and the same argmax repeats, so
    greedy returns sit near random's while the sampled policy's climb (seed 000 Fig. 15 plots the
    policy being trained).
    """

    def evaluate(learner: SchedulerLearner) -> float:
        with learner.sampling(seed + EVAL_SEED_OFFSET):
            return score_scheduler(config, seed, n_eval, lambda obs, _env: learner.act(obs, deterministic=not sampled))

    return evaluate


def heuristic_scores(vm: Sequence[VMSchedulingConfig], sites: Sequence[SiteSpec], n_eval: int) -> dict[str, list[float]]:
    """Baselines on the same held-out episodes as the learners: name -> score per site."""
    from edgetwin.emulator.vm_scheduling import first_fit, least_loaded

    rules: dict[str, Callable[[np.ndarray, VMSchedulingEnv], int]] = {
        "first fit": lambda _obs, env: first_fit(env),
        "least loaded": lambda _obs, env: least_loaded(env),
        # uniformly random, from the environment's own seeded stream (the same draws every call)
        "random": lambda _obs, env: int(env.np_random.integers(env.action_space.n)),
    }
    return {name: [score_scheduler(c, s.seed, n_eval, rule) for c, s in zip(vm, sites, strict=True)] for name, rule in rules.items()}


def make_learners(
    spec: dict, sites: Sequence[SiteSpec], n_eval: int, vm: Sequence[VMSchedulingConfig] | None = None, sampled: bool = True
) -> list[EvaluatedLearner]:
    kwargs = {k: v for k, v in spec.items() if k != "kind"}
    kwargs["net_arch"] = tuple(kwargs["net_arch"])
    if vm is None:
        return [EvaluatedLearner(PPOLearner(s, **kwargs), cluster_evaluator(s, n_eval)) for s in sites]
    return [
        EvaluatedLearner(SchedulerLearner(c, seed=s.seed, **kwargs), scheduler_evaluator(c, s.seed, n_eval, sampled))
        for s, c in zip(sites, vm, strict=True)
    ]


def smooth(x: np.ndarray, k: int = 3) -> np.ndarray:
    """Trailing moving average over ``k`` rounds (the first values average what there is)."""
    c = np.cumsum(np.insert(np.asarray(x, np.float64), 0, 0.0))
    i = np.arange(len(x))
    lo = np.maximum(0, i - k + 1)
    return (c[i + 1] - c[lo]) / (i + 1 - lo)


def run_method(
    spec: dict | None,
    sites: Sequence[SiteSpec],
    rounds: int,
    episodes: int,
    seed: int,
    n_eval: int,
    ppo: dict | None = None,
    vm: Sequence[VMSchedulingConfig] | None = None,
    sampled: bool = True,
) -> dict:
    """One run: per-site evaluation and training curves, (sites, rounds) each, and what it cost.

    ``eval[:, r]`` scores the policy after ``r`` rounds (``r · episodes`` site episodes of training);
    ``train[:, r]`` is the mean training return of round ``r``'s episodes. ``ppo``: PPO
    hyper-parameters of the learners (``learning_rate``, ``n_epochs``), the same for every method.
    ``sampled``: ``vm`` learners are scored on sampled actions (else their most likely ones).
    """
    t0 = time.perf_counter()
    learner = {**(spec["learner"] if spec else {**PPO, "federate": "none"}), "episodes_per_round": episodes, "model_seed": seed, **(ppo or {})}
    learners = make_learners(learner, sites, n_eval, vm, sampled)
    if spec is None:
        hist = train_independent(sites, learner, rounds, progress=True, learners=learners)
        recs = {s.name: hist[s.name] for s in sites}
        uplink = 0.0
    else:
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
        res = run_federation(cfg, bus="memory", progress=True, learners=learners)
        assert all(r["reason"] == "complete" for r in res.rounds), [r["reason"] for r in res.rounds]
        recs = {s.name: sorted(res.sites[s.name], key=lambda r: r["round"]) for s in sites}
        uplink = float(np.mean([row.get("site", 0) for row in res.bytes_per_round]))
    out: dict[str, Any] = {
        "eval": np.array([[m["eval_reward"] for m in recs[s.name]] for s in sites]),
        "train": np.array([[m["reward"] for m in recs[s.name]] for s in sites]),
        "uplink": uplink,
        "seconds": time.perf_counter() - t0,
    }
    if spec is not None and spec["learner"]["federate"] == "public_critic":
        out["alpha"] = float(np.mean([m["alpha"] for s in sites for m in recs[s.name]]))
        # How much each site attends to itself over its final public critics: with the attention's
        # scaling (temperature 1) and with the former LayerNorm scaling (logits sqrt(d_k) = 4x larger).
        theta = np.stack([ln.get_params() for ln in learners])
        d_k = ATTENTION["d_model"] // ATTENTION["num_heads"]
        kw = {"num_heads": ATTENTION["num_heads"], "d_model": ATTENTION["d_model"], "seed": seed}
        out["self_attention"] = float(np.diag(attention_weights(theta, temperature=ATTENTION["temperature"], **kw)).mean())
        out["self_attention_layernorm"] = float(np.diag(attention_weights(theta, temperature=1.0 / np.sqrt(d_k), **kw)).mean())
    return out


def episodes_to(curve: np.ndarray, start: float, target: float, episodes: int) -> int | None:
    """Site episodes until the smoothed ``curve`` first reaches ``start + 0.95 (target - start)``.

    ``curve[r]`` is measured after ``r`` rounds of ``episodes`` site episodes each.
    """
    if target <= start:
        return None
    hit = np.flatnonzero(smooth(curve) >= start + 0.95 * (target - start))
    return None if hit.size == 0 else int(hit[0] * episodes)


def mean_ci(x: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Mean and the half-width of its Student-t confidence interval."""
    a = np.asarray(x, np.float64)
    if a.size < 2:
        return float(a.mean()), float("nan")
    return float(a.mean()), float(stats.t.ppf(0.5 + level / 2, a.size - 1) * a.std(ddof=1) / np.sqrt(a.size))


def summarise(results: dict[str, list[dict]], episodes: int, rounds: int) -> tuple[list[dict], list[dict]]:
    """Per-method rows and per-seed thresholds (start, best final) of the evaluation curves."""
    n_seeds = len(next(iter(results.values())))
    censored = rounds * episodes  # 'never' counts as the whole budget (a lower bound)
    thresholds, rows = [], []
    for i in range(n_seeds):
        curves = {n: runs[i]["eval"].mean(axis=0) for n, runs in results.items()}
        start = float(np.mean([c[0] for c in curves.values()]))
        best = float(max(c[-3:].mean() for c in curves.values()))
        thresholds.append({"start": start, "best": best})
    for name, runs in results.items():
        final = [float(r["eval"].mean(axis=0)[-3:].mean()) for r in runs]
        gain = [f - th["start"] for f, th in zip(final, thresholds, strict=True)]
        reach = [episodes_to(r["eval"].mean(axis=0), th["start"], th["best"], episodes) for r, th in zip(runs, thresholds, strict=True)]
        # Paired with PFRL-DM on the same seed (same sites, same episodes): the difference is the method's.
        pf = [float(r["eval"].mean(axis=0)[-3:].mean()) for r in results[PFRL]]
        # A second speed measure: episodes until independent PPO's final value (same seed) is matched.
        ind = [float(r["eval"].mean(axis=0)[-3:].mean()) for r in results[INDEP]]
        match = [episodes_to(r["eval"].mean(axis=0), th["start"], th["start"] + (i - th["start"]) / 0.95, episodes)
                 for r, th, i in zip(runs, thresholds, ind, strict=True)]
        rows.append(
            {
                "method": name,
                "final": final,
                "gain": gain,
                "delta_vs_pfrl": [f - p for f, p in zip(final, pf, strict=True)],
                "reach": reach,
                "reach_filled": [censored if x is None else x for x in reach],
                "match_indep": match,
                "match_indep_filled": [censored if x is None else x for x in match],
                "train_final": [float(r["train"].mean(axis=0)[-5:].mean()) for r in runs],
                "uplink": float(np.mean([r["uplink"] for r in runs])),
                "seconds": float(np.mean([r["seconds"] for r in runs])),
                "alpha": [r["alpha"] for r in runs if "alpha" in r],
                "self_attention": [r["self_attention"] for r in runs if "self_attention" in r],
                "self_attention_layernorm": [r["self_attention_layernorm"] for r in runs if "self_attention" in r],
            }
        )
    return rows, thresholds


def figure(results: dict, episodes: int, path: Path, n_sites: int, unit: str = "per service group") -> None:
    """Evaluation and training curves; the band is a 95 % interval over seeds, or their range below 3 seeds
    (a t-interval from 2 seeds is 12.7 standard errors wide and says nothing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    n_runs = len(next(iter(results.values())))
    band = "95 % CI" if n_runs >= 3 else "range"
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.2))
    for name, runs in results.items():
        for ax, key in zip(axes, ("eval", "train"), strict=True):
            # relative to the seed's common start, so that seeds with easier sites do not dominate
            m = np.stack([r[key].mean(axis=0) - r["eval"].mean(axis=0)[0] for r in runs])
            x = np.arange(m.shape[1]) * episodes + (episodes if key == "train" else 0)
            mu = m.mean(axis=0)
            if n_runs >= 3:
                half = np.array([mean_ci(col)[1] for col in m.T])
                lo, hi = mu - half, mu + half
            else:
                lo, hi = m.min(axis=0), m.max(axis=0)
            ax.plot(x, mu, label=name.split(" (")[0])
            ax.fill_between(x, lo, hi, alpha=0.15)
    axes[0].set_title(f"{n_sites} sites: held-out evaluation return (mean, {band} over seeds)", fontsize=9)
    axes[1].set_title("training return of each round's episodes (new episode every time)", fontsize=9)
    for ax in axes:
        ax.set_xlabel("site episodes of training")
        ax.set_ylabel(f"return {unit} − seed's start")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


#: seed 003's cost-cap mode on the emulated cluster's columns (``--objectives mixed``)
COST_CAP = {"kpi.utilisation": 1.0, "kpi.slo_violation": -0.5}

#: hand-written subsections (the verdict, extra runs) that a rerun keeps
KEEP_SUBSECTIONS = (
    "### Verdict of the run above",
    "### Sites from different real traces",
    "### Sites with conflicting objectives",
    "### Verdict on seed 000's MDP",
)


def write_section(text: str, doc: Path = DOC, section: str = SECTION) -> None:
    """Replace this script's section of docs/benchmarks/mafl/README.md (or append it), keeping `KEEP_SUBSECTIONS`."""
    _docs.write_section(section, text, doc, keep=KEEP_SUBSECTIONS)


#: ``--methods`` keys
METHOD_KEYS = dict(zip(("pfrl", "fedavg", "fedavgm", "indep"), METHODS, strict=True))


def chosen_methods(args: argparse.Namespace) -> list[str]:
    """The methods to run, in `METHODS` order (PFRL-DM and independent PPO always: the measures need them)."""
    keys = set(args.methods) | {"pfrl", "indep"}
    return [name for key, name in METHOD_KEYS.items() if key in keys]


def run_seed(args: argparse.Namespace, seed: int) -> dict[str, dict]:
    """Every method on one seed's sites: method -> `run_method`'s result (and, for ``--env vm``,
    ``"heuristics"`` -> `heuristic_scores`)."""
    torch.set_num_threads(1)
    vm = None
    if args.env == "vm":
        vm = vm_sites(args.sites, seed=seed, traces=args.traces, decisions=args.decisions)
        rng = np.random.default_rng(seed)
        sites = [SiteSpec(name=c.name, seed=int(rng.integers(0, 2**31 - 1))) for c in vm]
    else:
        sites = heterogeneous_sites(args.sites, seed=seed, n_agents=8, steps=24, traces=args.traces)
    if args.objectives == "mixed":
        sites = [dataclasses.replace(s, reward_weights=dict(COST_CAP)) if i % 2 else s for i, s in enumerate(sites)]
    out = {}
    for name in chosen_methods(args):
        spec = METHODS[name]
        print(f"seed {seed}: {name}", flush=True)
        ppo: dict[str, Any] = {"learning_rate": args.lr, "n_epochs": args.epochs}
        if vm is not None:
            ppo["net_arch"] = [64]  # seed 000 §3.1: one hidden layer of 64
        out[name] = run_method(
            spec, sites, args.rounds, args.episodes, seed, args.eval_episodes, ppo, vm, args.eval_actions == "sampled"
        )
    if vm is not None:
        out["heuristics"] = heuristic_scores(vm, sites, args.eval_episodes)
    return out


def _pm(x: Sequence[float], fmt: str = "{:.2f}") -> str:
    m, h = mean_ci(x)
    return fmt.format(m) + ("" if not np.isfinite(h) else " ± " + fmt.format(h))


def _shared_relative(path: str) -> str:
    """``path`` as typed from the repository root when it lies under ``../shared`` (commands in docs)."""
    p = Path(path).resolve()
    shared = (ROOT.parent / "shared").resolve()
    return f"../shared/{p.relative_to(shared).as_posix()}" if p.is_relative_to(shared) else str(path)


def describe_cluster(args: argparse.Namespace, budget: int) -> list[str]:
    """The setup and measurement paragraphs of the emulated-cluster run."""
    ep = args.episodes
    return [
            f"{args.sites} heterogeneous sites (scenario mix, provisioning level and drift differ: "
            "`SITE_ARCHETYPES`"
            + ("" if not args.traces else "; task shapes and arrivals from a different real trace per site, round-robin: "
               + ", ".join(Path(t).name for t in args.traces))
            + ")"
            + ("" if args.objectives == "offload" else
               "; every second site is run for cost (reward = utilisation of reserved edge capacity − 0.5 × SLO "
               "violations, seed 003's cost-cap mode) instead of offload, so the sites' best actions conflict")
            + ", each an emulated cluster of 8 service groups × 24 ticks; "
            f"{ep} site episodes of local PPO per round, {args.rounds} rounds ({budget} site episodes), "
            f"{args.seeds} seeds (sites, weights and episodes differ per seed; within a seed every method gets the "
            "same sites, initial weights and training episodes). Same for every method: γ 0.985, GAE λ 0.95, clip 0.2, "
            f"entropy 0.01 (seed 003 §5.3), lr {args.lr:g}, {args.epochs} epochs per rollout, minibatch 64, MLP 32×32 for actor and each critic. "
            "Federated methods run through the GCA and one ESA per site on the in-process bus, every site every "
            "round, dense updates. PFRL-DM federates only the public critic (seed 000: 'only the transmission costs "
            "of the public critic networks'); its actor and local critic stay on the site. Attention: 4 heads, "
            "d_model 64, temperature 1 (a head's logit = cosine similarity of the clients' centred, projected "
            "critics).",
            "",
            "**Reward curve = held-out evaluation.** A site's training return is dominated by which population and "
            "day each episode happens to play (±1.5 between consecutive episodes, the same sequence for every method), "
            f"so each round the policy the site holds is scored (deterministic actions) on {args.eval_episodes} fixed "
            "held-out episodes of its own cluster (return per service group: the cluster's reward, `REWARD_WEIGHTS`, "
            "summed over 24 ticks), the same episodes every round. 'Episodes to 95 %': per seed, site episodes until "
            "the 3-round trailing mean of the site-mean evaluation curve first makes 95 % of the way from the common "
            "start to the best final value (mean of the last 3 points) of any method; the same rule for every method; "
            f"'never' counts as {budget} in the mean (a lower bound). The curves are still rising at {budget} episodes, so "
            "this mostly ranks the final values; 'episodes to independent PPO's final' (the same smoothing; the "
            "episodes a method needs to match what independent PPO reaches with the whole budget, same seed) is the "
            "direct measure of 'fewer episodes than independent PPO'. ± = 95 % Student-t interval over seeds; Δ is "
            "paired with PFRL-DM on the same seed.",
    ]


def describe_vm(args: argparse.Namespace, budget: int, heuristics: dict[str, list[float]]) -> list[str]:
    """The setup and measurement paragraphs of the run on seed 000's task-scheduling MDP."""
    return [
        f"{args.sites} sites of seed 000's own MDP (`edgetwin.emulator.vm_scheduling`: tasks wait in a queue and the "
        "scheduler puts the head task on one of up to L VMs or waits; state = remaining capacity per VM, progress "
        "per vCPU, the first 5 queued requests; reward eqs. 3-9, ρ 0.5; one decision per time step). Site i has "
        "seed 000 Table 3's machines of client i and its own workload "
        + ("(a different real trace per site, round-robin: " + ", ".join(Path(t).name for t in args.traces) + ")"
           if args.traces else "(built-in archetypes: web, batch, hpc, vm: different requests and run times)")
        + f", offered load 0.85 of its vCPUs. {args.decisions} decisions per episode, {args.episodes} site "
        f"episodes of local PPO per round (seed 000 federates every 25 of 500), {args.rounds} rounds "
        f"({budget} site episodes), {args.seeds} seeds. Same for every method: γ 0.99, GAE λ 0.95, clip 0.2, "
        f"entropy 0.01, lr {args.lr:g}, {args.epochs} epochs per rollout, minibatch 64, one hidden layer of 64 for "
        "the actor and each critic (seed 000 §3.1), reward normalised per site. Federated methods run through "
        "the GCA and one ESA per site on the in-process bus, every site every round, dense updates; PFRL-DM "
        "federates only the public critic. The action indexes VM slots, and slot k is a different machine (or "
        "none) at every site, so an averaged actor mixes incompatible policies: the heterogeneity seed 000 says "
        "FedAvg suffers from.",
        "",
        "**Reward curve = held-out evaluation**: each round, the policy the site holds "
        + ("(its sampled actions, seeded: the same draws every round; the greedy policy of this MDP repeats denied "
           "placements) " if args.eval_actions == "sampled" else "(its most likely actions) ")
        + f"on {args.eval_episodes} fixed held-out episodes of its own system (same arrivals every round). For "
        "scale, heuristics on the same episodes (return per site episode, mean over sites; ± over seeds): "
        + ", ".join(f"{k} {_pm(v, '{:.1f}')}" for k, v in heuristics.items())
        + ". 'Episodes to 95 %' and 'episodes to independent PPO's final' are defined as in the emulated-cluster "
        "section above.",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sites", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--episodes", type=int, default=2, help="site episodes of local training per round")
    parser.add_argument("--seeds", type=int, default=6)
    parser.add_argument("--eval-episodes", type=int, default=4, help="held-out evaluation episodes per site")
    parser.add_argument("--lr", type=float, default=1e-3, help="PPO learning rate (every method)")
    parser.add_argument("--epochs", type=int, default=10, help="PPO epochs per rollout (every method)")
    parser.add_argument("--quick", action="store_true", help="tiny run (a smoke test of the script)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks/mafl/README.md alone")
    parser.add_argument(
        "--traces", nargs="+", default=None, metavar="PATH",
        help="real traces (any format of edgetwin.emulator.traces) for task shapes and arrivals, one per site round-robin "
        "(seed 000 Table 3 builds its clients from different traces); default: the built-in distributions",
    )
    parser.add_argument(
        "--objectives", choices=("offload", "mixed"), default="offload",
        help="offload: every site maximises the cluster's reward (REWARD_WEIGHTS, the operator's multi-objective, "
        "offload among its terms); mixed: every second site is "
        "run for cost instead (seed 003's cost-cap mode: utilisation of reserved capacity − 0.5 SLO "
        "violations), so the sites' best actions conflict",
    )
    parser.add_argument(
        "--env", choices=("cluster", "vm"), default="cluster",
        help="cluster: every site is an emulated edge cluster of service groups; vm: seed 000's own "
        "task-scheduling MDP (tasks queued onto VMs, its Table 3 fleets, one workload per site)",
    )
    parser.add_argument("--decisions", type=int, default=256, help="--env vm: scheduling decisions per episode")
    parser.add_argument("--jobs", type=int, default=1, help="seeds run in parallel processes")
    parser.add_argument(
        "--eval-actions", choices=("sampled", "greedy"), default="sampled",
        help="--env vm: score the policy's sampled actions (seeded; default) or its most likely ones",
    )
    parser.add_argument(
        "--methods", nargs="+", choices=tuple(METHOD_KEYS), default=list(METHOD_KEYS),
        help="methods to run (PFRL-DM and independent PPO always run)",
    )
    args = parser.parse_args()
    if args.env == "vm" and args.objectives != "offload":
        parser.error("--objectives applies to --env cluster only")
    for t in args.traces or []:
        if not Path(t).is_file():
            parser.error(f"--traces: {t} is not a file")
    torch.set_num_threads(1)
    if args.quick:
        args.rounds, args.seeds, args.eval_episodes = 3, 1, 1
    results: dict[str, list[dict]] = {name: [] for name in chosen_methods(args)}
    if args.jobs > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(args.jobs) as pool:
            per_seed = list(pool.map(run_seed, [args] * args.seeds, range(args.seeds)))
    else:
        per_seed = [run_seed(args, seed) for seed in range(args.seeds)]
    for res in per_seed:
        for name in results:
            results[name].append(res[name])
    heuristics = {k: [float(np.mean(r["heuristics"][k])) for r in per_seed] for k in per_seed[0].get("heuristics", {})}
    ep = args.episodes
    rows, thresholds = summarise(results, ep, args.rounds)
    # --no-write leaves the committed figure and JSON alone too
    out = Path(tempfile.gettempdir()) / "edgetwin-pfrl_dm" if args.no_write else OUT
    out.mkdir(parents=True, exist_ok=True)
    stem = "pfrl_dm" if args.env == "cluster" else "pfrl_dm_vm"
    png = out / f"{stem}_rewards.png"
    figure(results, ep, png, args.sites, "per service group" if args.env == "cluster" else "per site episode")

    def fmt_reach(xs: list[int | None]) -> str:
        return ", ".join("never" if x is None else str(x) for x in xs)

    cmd = (
        "python benchmarks/pfrl_dm.py"
        + (" --quick" if args.quick else "")
        + f" --sites {args.sites} --rounds {args.rounds} --episodes {args.episodes} --seeds {args.seeds}"
        + f" --eval-episodes {args.eval_episodes} --lr {args.lr:g} --epochs {args.epochs}"
        + ("" if not args.traces else " --traces " + " ".join(_shared_relative(t) for t in args.traces))
        + ("" if args.objectives == "offload" else f" --objectives {args.objectives}")
        + ("" if args.env == "cluster" else f" --env vm --decisions {args.decisions}")
        + ("" if args.env == "cluster" or args.eval_actions == "sampled" else " --eval-actions greedy")
        + ("" if args.jobs == 1 else f" --jobs {args.jobs}")
        + ("" if set(args.methods) == set(METHOD_KEYS) else " --methods " + " ".join(args.methods))
    )
    machine = f"{os.cpu_count()} CPU cores, {platform.machine()}, Python {platform.python_version()}, torch {torch.__version__}, CPU only, cores shared with other jobs"
    budget = args.rounds * ep
    pf = next(r for r in rows if r["method"] == PFRL)
    lines = [
        SECTION if args.env == "cluster" else SECTION_VM,
        "",
        f"Command: `{cmd}`. Machine: {machine}.",
        "",
        *(describe_cluster(args, budget) if args.env == "cluster" else describe_vm(args, budget, heuristics)),
        "",
        "| method | final eval return | gain over start | Δ final vs PFRL-DM (paired) | episodes to 95 % of best final | reached (seeds) | per seed | episodes to independent PPO's final (reached) | training return (last 5 rounds) | uplink / round | wall s / run | paper (seed 000 Fig. 15) |",
        "|---|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        reached = sum(x is not None for x in r["reach"])
        delta = "—" if r["method"] == PFRL else _pm(r["delta_vs_pfrl"], "{:+.3f}")
        lines.append(
            f"| {r['method']} | {_pm(r['final'])} | {_pm(r['gain'], '{:.3f}')} | {delta} | "
            f"{_pm(r['reach_filled'], '{:.1f}')} | {reached}/{len(r['reach'])} | {fmt_reach(r['reach'])} | "
            f"{_pm(r['match_indep_filled'], '{:.1f}')} ({sum(x is not None for x in r['match_indep'])}/{len(r['match_indep'])}) | "
            f"{_pm(r['train_final'])} | {r['uplink'] / 1024:.1f} KiB | {r['seconds']:.0f} | {PAPER[r['method']]} |"
        )
    lines += [
        "",
        f"PFRL-DM diagnostics: mean α (eq. 15, weight of the local critic) {np.mean(pf['alpha']):.3f}; "
        f"mean self-attention over the final public critics {np.mean(pf['self_attention']):.2f} at temperature 1 "
        f"versus {np.mean(pf['self_attention_layernorm']):.2f} with the former LayerNorm-norm scaling (logits "
        "4× larger), which made every personalised critic ~its own (no federation).",
        "",
        f"![reward curves]({(OUT / png.name).relative_to(ROOT / 'docs').as_posix()})",
        "",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    dump = {"rows": rows, "thresholds": thresholds, "command": cmd, "heuristics": heuristics,
            "curves": {n: [{"eval": r["eval"].tolist(), "train": r["train"].tolist()} for r in runs] for n, runs in results.items()}}
    (out / f"{stem}.json").write_text(json.dumps(dump, indent=1))
    print(f"wrote {png} and {out / f'{stem}.json'}")
    if not args.no_write:
        write_section(text, section=SECTION if args.env == "cluster" else SECTION_VM)
        print(f"wrote {DOC}")


if __name__ == "__main__":
    main()
