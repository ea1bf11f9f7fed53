"""Twin fidelity (MAIL-MMSG): how well a twin learned from logs stands in for the real system.

The "real system" is edgetwin's emulated edge-cloud cluster (`edgetwin.emulator.cluster`), logged
under a uniformly random platform policy (as in seed 004 §4.1; `--logging regimes` logs under
`RegimePolicy` instead, a scheduler whose configuration changes every 2 hours). Measured:

1. distribution match of twin rollouts vs held-out real logs under the logging policy: per-feature
   KL of responses/KPIs and the offload ratio over 12 time slices of a day (seed 004 Fig. 4);
2. compounding error vs horizon when replaying the logged actions open loop, MAIL-MMSG twin vs the
   behaviour-cloned client (MAIL's pre-training) vs a supervised one-step model; growth exponents;
3. policy-ranking fidelity: 12 platform policies evaluated in the twin and on the cluster (Spearman
   rho, relative return error, regret), beside fitted-Q evaluation (FQE) on the same logs. The twin
   is scored twice: from populations it generates (GAN-SMMSG, learned from the training days) and
   replaying the evaluation days' own logged populations and first states (`logged_rollout`, the
   what-if "replay last week's traffic" mode), which leaves only the twin's dynamics as error;
4. throughput: agent-steps/s of the twin and of the cluster at 1,000 and 10,000 agents.

Run (2 CPU cores, ~30 min):  python benchmarks/twin_fidelity.py
Writes the `## Twin fidelity (MAIL-MMSG)` section of docs/benchmarks/twin_fidelity/README.md and PNGs under
docs/benchmarks/twin_fidelity/. `--quick` runs part 3 only, small (1 member, 3 training days, no FQE;
a few minutes), to measure a change; `--write-quick` also writes it as a subsection.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from _scale_args import add_scale_args, scale_kwargs
from scipy.stats import spearmanr
from sklearn.ensemble import HistGradientBoostingRegressor
from stable_baselines3 import PPO

from edgetwin.contract.policy import FunctionPolicy, NoisyPolicy, PlatformPolicy, RandomPolicy, RegimePolicy
from edgetwin.emulator.cluster import ClusterConfig, EdgeCluster, cluster_spec
from edgetwin.emulator.logs import SLOAwarePolicy, generate_logs
from edgetwin.policies.train import quiet_logger
from edgetwin.twin.fidelity import (
    fidelity_report,
    growth_exponent,
    logged_rollout,
    one_step_outputs,
    replay_errors,
)
from edgetwin.twin.twin import Twin

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "benchmarks" / "twin_fidelity" / "README.md"  # _docs.PAGES
FIG = ROOT / "docs" / "benchmarks" / "twin_fidelity"
SECTION = "## Twin fidelity (MAIL-MMSG)"


# ------------------------------------------------------------------------------------ policies
class SB3Policy:
    def __init__(self, model: PPO) -> None:
        self.model = model

    def act(self, obs: np.ndarray) -> np.ndarray:
        return self.model.predict(obs.astype(np.float32), deterministic=True)[0]


def constant(edge: float, cap: float, price: float) -> FunctionPolicy:
    return FunctionPolicy(lambda o: np.tile([edge, cap, price], (len(o), 1)), name=f"const({edge},{cap},{price})")


# ------------------------------------------------------------------------------------ FQE
def fqe(log: pd.DataFrame, spec, policy, gamma: float = 0.9, iters: int = 10, max_rows: int = 40_000, seed: int = 0) -> float:  # type: ignore[no-untyped-def]
    """Fitted-Q evaluation (Le et al. 2019) with gradient-boosted trees (sklearn; d3rlpy is not
    installed). Returns ``(1-γ)·mean_s Q(s, π(s))`` over logged states, comparable to a mean
    per-step reward."""
    obs_cols, act_cols = spec.observation_columns, spec.action_columns
    df = log.sort_values(["episode", "agent", "t"]).reset_index(drop=True)
    nxt = df.groupby(["episode", "agent"])[obs_cols].shift(-1)
    has_next = nxt.notna().all(axis=1).to_numpy()
    rng = np.random.default_rng(seed)
    idx = rng.choice(len(df), size=min(max_rows, len(df)), replace=False)
    s = df.loc[idx, obs_cols].to_numpy()
    a = df.loc[idx, act_cols].to_numpy()
    r = df.loc[idx, "reward"].to_numpy()
    s2 = nxt.iloc[idx].to_numpy()
    hn = has_next[idx]
    a2 = np.zeros_like(a)
    a2[hn] = policy.act(s2[hn])
    api = policy.act(s)
    q = None
    for _ in range(iters):
        target = r.copy()
        if q is not None:
            target[hn] += gamma * q.predict(np.concatenate([s2[hn], a2[hn]], 1))
        q = HistGradientBoostingRegressor(max_iter=100, random_state=seed).fit(np.concatenate([s, a], 1), target)
    assert q is not None
    return float((1 - gamma) * q.predict(np.concatenate([s, api], 1)).mean())


class _PolicyForFQE:
    """The evaluated policy as d3rlpy's FQE reads it: ``algo.impl.predict_best_action(obs)``.

    d3rlpy evaluates its own algorithms; any `PlatformPolicy` (a heuristic, a constant, an SB3
    network) enters through this one method, on raw observations (FQE scales its own inputs).
    """

    def __init__(self, policy: PlatformPolicy) -> None:
        self.policy = policy
        self.impl = self

    def predict_best_action(self, x: torch.Tensor) -> torch.Tensor:
        act = np.asarray(self.policy.act(x.detach().cpu().numpy()), dtype=np.float32)
        return torch.as_tensor(act.reshape(len(x), -1), device=x.device)


def fqe_d3rlpy(log: pd.DataFrame, spec, policy, gamma: float = 0.9, n_steps: int = 5000, seed: int = 0) -> float:  # type: ignore[no-untyped-def]
    """Fitted-Q evaluation with d3rlpy's `FQE` (Le et al. 2019): per-agent transitions of the log,
    standardised observations, min-max scaled actions, a (256, 256) Q-network, ``n_steps`` batches
    of 256. Returns ``(1-γ)·mean_s Q(s, π(s))`` over logged states, comparable to a mean per-step
    reward (``pip install -e ".[bench]"``)."""
    import d3rlpy

    obs_cols, act_cols = spec.observation_columns, spec.action_columns
    df = log.sort_values(["episode", "agent", "t"]).reset_index(drop=True)
    last = (df.groupby(["episode", "agent"])["t"].shift(-1).isna()).to_numpy()
    obs = df[obs_cols].to_numpy(np.float32)
    data = d3rlpy.dataset.MDPDataset(
        observations=obs, actions=df[act_cols].to_numpy(np.float32), rewards=df["reward"].to_numpy(np.float32),
        terminals=np.zeros(len(df), np.float32), timeouts=last.astype(np.float32),
    )
    d3rlpy.seed(seed)
    low, high = spec.bounds("action")
    config = d3rlpy.ope.FQEConfig(
        gamma=gamma, batch_size=256, learning_rate=3e-4, target_update_interval=100,
        observation_scaler=d3rlpy.preprocessing.StandardObservationScaler(),
        action_scaler=d3rlpy.preprocessing.MinMaxActionScaler(minimum=low.astype(np.float32), maximum=high.astype(np.float32)),
    )
    fqe = d3rlpy.ope.FQE(algo=_PolicyForFQE(policy), config=config, device="cpu:0")  # type: ignore[arg-type]
    fqe.fit(data, n_steps=n_steps, n_steps_per_epoch=n_steps, show_progress=False, save_interval=10**9,
            logger_adapter=d3rlpy.logging.NoopAdapterFactory())
    rng = np.random.default_rng(seed)
    s = obs[rng.choice(len(obs), size=min(20_000, len(obs)), replace=False)]
    return float((1 - gamma) * fqe.predict_value(s, np.asarray(policy.act(s), np.float32)).mean())


# ------------------------------------------------------------------------------------ throughput
def throughput(twin: Twin, spec, n: int, ticks: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    pol = RandomPolicy(spec, 0)
    sim = twin.simulation(n_agents=n, seed=0)
    obs = sim.obs()
    t0 = time.perf_counter()
    for _ in range(ticks):
        sim.step(pol.act(obs), with_disagreement=False)
        obs = sim.obs()
    twin_rate = n * ticks / (time.perf_counter() - t0)
    cl = EdgeCluster(ClusterConfig(n_agents=n, steps=ticks + 1))
    obs = cl.reset(seed=0)
    t0 = time.perf_counter()
    for _ in range(ticks):
        obs, _, _, _ = cl.step(pol.act(obs))
    return twin_rate, n * ticks / (time.perf_counter() - t0)



# ------------------------------------------------------------------------------------ ranking
def ranking_policies(spec, twin: Twin) -> dict:  # type: ignore[no-untyped-def]
    """The platform policies whose ranking the twin must reproduce (PPO is added separately)."""
    return {
        "random": RandomPolicy(spec, 1),
        "heuristic (SLO-aware)": SLOAwarePolicy(spec),
        "heuristic + noise 0.1": NoisyPolicy(SLOAwarePolicy(spec), spec, 0.1, 2),
        "heuristic + noise 0.3": NoisyPolicy(SLOAwarePolicy(spec), spec, 0.3, 3),
        "all edge, cap 1, price .5": constant(1.0, 1.0, 0.5),
        "all cloud, cap 1, price .5": constant(0.0, 1.0, 0.5),
        "half, cap 2, price .2": constant(0.5, 2.0, 0.2),
        "half, cap .3, price .9": constant(0.5, 0.3, 0.9),
        "edge, cap 1.5, price .1": constant(1.0, 1.5, 0.1),
        "half, cap 1, price 1": constant(0.5, 1.0, 1.0),
        "cloned logging policy": twin.logging_policy(seed=4),
    }


def ppo_in_twin(twin: Twin, n_agents: int, steps: int, seed: int, timesteps: int) -> SB3Policy:
    venv = twin.make_vec_env(n_agents=n_agents, steps=steps, seed=seed, disagreement_penalty=0.5)
    ppo = PPO("MlpPolicy", venv, n_steps=steps, batch_size=min(2400, n_agents * steps), n_epochs=5,
              gamma=0.95, seed=seed, device="cpu", verbose=0)
    ppo.set_logger(quiet_logger())
    ppo.learn(timesteps)
    return SB3Policy(ppo)


def _scores(real: np.ndarray, est: np.ndarray) -> dict[str, float]:
    """The off-policy-evaluation yardsticks of one evaluator (DOPE's protocol, Fu et al. 2021).

    ``norm_abs_error`` and ``regret_at_1`` are normalised by the span of the real values, so they
    compare across systems whose returns have different scales.
    """
    span = max(float(real.max() - real.min()), 1e-12)
    pick = int(np.argmax(est))
    rho = float(spearmanr(real, est).statistic) if len(np.unique(est)) > 1 and len(np.unique(real)) > 1 else 0.0
    return {
        "spearman": rho,
        "rel_err": float((np.abs(est - real) / np.maximum(np.abs(real), 1e-6)).mean()),
        "norm_abs_error": float(np.abs(est - real).mean() / span),
        "regret": float(real.max() - real[pick]),
        "regret_at_1": float((real.max() - real[pick]) / span),
    }


def ranking_scores(rank: pd.DataFrame, col: str, n_boot: int = 1000, seed: int = 0) -> dict:  # type: ignore[type-arg]
    """Spearman rho, mean relative error, normalised absolute error and regret@1 (each with a 90 %
    bootstrap interval over the policies), and the pick of one evaluator column against ``real``."""
    real, est = rank["real"].to_numpy(np.float64), rank[col].to_numpy(np.float64)
    out: dict = _scores(real, est)  # type: ignore[type-arg]
    rng = np.random.default_rng(seed)
    boots = [_scores(real[i], est[i]) for i in (rng.integers(len(real), size=len(real)) for _ in range(n_boot))]
    for k in ("spearman", "rel_err", "norm_abs_error", "regret_at_1"):
        vals = np.array([b[k] for b in boots])
        out[f"{k}_ci90"] = [float(np.quantile(vals, 0.05)), float(np.quantile(vals, 0.95))]
    out["mean_rel_error"] = out["rel_err"]
    out["pick"] = rank.loc[rank[col].idxmax(), "policy"]
    return out


QUICK_SECTION = "### Quick ranking check"
#: the MAIL twin of a spec that declares nothing (every state column learned; issue 19's "before")
UNDECLARED_COL = "MAIL twin, nothing declared"
#: the twin started from the evaluation days' own logged populations and first states
REPLAY_COL = "twin, replaying the evaluation days' populations"
#: the twin teacher forced on the evaluation days' logged states and actions (no compounding)
ONE_STEP_COL = "twin, one step (teacher forced)"
#: the evaluators of the full run's ranking, scored against the cluster
EVALUATORS = ("twin", REPLAY_COL, UNDECLARED_COL, "supervised twin", "fqe", "fqe (trees)")


def day_se(df: pd.DataFrame) -> float:
    """Standard error of a policy's mean reward over its days (episodes): the real value's own noise."""
    per_day = df.groupby("episode")["reward"].mean()
    return float(per_day.std(ddof=1) / np.sqrt(len(per_day))) if len(per_day) > 1 else float("nan")


def noise_floor(rank: pd.DataFrame) -> float:
    """Mean relative error a perfect generated-population twin would still show (see `noise_floor_text`)."""
    se = rank["real_se"].to_numpy(np.float64)
    return float(np.nanmean(np.sqrt(2) * se * np.sqrt(2 / np.pi) / np.abs(rank["real"].to_numpy(np.float64))))


def noise_floor_text(rank: pd.DataFrame, days: int) -> str:
    """How far a *perfect* generated-population twin would still be from the measured real values.

    Days differ (each has its own population and traffic), so a policy's real value over ``days``
    days has a standard error ``se``, and a twin that draws its own ``days`` days has the same. Two
    independent means then differ by ``sqrt(2)·se`` in standard deviation, ``sqrt(2)·se·sqrt(2/π)``
    in expected absolute value: below that, an error in the *twin* column is not measurable.
    """
    se = rank["real_se"].to_numpy(np.float64)
    floor = noise_floor(rank)
    return (f"Noise floor: each policy's real value over {days} days has a standard error of "
            f"{np.nanmean(se):.3f} on average (day-to-day spread of populations and traffic), so even a perfect "
            f"twin drawing its own {days} days would show a mean relative error of about {100 * floor:.1f} % in the "
            "MAIL twin column (the replay column shares the real days and has no such floor).")


def reward_terms(df: pd.DataFrame, spec) -> dict[str, float]:  # type: ignore[no-untyped-def]
    """Mean of each term ``weight x column`` of the spec's weighted reward (empty without weights)."""
    return {c: float(w * df[c].mean()) for c, w in (spec.reward_weights or {}).items() if c in df}
#: subsections written by hand (where the twin errs, the error decomposition); a full run keeps them
KEEP_SUBSECTIONS = (
    "### Under the operator's multi-objective reward (rerun 2026-11-29)",
    "### The offset diagnosed (issue 44)",  # benchmarks/_twin_offset.py
    "### Declared site dynamics",
    "### Where the generated-population twin's error comes from",
    "### Where the return error comes from",
    QUICK_SECTION,  # written by --write-quick: a full run must keep it
    "### Where the twin's revenue and task-time change bias came from (issue 44)",
    "### Constrained policy vs plain PPO, scored on the cluster (issue 44)",  # benchmarks/constrained_training.py
    "### The response model's output noise by predicted level (issue 44)",
    "### The effect-size term calibrated on replayed held-out days (issue 44)",
)
#: the subsection `--pool ... --write-pooled` writes (kept by full runs: `KEEP_SUBSECTIONS`)
POOLED_SECTION = KEEP_SUBSECTIONS[-1]


def _site_flags(args: argparse.Namespace) -> str:
    flags = f" --logging {args.logging}" if args.logging != "random" else ""
    flags += "" if getattr(args, "declared", True) else " --no-declared"
    flags += f" --bc-epochs {args.bc_epochs}" if getattr(args, "bc_epochs", 10) != 10 else ""
    flags += f" --eval-days {args.eval_days}" if getattr(args, "eval_days", 10) != 10 else ""
    if isinstance(args.site_model, list):
        return flags + f" --site-columns {','.join(args.site_model)}"
    return flags + (" --site-model" if args.site_model else "")


#: ``--logging regimes``: a regime lasts 8 ticks (2 hours) and spans 0.3 of each action's range
REGIME_TICKS, REGIME_WIDTH = 8, 0.3
#: how each ``--logging`` choice is described in the docs
LOGGING_TEXT = {
    "random": "logged under uniformly random actions",
    "production": "logged under the SLO-aware heuristic with 10 % action noise (production-like: a deployed "
                  "scheduler with a little exploration)",
    "regimes": f"logged under a regime-switching policy (uniform actions in a random box of {REGIME_WIDTH} x each "
               f"action's range, redrawn every {REGIME_TICKS} ticks: a scheduler whose configuration changes every "
               f"{REGIME_TICKS // 4} hours)",
}


# ------------------------------------------------------------------ per-KPI change (issue 44)
def declared_kpis(spec) -> dict[str, str]:  # type: ignore[no-untyped-def]
    """Every output column the spec gives a direction (declared ``better``, else the reward weight's
    sign), as the gate reads it (`default_kpis`): ``column -> "higher" | "lower"``."""
    from edgetwin.twin.whatif import default_kpis

    outputs = [f.name for f in spec.features if f.role in ("response", "kpi")]
    return {k.name: k.better for k in default_kpis(spec, outputs) if k.better is not None and k.name in outputs}


def day_means(df: pd.DataFrame, cols: list[str]) -> pd.DataFrame:
    """Per episode (day), the mean of each column over its agent-steps: ``(days, len(cols))``."""
    return df.groupby("episode")[cols].mean()


def kpi_change_rows(days: dict[str, dict[str, pd.DataFrame]], baseline: str, better: dict[str, str],
                    n_boot: int = 2000, seed: int = 0,
                    calibration: dict[str, tuple[np.ndarray, float, float]] | None = None,
                    paired: bool = False, effect: bool = True,
                    effect_of: dict[str, dict[str, float]] | None = None) -> list[dict]:  # type: ignore[type-arg]
    """Per candidate and declared KPI: the cluster's relative change against ``baseline`` and the
    twin's, the twin's 90 % interval (percentile bootstrap over its simulated days of both policies,
    resampled independently), whether it covers the cluster's change, and the error in points.

    ``paired``: every policy ran on the same days, on the cluster and in the twin alike (the same
    seeds: the same populations and noise, common random numbers, as the what-if engine compares
    policies), so day ``i`` of a candidate and of the baseline are resampled together, and the
    measured change's day noise is the twin's paired spread (`measured_change_interval`'s
    ``paired_twin_days``). Unpaired, a twin change compares two different sets of generated days:
    their population noise, shared by every candidate through the one baseline run, reads as a bias.

    ``days[policy]["real" | "twin"]`` are `day_means` frames. The cluster's own change is measured
    on a finite number of days too: its 90 % interval (same bootstrap) is reported beside it.

    ``calibration``: KPI -> (per-day means of held-out *logged* days, the twin's conformal relative
    level error on them[, its conformal effect-size error: `change_calibration`]); ``effect``: add the
    effect-size error to the interval (`measured_change_interval`'s ``q_effect``); ``effect_of``:
    policy -> KPI -> its own effect-size term instead (`replayed_effect_terms`: the multiple calibrated
    on replayed held-out days times how far the policy moves the actions). With it, the twin's interval is `measured_change_interval` (its own spread,
    the measured change's day noise estimated from the logs, and its model error); the bootstrap-only
    interval stays in the row as ``twin_bootstrap_interval`` / ``covers_bootstrap``."""
    from edgetwin.twin.intervals import measured_change_interval

    rng = np.random.default_rng(seed)

    def change_and_interval(c: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
        base = float(b.mean())
        if base == 0:
            return float("nan"), float("nan"), float("nan")
        if paired and len(c) != len(b):
            raise ValueError(f"paired days: {len(c)} candidate days vs {len(b)} baseline days")
        boot = []
        for _ in range(n_boot):
            if paired:
                i = rng.integers(len(b), size=len(b))
                bb, cc = float(b[i].mean()), float(c[i].mean())
            else:
                bb, cc = float(rng.choice(b, len(b)).mean()), float(rng.choice(c, len(c)).mean())
            boot.append((cc - bb) / abs(bb or base))
        lo, hi = np.percentile(boot, [5, 95])
        return float((c.mean() - base) / abs(base)), float(lo), float(hi)

    rows = []
    for name, d in days.items():
        if name == baseline:
            continue
        for k, direction in better.items():
            real, rlo, rhi = change_and_interval(d["real"][k].to_numpy(), days[baseline]["real"][k].to_numpy())
            twin, blo, bhi = change_and_interval(d["twin"][k].to_numpy(), days[baseline]["twin"][k].to_numpy())
            lo, hi = blo, bhi
            if calibration is not None and k in calibration:
                cal = calibration[k]
                q_eff = cal[2] if effect and len(cal) > 2 else 0.0
                if effect_of is not None:
                    q_eff = effect_of[name][k]
                lo, hi = measured_change_interval(twin, (blo, bhi), cal[0], len(d["real"]),
                                                  len(days[baseline]["real"]), cal[1],
                                                  paired_twin_days=len(d["twin"]) if paired else None,
                                                  q_effect=q_eff)
            rows.append({"policy": name, "kpi": k, "better": direction, "real_change": real,
                         "real_interval": [rlo, rhi], "twin_change": twin, "twin_interval": [lo, hi],
                         "covers": bool(lo <= real <= hi), "error_points": 100 * abs(twin - real),
                         "protocol": "paired" if paired else "independent",
                         "twin_bootstrap_interval": [blo, bhi], "covers_bootstrap": bool(blo <= real <= bhi)})
    return rows


def kpi_change_summary(rows: list[dict]) -> dict:  # type: ignore[type-arg]
    """Coverage of the (candidate, KPI) changes by the twin's 90 % interval (with its Clopper-Pearson
    90 % interval: the rows are not independent across KPIs of one candidate, so it is optimistic)
    and the median absolute change error in points; per KPI too."""
    from scipy.stats import binomtest

    def one(rs: list[dict]) -> dict:  # type: ignore[type-arg]
        rs = [r for r in rs if np.isfinite(r["real_change"]) and np.isfinite(r["twin_change"])]
        k, n = sum(r["covers"] for r in rs), len(rs)
        ci = binomtest(k, n).proportion_ci(0.90, method="exact") if n else None
        kb = sum(r.get("covers_bootstrap", r["covers"]) for r in rs)
        return {"n": n, "coverage": k / n if n else float("nan"),
                "coverage_bootstrap_only": kb / n if n else float("nan"),
                "coverage_interval": [ci.low, ci.high] if ci else None,
                "median_abs_error_points": float(np.median([r["error_points"] for r in rs])) if rs else float("nan"),
                "median_width_points": float(np.median([100 * (r["twin_interval"][1] - r["twin_interval"][0])
                                                        for r in rs])) if rs else float("nan"),
                # the twin's bias on the change (a shared sign = a biased point estimate, not a narrow interval)
                "mean_signed_error_points": float(np.mean([100 * (r["twin_change"] - r["real_change"]) for r in rs]))
                if rs else float("nan")}

    out = one(rows)
    out["per_kpi"] = {k: one([r for r in rows if r["kpi"] == k]) for k in dict.fromkeys(r["kpi"] for r in rows)}
    return out


def pool_kpi_changes(paths: list[str], key: str = "kpi_change_effect") -> dict:  # type: ignore[type-arg]
    """`kpi_change_summary` of the ``key`` rows of several quick runs' JSON files together (the
    seeds pooled: every (seed, candidate, KPI) change one row), with the files it read."""
    rows: list[dict] = []  # type: ignore[type-arg]
    for p in paths:
        d = json.loads(Path(p).read_text())
        if key not in d:
            raise SystemExit(f"{p}: no {key!r} (a --quick --json run of this benchmark?)")
        rows += d[key]["rows"]
    return {"files": paths, "key": key, **kpi_change_summary(rows)}


def pooled_markdown(paths: list[str]) -> str:
    """The `POOLED_SECTION` from several quick runs' JSON files (one per seed): per seed and pooled,
    the coverage and median width of the change intervals with the one-step effect term
    (``kpi_change_effect``) and with the term calibrated on replayed held-out days
    (``kpi_change_replayed``), the replayed multiples per KPI, and every change still missed."""
    runs = [(p, json.loads(Path(p).read_text())) for p in paths]
    for p, d in runs:
        if "kpi_change_replayed" not in d:
            raise SystemExit(f"{p}: no 'kpi_change_replayed' (a --quick --json run of this benchmark's current code?)")
    keys = ("kpi_change_effect", "kpi_change_replayed")
    pooled = {k: pool_kpi_changes(paths, k) for k in keys}

    def cov(s: dict) -> str:  # type: ignore[type-arg]
        k = round(s["coverage"] * s["n"])
        lo, hi = s["coverage_interval"]
        return f"{k} / {s['n']} = {100 * s['coverage']:.1f} % (CP 90 % {100 * lo:.0f}-{100 * hi:.0f})"

    L = [POOLED_SECTION, "",
         "Command: `python benchmarks/twin_fidelity.py --quick --seed S --json docs/benchmarks/twin_fidelity/seeds/"
         "replayed_seedS.json` for S = 0, 1, 2 (the quick twin: 3 training days, 1 member; 10 cluster and 10 twin days "
         "per policy; 2 CPU cores shared with four other sessions), then `python benchmarks/twin_fidelity.py --pool "
         + " ".join(p for p, _ in runs) + " --pool-key kpi_change_replayed --write-pooled`. Both intervals are "
         "computed in the same runs, on the same twins and cluster days.", "",
         "The effect-size term of a candidate's change interval (`measured_change_interval`'s `q_effect`) was the "
         "split-conformal quantile of the one-step action contrasts' errors (the twin teacher forced on held-out "
         "logged rows; the same for every candidate). Here it is calibrated on what can be checked without the "
         "cluster: each of the 10 held-out logged days (the random logging policy's, days the twin was not fitted on) "
         "is replayed in the twin from its logged first states with its logged actions, free-running (its states its "
         "own: what compounds over a day is in it); the mean of each KPI among the rows whose action fell in one third "
         "of its range against all rows is a change the cluster produced, the twin's the same change in the replay, and "
         "their difference divided by how far that third moves the action (the 1-Wasserstein distance, in units of "
         "the range the log explored) is an effect error per unit of action moved; a day scores its largest "
         "(`replayed_effect_scores`). The multiple `λ` is the split-conformal 90 % quantile of the 10 days' scores "
         "(the 10th of 10: the largest), and a candidate's term is `λ x (its action shift + the baseline's)`, its "
         "shift the same distance between its actions in its own twin days and the log's (`action_shift`, "
         "`replayed_effect_terms`). The level is the intervals' 90 %; no constant was chosen, and nothing in the "
         "interval comes from a candidate's cluster run (they only score it).", "",
         "This term is the benchmark's. The product's change interval (`change_interval`, the what-if and the "
         "promotion gate) carries its own version since issue 44's second round (`edgetwin/twin/whatif/effects.py`, "
         "method `replayed`): calibrated at decision time on the days the gate replays, one multiple per action column, "
         "contrasts in the KPI's own units and net of their own sampling noise (a paired bootstrap over the day's "
         "agents). Its coverage where the product is scored: "
         "[the what-if gate's page](../whatif_gate/README.md#the-replayed-effect-size-term-in-the-products-change-interval-issue-44).", "",
         "| seed | coverage, one-step effect term | coverage, replayed effect term | median width (points), one-step "
         "-> replayed | median abs. change error (points) |",
         "|---|---|---|---|---:|"]
    for _, d in runs:
        e, r = d["kpi_change_effect"]["summary"], d["kpi_change_replayed"]["summary"]
        L.append(f"| {d['args']['seed']} | {cov(e)} | {cov(r)} | {e['median_width_points']:.0f} -> "
                 f"{r['median_width_points']:.0f} | {r['median_abs_error_points']:.1f} |")
    e, r = pooled["kpi_change_effect"], pooled["kpi_change_replayed"]
    L.append(f"| {len(runs)} seeds pooled | {cov(e)} | **{cov(r)}** | {e['median_width_points']:.0f} -> "
             f"**{r['median_width_points']:.0f}** | {r['median_abs_error_points']:.1f} |")
    L += ["", f"Target: coverage >= 90 %: {'met' if r['coverage'] >= 0.9 else 'missed'} with the replayed term. "
          "The CP interval treats the rows as independent; the KPIs of one candidate are not, so it is optimistic.", "",
          "Per KPI, pooled (replayed term), with each seed's multiple `λ` (change per unit of action moved):", "",
          "| KPI | coverage | median width (points) | λ by seed |", "|---|---|---:|---|"]
    for k, sk in r["per_kpi"].items():
        lams = ", ".join(f"{d['kpi_change_replayed']['calibration'][k]['multiple']:.2f}" for _, d in runs)
        L.append(f"| {k} | {cov(sk)} | {sk['median_width_points']:.0f} | {lams} |")
    misses = [(d["args"]["seed"], x) for _, d in runs for x in d["kpi_change_replayed"]["rows"] if not x["covers"]]
    L += ["", f"Where it is still missed ({len(misses)} changes), largest error first:", "",
          "| seed | candidate | KPI | cluster change | twin change [its 90 % interval] | error (points) |",
          "|---|---|---|---:|---:|---:|"]
    for seed, x in sorted(misses, key=lambda m: -m[1]["error_points"]):
        L.append(f"| {seed} | {x['policy']} | {x['kpi']} | {100 * x['real_change']:+.1f} % | "
                 f"{100 * x['twin_change']:+.1f} % [{100 * x['twin_interval'][0]:+.1f}, "
                 f"{100 * x['twin_interval'][1]:+.1f}] | {x['error_points']:.1f} |")
    return "\n".join(L) + "\n"


def write_subsection(heading: str, md: str) -> None:
    """Replace the ``heading`` subsection of the twin-fidelity section with ``md`` (up to the next
    heading), or append it at the end of the section (`QUICK_SECTION`, `POOLED_SECTION`)."""
    text = DOC.read_text()
    pattern = re.compile(rf"^{re.escape(heading)}\n.*?(?=^## |^### |\Z)", re.S | re.M)
    if pattern.search(text):
        text = pattern.sub(lambda _: md + "\n", text)
    else:
        sec = re.compile(rf"^{re.escape(SECTION)}\n.*?(?=^## |\Z)", re.S | re.M)
        m = sec.search(text)
        if m is None:
            raise SystemExit(f"docs/benchmarks/twin_fidelity/README.md has no {SECTION!r} section")
        text = text[: m.end()].rstrip("\n") + "\n\n" + md + "\n" + text[m.end():]
    DOC.write_text(text)


def kpi_change_markdown(rows: list[dict], summary: dict, baseline: str, days: int,  # type: ignore[type-arg]
                        unpaired: dict | None = None,  # type: ignore[type-arg]
                        with_effect: dict | None = None) -> list[str]:  # type: ignore[type-arg]
    """The page's per-KPI section: the headline, one line per KPI, and every miss as a finding.

    ``unpaired``: the `kpi_change_summary` of the same runs compared the previous way (the twin's
    days of each policy drawn with its own seed), printed beside the paired one."""
    ci = summary["coverage_interval"]
    paired = bool(rows) and "paired" in rows[0].get("protocol", "")
    L = ["", "#### The change each candidate makes to each declared KPI (issue 44)", "",
         f"Candidate vs `{baseline}`, relative change of the KPI's mean over agent-steps, on {days} cluster days and "
         f"{days} twin days per policy"
         + (", every policy on the same days on each side (the same seeds: the same populations and noise, common "
            "random numbers, as the what-if engine compares policies)" if paired else "")
         + ". Target: coverage >= 90 % of (candidate, KPI) changes inside the twin's 90 % "
         "interval, median absolute change error <= 10 points.", "",
         f"Coverage: **{100 * summary['coverage']:.0f} %** of {summary['n']} (candidate, KPI) changes "
         f"(90 % CP interval {100 * ci[0]:.0f}-{100 * ci[1]:.0f} %, optimistic: KPIs of one candidate are correlated); "
         f"median absolute change error **{summary['median_abs_error_points']:.1f} points**. "
         f"{'Met' if summary['coverage'] >= 0.9 and summary['median_abs_error_points'] <= 10 else 'Missed'}.", "",
         "| KPI | direction | coverage | median abs. error (points) | mean signed error (points) |",
         "|---|---|---:|---:|---:|"]
    better = {r["kpi"]: r["better"] for r in rows}
    for k, s in summary["per_kpi"].items():
        L.append(f"| {k} | {better[k]} | {100 * s['coverage']:.0f} % of {s['n']} | {s['median_abs_error_points']:.1f} "
                 f"| {s['mean_signed_error_points']:+.1f} |")
    misses = [r for r in rows if not r["covers"]]
    noise = ("the twin's own paired spread scaled to the cluster's days (a paired change's day noise cannot be read "
             "off one policy's logs)" if paired else
             f"estimated from {days} held-out logged days of the logging policy")
    L += ["", "What the coverage is about: the cluster's change is itself measured on "
          f"{days} days, so the twin's interval (`edgetwin.twin.intervals.measured_change_interval`) combines its own "
          "spread (a percentile bootstrap over its simulated days; 1 member, so no ensemble term) with the day-to-day "
          f"noise of a measured change, {noise}, and adds the "
          f"twin's split-conformal relative error on {days} held-out logged days' means times the size of the change"
          + ". "
          "Everything it uses comes from the logs and the twin, none from the candidates' cluster runs. "
          f"The twin's bootstrap alone covers {100 * summary['coverage_bootstrap_only']:.0f} % "
          "of the same rows."]
    if with_effect is not None:
        ci_e = with_effect["coverage_interval"]
        L += ["", "With the twin's effect-size error added to each interval (`kpi_change_effect` in the JSON: the "
              "split-conformal quantile of `action_contrast_errors` on the same held-out logged days, the mean of a KPI "
              "among rows whose action fell in one third of its range against all rows, the twin answering the same "
              "logged states and actions one step ahead): coverage "
              f"{100 * with_effect['coverage']:.0f} % of {with_effect['n']} (90 % CP interval {100 * ci_e[0]:.0f}-"
              f"{100 * ci_e[1]:.0f} %)."]
    if unpaired is not None:
        L += ["", "The same runs compared the previous way, each policy's twin days drawn with a seed of its own "
              f"(so every candidate is compared with one draw of the baseline's generated population): coverage "
              f"{100 * unpaired['coverage']:.0f} %, median absolute change error "
              f"{unpaired['median_abs_error_points']:.1f} points, mean signed error per KPI "
              + ", ".join(f"{k} {v['mean_signed_error_points']:+.1f}" for k, v in unpaired["per_kpi"].items())
              + " (points)."]
    L += ["", f"Findings: the twin gets {len(misses)} change(s) wrong by more than its interval:", ""]
    L += ["| candidate | KPI | cluster change [90 %] | twin change [its 90 % interval] | error (points) |",
          "|---|---|---:|---:|---:|"]
    for r in sorted(misses, key=lambda r: -r["error_points"]):
        L.append(f"| {r['policy']} | {r['kpi']} | {100 * r['real_change']:+.1f} % [{100 * r['real_interval'][0]:+.1f}, "
                 f"{100 * r['real_interval'][1]:+.1f}] | {100 * r['twin_change']:+.1f} % [{100 * r['twin_interval'][0]:+.1f}, "
                 f"{100 * r['twin_interval'][1]:+.1f}] | {r['error_points']:.1f} |")
    return L


def change_calibration(twin: Twin, held: pd.DataFrame, policy: PlatformPolicy, kpis: list[str],
                       seed: int) -> dict[str, tuple[np.ndarray, float, float]]:
    """Per KPI, from held-out *logged* days only (the logging policy's, days the twin was not fitted
    on): their per-day means (the day-to-day noise a measured change carries), the twin's
    split-conformal relative error on those days' means, ``|real - twin| / |twin|`` with the twin
    running the logging policy on the same days' populations (`logged_rollout`), and its
    split-conformal error on the effects those days show (`action_contrast_errors` of the twin
    answering their logged states and actions, `one_step_outputs`; change units)."""
    from edgetwin.twin.intervals import action_contrast_errors, conformal_quantile

    actions = [c for c in held.columns if c.startswith("action.")]
    one = one_step_outputs(twin, held, seed=seed)
    contrast = action_contrast_errors(held[actions].to_numpy(), held[kpis].to_numpy(), one[kpis].to_numpy())

    real = day_means(held, kpis)
    twin_days = day_means(logged_rollout(twin, policy, held, seed=seed), kpis)
    out = {}
    for k in kpis:
        r, t = real[k].to_numpy(), twin_days[k].to_numpy()
        n = min(len(r), len(t))
        with np.errstate(divide="ignore", invalid="ignore"):
            scores = np.abs(r[:n] - t[:n]) / np.abs(t[:n])
        effect = [abs(float(x)) for x in contrast[kpis.index(k)]]
        out[k] = (r, conformal_quantile([float(x) for x in scores], 0.9)[0], conformal_quantile(effect, 0.9)[0])
    return out


def replayed_effect_terms(twin: Twin, held: pd.DataFrame, kpis: list[str], actions: dict[str, np.ndarray],
                          baseline: str, seed: int) -> tuple[dict[str, dict[str, float]], dict]:  # type: ignore[type-arg]
    """Per policy and KPI, the effect-size term of its change interval against ``baseline``:
    ``λ_k · (action_shift(policy) + action_shift(baseline))``, with ``λ_k`` the conformal multiple of
    the twin's effect-size error per unit of action moved on the held-out *logged* days ``held``, the
    twin free-running each day with its logged actions (`replayed_effect_calibration`), and each
    policy's shift measured on its own rows in the twin (``actions[policy]``, ``(N, A)``) against
    ``held``'s logged actions. Nothing in it comes from a policy run on the cluster. The level is the
    intervals' 90 %; the multiple is the conformal quantile of the days' scores as it comes, with no
    constant chosen. Returns ``(terms, details)``; details go to the JSON."""
    from edgetwin.twin.intervals import action_shift
    from edgetwin.twin.policy_calibration import replayed_effect_calibration

    cal = replayed_effect_calibration(twin, held, kpis, seed=seed)
    logged = held[twin.spec.action_columns].to_numpy()
    shift = {n: action_shift(a, logged) for n, a in actions.items()}
    terms = {n: {k: cal[k]["multiple"] * (shift[n] + shift[baseline]) for k in kpis} for n in actions}
    return terms, {"calibration": cal, "action_shift": shift}


def one_step_levels(twin: Twin, logs: dict[str, pd.DataFrame], kpis: list[str], seed: int) -> dict:  # type: ignore[type-arg]
    """Teacher forced (`one_step_outputs`, sampled) raw KPI means of the twin over the real ones, per
    policy's cluster days in ``logs``, with each member's output noise model (`Member.noise`) as
    fitted and with it switched off (one std per output, what twins drew before issue 44): what
    the noise model moves in the response model's raw level and in each policy's change against
    the first policy, before anything compounds."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    kept = [m.noise for m in twin.members]
    try:
        for mode in ("noise model", "one std"):
            if mode == "one std":
                for m in twin.members:
                    m.noise = None
            for name, df in logs.items():
                one = one_step_outputs(twin, df, seed=seed)
                out.setdefault(mode, {})[name] = {k: float(one[k].mean()) for k in kpis}
    finally:
        for m, n in zip(twin.members, kept, strict=True):
            m.noise = n
    out["real"] = {name: {k: float(df[k].mean()) for k in kpis} for name, df in logs.items()}
    return out


def one_step_levels_markdown(levels: dict, baseline: str) -> list[str]:  # type: ignore[type-arg]
    """Per KPI: the twin's one-step raw level over the real one under ``baseline``, and the mean
    absolute error of the other policies' changes against it (points), with and without the noise model."""
    kpis = list(next(iter(levels["real"].values())))
    names = [n for n in levels["real"] if n != baseline]
    L = ["", f"Teacher forced one step on each policy's cluster days (`one_step_levels`): the twin's raw level "
         f"over the cluster's under {baseline}, and the mean absolute error of the other {len(names)} policies' "
         f"changes against {baseline} (points), with the members' output noise model and with one std per output:", "",
         "| KPI | level, noise model | level, one std | change error, noise model | change error, one std |",
         "|---|---:|---:|---:|---:|"]
    for k in kpis:
        cells = []
        for mode in ("noise model", "one std"):
            cells.append(levels[mode][baseline][k] / levels["real"][baseline][k])
        errs = []
        for mode in ("noise model", "one std"):
            e = [abs(100 * (levels[mode][n][k] / levels[mode][baseline][k] - levels["real"][n][k] / levels["real"][baseline][k]))
                 for n in names]
            errs.append(float(np.mean(e)))
        L.append(f"| {k} | {cells[0]:.2f} | {cells[1]:.2f} | {errs[0]:.1f} | {errs[1]:.1f} |")
    return L


def logging_policy(args: argparse.Namespace, spec, seed: int) -> PlatformPolicy:  # type: ignore[no-untyped-def]
    """The policy the training (and held-out) logs are taken under: ``--logging random|regimes``."""
    if args.logging == "regimes":
        return RegimePolicy(spec, seed=seed, every=REGIME_TICKS, width=REGIME_WIDTH)
    if args.logging == "production":
        return NoisyPolicy(SLOAwarePolicy(spec), spec, 0.1, seed)
    return RandomPolicy(spec, seed=seed)


def quick_ranking(args: argparse.Namespace) -> None:
    """Section 3 only, small: 3 training days, 1 member, `--eval-days` evaluation days (default 10), PPO 30k steps, no FQE.

    Used to measure each change to the twin in a few minutes; the full run is the reference.
    """
    n_agents, steps, eval_eps = 100, 96, args.eval_days
    hyper = {"rounds": 10, "bc_epochs": args.bc_epochs}
    cfg = ClusterConfig(n_agents=n_agents, steps=steps, declared=args.declared)
    t_all = time.perf_counter()
    spec = cluster_spec(cfg)
    train, _ = generate_logs(cfg, episodes=3, policy=logging_policy(args, spec, args.seed), seed=args.seed)
    twin = Twin.fit(train, spec, seed=args.seed, members=1, population_hyper={"steps": 500}, progress=True,
                    site_model=args.site_model, **hyper)
    twin.profile_retries = args.profile_retries
    fit_s = time.perf_counter() - t_all
    policies = ranking_policies(spec, twin)
    policies["PPO trained in the twin"] = ppo_in_twin(twin, n_agents, steps, args.seed, 30_000)
    rows: list[dict] = []  # type: ignore[type-arg]
    terms: list[dict] = []  # type: ignore[type-arg]
    better = declared_kpis(spec)
    days: dict[str, dict[str, pd.DataFrame]] = {}
    days_unpaired: dict[str, dict[str, pd.DataFrame]] = {}  # the previous protocol: one twin seed per policy
    level_logs: dict[str, pd.DataFrame] = {}  # 2 cluster days of each fixed policy, for `one_step_levels`
    pol_actions: dict[str, np.ndarray] = {}  # each policy's actions on its own rows in the twin
    for i, (name, pol) in enumerate(policies.items()):
        real_df, _ = generate_logs(cfg, episodes=eval_eps, policy=pol, seed=args.seed + 500)
        if name != "PPO trained in the twin":
            level_logs[name] = real_df[real_df["episode"].isin(real_df["episode"].unique()[:2])]
        # every policy on the same generated days (common random numbers), as on the cluster above
        twin_df = twin.rollout(pol, episodes=eval_eps, seed=args.seed + 500, n_agents=n_agents, steps=steps,
                               all_members=True)
        days[name] = {"real": day_means(real_df, list(better)), "twin": day_means(twin_df, list(better))}
        pol_actions[name] = twin_df[spec.action_columns].to_numpy()
        other = twin_df if i == 0 else twin.rollout(pol, episodes=eval_eps, seed=args.seed + 500 + i,
                                                    n_agents=n_agents, steps=steps, all_members=True)
        days_unpaired[name] = {"real": days[name]["real"], "twin": day_means(other, list(better))}
        rep_df = logged_rollout(twin, pol, real_df, seed=args.seed + 500 + i, all_members=True)
        one_df = one_step_outputs(twin, real_df, seed=args.seed + 500 + i)
        for col, df in (("real", real_df), ("twin", twin_df), (REPLAY_COL, rep_df), (ONE_STEP_COL, one_df)):
            terms.append({"policy": name, "mode": col, **reward_terms(df, spec)})
        rows.append({"policy": name, "real": float(real_df["reward"].mean()), "real_se": day_se(real_df),
                     "twin": float(twin_df["reward"].mean()),
                     REPLAY_COL: float(rep_df["reward"].mean()), ONE_STEP_COL: float(one_df["reward"].mean()),
                     "out_of_support": twin_df.attrs["support"]["out_of_support"],
                     "profile_redrawn": twin_df.attrs["support"]["profile_redrawn"]})
        print(rows[-1], flush=True)
    rank = pd.DataFrame(rows)
    scores = {col: ranking_scores(rank, col) for col in ("twin", REPLAY_COL, ONE_STEP_COL)}
    L = [QUICK_SECTION, "",
         f"Command: `python benchmarks/twin_fidelity.py --quick --seed {args.seed}"
         f"{_site_flags(args)} --profile-retries {args.profile_retries}` (2 shared CPU cores; "
         f"{(time.perf_counter() - t_all) / 60:.0f} min, fit {fit_s:.0f} s). 3 training days, 1 member, "
         f"{hyper['rounds']} GAIL rounds, {hyper['bc_epochs']} BC epochs, GAN-SMMSG 500 steps, {eval_eps} evaluation days per policy "
         "(real and twin alike), PPO 30k steps. "
         "Smaller than the full run above, so its numbers are not comparable one to one.", "",
         f"| policy | real | twin | {REPLAY_COL} | {ONE_STEP_COL} | twin out-of-support |",
         "|---|---|---|---|---|---|"]
    for _, r in rank.iterrows():
        L.append(f"| {r['policy']} | {r['real']:.3f} | {r['twin']:.3f} | {r[REPLAY_COL]:.3f} | {r[ONE_STEP_COL]:.3f} | "
                 f"{100 * r['out_of_support']:.0f} % |")
    L += ["", noise_floor_text(rank, eval_eps), ""]
    for col, sc in scores.items():
        L.append(f"{col}: Spearman rho {sc['spearman']:.2f}, mean relative error {100 * sc['rel_err']:.0f} %, "
                 f"normalised absolute error {sc['norm_abs_error']:.2f}, regret@1 {sc['regret_at_1']:.2f} "
                 f"of the span ({sc['pick']}).  ")
    baseline = "random"  # the policy every candidate is compared with, as the demo's logging policy
    held, _ = generate_logs(cfg, episodes=eval_eps, policy=logging_policy(args, spec, args.seed + 7), seed=args.seed + 300)
    calibration = change_calibration(twin, held, logging_policy(args, spec, args.seed + 8), list(better), args.seed + 9)
    change_rows = kpi_change_rows(days, baseline, better, seed=args.seed, calibration=calibration, paired=True,
                                  effect=False)
    change_summary = kpi_change_summary(change_rows)
    unpaired_rows = kpi_change_rows(days_unpaired, baseline, better, seed=args.seed, calibration=calibration,
                                    effect=False)
    unpaired_summary = kpi_change_summary(unpaired_rows)
    effect_rows = kpi_change_rows(days, baseline, better, seed=args.seed, calibration=calibration, paired=True)
    effect_summary = kpi_change_summary(effect_rows)
    effect_terms, replayed = replayed_effect_terms(twin, held, list(better), pol_actions, baseline, args.seed + 10)
    replayed_rows = kpi_change_rows(days, baseline, better, seed=args.seed, calibration=calibration, paired=True,
                                    effect_of=effect_terms)
    replayed_summary = kpi_change_summary(replayed_rows)
    L += kpi_change_markdown(change_rows, change_summary, baseline, eval_eps, unpaired=unpaired_summary,
                             with_effect=effect_summary)
    ci_r = replayed_summary["coverage_interval"]
    L += ["", "With the effect-size term calibrated on replayed held-out logged days instead (`kpi_change_replayed`: "
          "the conformal multiple of the twin's effect error per unit of action moved, the twin free-running each "
          "day with its logged actions, times how far the candidate moves the actions; `replayed_effect_terms`): "
          f"coverage {100 * replayed_summary['coverage']:.0f} % of {replayed_summary['n']} (90 % CP interval "
          f"{100 * ci_r[0]:.0f}-{100 * ci_r[1]:.0f} %), median width {replayed_summary['median_width_points']:.0f} "
          f"points (the one-step effect term's: {effect_summary['median_width_points']:.0f})."]
    levels = one_step_levels(twin, level_logs, list(better), seed=args.seed + 11)
    L += one_step_levels_markdown(levels, baseline)
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "policies": rank.to_dict("records"),
                                               "scores": scores, "noise_floor_rel_err": noise_floor(rank),
                                               "kpi_change": {"baseline": baseline, "summary": change_summary,
                                                              "rows": change_rows, "paired": True},
                                               "kpi_change_unpaired": {"baseline": baseline,
                                                                       "summary": unpaired_summary,
                                                                       "rows": unpaired_rows},
                                               "kpi_change_effect": {"baseline": baseline, "summary": effect_summary,
                                                                     "rows": effect_rows},
                                               "effect_error_q90": {k: v[2] for k, v in calibration.items()},
                                               "kpi_change_replayed": {"baseline": baseline,
                                                                       "summary": replayed_summary,
                                                                       "rows": replayed_rows, **replayed},
                                               "one_step_levels": levels,
                                               "output_noise": [m.noise_source if m.noise else "none"
                                                                for m in twin.members],
                                               # per policy, the per-day KPI means behind both comparisons
                                               "day_means": {n: {side: d.to_dict("list") for side, d in v.items()}
                                                             for n, v in days.items()},
                                               "twin_day_means_unpaired": {n: v["twin"].to_dict("list")
                                                                           for n, v in days_unpaired.items()}},
                                              indent=1, default=str))
    tt = pd.DataFrame(terms)
    names = [c for c in tt.columns if c not in ("policy", "mode")]
    if names:
        real_t = tt[tt["mode"] == "real"].set_index("policy")[names]
        L += ["", "Reward terms (spec weight x column mean), twin minus real, mean over the policies:", "",
              "| twin mode | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for col in ("twin", REPLAY_COL, ONE_STEP_COL):
            d = (tt[tt["mode"] == col].set_index("policy")[names] - real_t).mean()
            L.append(f"| {col} | " + " | ".join(f"{d[c]:+.3f}" for c in names) + " |")
    md = "\n".join(L) + "\n"
    print(md)
    if args.write_quick:
        write_subsection(QUICK_SECTION, md)


# ------------------------------------------------------------------------------------ main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true",
                    help="policy ranking only: 3 training days, 1 member, no FQE (a few minutes; not written "
                         "to the docs unless --write-quick)")
    ap.add_argument("--write-quick", action="store_true", help="write the quick ranking into docs/benchmarks/twin_fidelity/README.md")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--site-model", action="store_true",
                    help="move site-level state by a SiteStateModel (default: the agents' mean prediction)")
    ap.add_argument("--site-columns", default=None,
                    help="comma-separated site-level columns for the site model (implies --site-model)")
    ap.add_argument("--no-site-model", action="store_true", help=argparse.SUPPRESS)  # the default; kept for old commands
    ap.add_argument("--logging", choices=sorted(LOGGING_TEXT), default="random",
                    help="the policy the training and held-out logs are taken under (default: uniformly random, "
                         "as in seed 004; regimes: a scheduler whose configuration changes every 2 hours)")
    ap.add_argument("--no-declared", dest="declared", action="store_false",
                    help="the spec declares nothing (every state column learned): the twin before declared dynamics")
    ap.add_argument("--bc-epochs", type=int, default=10,
                    help="behaviour-cloning epochs of every twin (default 10; more fits the logged behaviour closer "
                         "and extrapolated worse, docs/benchmarks/CHANGELOG.md)")
    ap.add_argument("--eval-days", type=int, default=10,
                    help="days each policy is scored on, on the cluster and in each twin (default 10; with 2 the "
                         "day-to-day spread alone gives the generated-population twin a ~7 %% error)")
    ap.add_argument("--json", default=None, help="--quick: also write its numbers to this JSON file")
    ap.add_argument("--profile-retries", type=int, default=4,
                    help="redraws of generated profiles out of the logs' support (0: keep them all)")
    ap.add_argument("--pool", nargs="+", metavar="JSON", default=None,
                    help="pool the KPI-change rows (with the effect term) of several --quick --json runs (one per "
                         "seed) and print their coverage with its Clopper-Pearson 90 %% interval, per KPI too")
    ap.add_argument("--pool-key", default="kpi_change_effect",
                    help="--pool: which rows of the JSON files (default kpi_change_effect; kpi_change_replayed: "
                         "the effect-size multiple calibrated on replayed held-out days)")
    ap.add_argument("--write-pooled", action="store_true",
                    help="--pool: write the pooled one-step vs replayed effect-term coverages as a subsection of "
                         "docs/benchmarks/twin_fidelity/README.md and their pooled summaries to seeds/pooled.json")
    add_scale_args(ap)
    args = ap.parse_args()
    if args.pool:
        if args.write_pooled:
            md = pooled_markdown(args.pool)
            print(md)
            write_subsection(POOLED_SECTION, md)
            pooled = {k: pool_kpi_changes(args.pool, k) for k in ("kpi_change_effect", "kpi_change_replayed")}
            (FIG / "seeds" / "pooled.json").write_text(json.dumps(pooled, indent=1))
            return
        print(json.dumps(pool_kpi_changes(args.pool, args.pool_key), indent=1))
        return
    if args.site_columns:
        args.site_model = [c.strip() for c in args.site_columns.split(",") if c.strip()]
    torch.set_num_threads(1)
    if args.quick:
        quick_ranking(args)
        return
    q = False
    n_agents, steps = 100, 96
    train_eps, held_eps, eval_eps = 6, 3, 2
    rank_days = args.eval_days
    members = 3
    hyper = {"rounds": 10, "bc_epochs": args.bc_epochs}
    pop = {"steps": 1500}
    cfg = ClusterConfig(n_agents=n_agents, steps=steps, declared=args.declared)
    t_all = time.perf_counter()

    spec = cluster_spec(cfg)
    train, _ = generate_logs(cfg, episodes=train_eps, policy=logging_policy(args, spec, args.seed), seed=args.seed)
    held, _ = generate_logs(cfg, episodes=held_eps, policy=logging_policy(args, spec, args.seed + 1000),
                            seed=args.seed + 1000)
    print(f"logs: train {len(train)} rows, held-out {len(held)} rows")

    fits: dict[str, Twin] = {}
    secs: dict[str, float] = {}
    for name, kw in (
        ("mail", {"response_model": "mail", "members": members}),
        ("bc", {"response_model": "bc", "members": 1}),
        ("supervised", {"response_model": "supervised", "members": 1}),
    ):
        t0 = time.perf_counter()
        fits[name] = Twin.fit(train, spec, seed=args.seed, population_hyper=pop, progress=True,
                              site_model=args.site_model, **kw, **hyper, **scale_kwargs(args))
        fits[name].profile_retries = args.profile_retries
        secs[name] = time.perf_counter() - t0
        print(f"fit {name}: {secs[name]:.0f} s")
    mail = fits["mail"]
    # the same MAIL twin on a spec that declares nothing (every state column learned): the "before"
    t0 = time.perf_counter()
    undeclared = Twin.fit(train, cluster_spec(cfg, declared=False), seed=args.seed, population_hyper=pop, progress=True,
                          site_model=args.site_model, response_model="mail", members=members, **hyper,
                          **scale_kwargs(args))
    undeclared.profile_retries = args.profile_retries
    secs["mail, nothing declared"] = time.perf_counter() - t0

    # 1. distribution match under the logging policy (known here)
    FIG.mkdir(parents=True, exist_ok=True)
    reports = {
        name: fidelity_report(tw, held, policy=logging_policy(args, spec, 7), seed=args.seed, episodes=eval_eps,
                              max_horizon=100, out_dir=FIG / name)
        for name, tw in fits.items()
    }
    # 2. compounding error of the three response models (member 0 each; mean predictions)
    comp = {name: replay_errors(tw, held, max_horizon=100) for name, tw in fits.items()}
    expo = {name: growth_exponent(c["h"].to_numpy(), c["outputs"].to_numpy()) for name, c in comp.items()}
    _plot_compounding(comp, expo)

    # 3. policy ranking
    rng_seed = args.seed + 500
    policies = ranking_policies(spec, mail)
    t0 = time.perf_counter()
    policies["PPO trained in the twin"] = ppo_in_twin(mail, n_agents, steps, args.seed, 150_000)
    secs["ppo_in_twin"] = time.perf_counter() - t0

    rows = []
    for i, (name, pol) in enumerate(policies.items()):
        real_df, _ = generate_logs(cfg, episodes=rank_days, policy=pol, seed=rng_seed)
        twin_df = mail.rollout(pol, episodes=rank_days, seed=rng_seed + i, n_agents=n_agents, steps=steps,
                               all_members=True)
        sup_df = fits["supervised"].rollout(pol, episodes=rank_days, seed=rng_seed + i, n_agents=n_agents, steps=steps)
        rep_df = logged_rollout(mail, pol, real_df, seed=rng_seed + i, all_members=True)
        und_df = undeclared.rollout(pol, episodes=rank_days, seed=rng_seed + i, n_agents=n_agents, steps=steps,
                                    all_members=True)
        rows.append({
            "policy": name,
            "real": float(real_df["reward"].mean()),
            "real_se": day_se(real_df),
            "twin": float(twin_df["reward"].mean()),
            REPLAY_COL: float(rep_df["reward"].mean()),
            UNDECLARED_COL: float(und_df["reward"].mean()),
            "supervised twin": float(sup_df["reward"].mean()),
            "fqe": fqe_d3rlpy(train, spec, pol, seed=args.seed),
            "fqe (trees)": fqe(train, spec, pol, seed=args.seed),
            "out_of_support": twin_df.attrs["support"]["out_of_support"],
        })
        print(rows[-1])
    rank = pd.DataFrame(rows)
    scores = {col: ranking_scores(rank, col, seed=args.seed) for col in EVALUATORS}

    # 4. throughput
    tp = {n: throughput(mail, spec, n, 5 if q else 20) for n in ((200, 1000) if q else (1000, 10_000))}

    md = _markdown(args, q, cfg, train, held, members, hyper, pop, secs, reports, expo, comp, rank, scores, tp,
                   time.perf_counter() - t_all, rank_days)
    print(md)
    if not q:
        _write_section(md)
        (FIG / "results.json").write_text(json.dumps(
            {"kl": {k: r["kl"] for k, r in reports.items()}, "growth_exponent": expo, "ranking": rows,
             "scores": scores, "eval_days": rank_days, "noise_floor_rel_err": noise_floor(rank), "declared_spec": args.declared, "logging": args.logging, "throughput": {str(k): v for k, v in tp.items()}}, indent=1, default=float))


def _plot_compounding(comp: dict[str, pd.DataFrame], expo: dict[str, float]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for name, c in comp.items():
        ax.loglog(c["h"], c["outputs"], label=f"{name} (b={expo[name]:.2f})")
    ax.set_xlabel("horizon h (ticks of 15 min)")
    ax.set_ylabel("mean |error| of outputs (std units)")
    ax.set_title("Open-loop compounding error, held-out days")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(FIG / "compounding.png", dpi=110)
    plt.close(fig)


def _markdown(args, q, cfg, train, held, members, hyper, pop, secs, reports, expo, comp, rank, scores, tp, total, rank_days) -> str:  # type: ignore[no-untyped-def]
    L = [SECTION, ""]
    flags = _site_flags(args) + (
        f" --profile-retries {args.profile_retries}" if args.profile_retries != 4 else "")
    L.append(f"Command: `python benchmarks/twin_fidelity.py{' --quick' if q else ''} --seed {args.seed}{flags}` "
             f"(machine: 2 CPU cores shared with other jobs, no GPU; whole run {total / 60:.0f} min). "
             f"Real system: the emulated cluster, {cfg.n_agents} service groups x {cfg.steps} ticks of 15 min per day, "
             f"{LOGGING_TEXT[args.logging]}; train {train['episode'].nunique()} days ({len(train):,} rows), "
             f"held out {held['episode'].nunique()} other days ({len(held):,} rows). MAIL twin: {members} members, "
             f"{hyper['rounds']} GAIL rounds per scenario, {hyper['bc_epochs']} BC epochs, GAN-SMMSG population "
             f"({pop['steps']} generator steps). Fit times: " + ", ".join(f"{k} {v:.0f} s" for k, v in secs.items()) + ".")
    L += ["", "**1. Outputs under the logging policy** (KL(real || twin) of each marginal, nats; seed 004 reports "
          "KL of virtual vs real agents in Table 1 (0.00-0.01 for GAN-SMMSG on its features) and no KL of responses):", ""]
    cols = list(next(iter(reports.values()))["kl"])
    L.append("| model | " + " | ".join(c.split(".", 1)[-1] for c in cols) + " | mean |")
    L.append("|---|" + "---|" * (len(cols) + 1))
    for name, r in reports.items():
        L.append(f"| {name} | " + " | ".join(f"{r['kl'][c]:.3f}" for c in cols) + f" | {r['mean_kl']:.3f} |")
    ts = reports["mail"]["time_slices"].get("response.offload_ratio")
    if ts:
        real, virt = np.array(ts["real"]), np.array(ts["twin"])
        L += ["", "Offload ratio over 12 two-hour slices of the day (seed 004 Fig. 4 shows the curves agree; no numbers):", "",
              "| slice | " + " | ".join(str(i + 1) for i in range(12)) + " |", "|---|" + "---|" * 12,
              "| real | " + " | ".join(f"{v:.3f}" for v in real) + " |",
              "| MAIL twin | " + " | ".join(f"{v:.3f}" for v in virt) + " |",
              "", f"Mean absolute gap {np.nanmean(np.abs(real - virt)):.3f}; correlation of the two curves "
              f"{np.corrcoef(real, virt)[0, 1]:.2f}. Out-of-support share of twin steps under the logging policy: "
              f"{100 * reports['mail']['support'].get('out_of_support', float('nan')):.1f} %. "
              "Figures: `docs/benchmarks/twin_fidelity/mail/fidelity_time_slices.png`, `.../fidelity_kl.png`."]
    L += ["", "**2. Compounding error** (open-loop replay of held-out days' logged actions from their first state; mean "
          "|error| of the outputs in standardised units at horizon h; `b` = fitted growth exponent of error ~ h^b; no paper number):", "",
          "| model | h=1 | h=10 | h=50 | h=95 | b |", "|---|---|---|---|---|---|"]
    for name, c in comp.items():
        get = lambda h, c=c: c.loc[c["h"] == h, "outputs"].iloc[0] if (c["h"] == h).any() else float("nan")  # noqa: E731
        L.append(f"| {name} | {get(1):.3f} | {get(10):.3f} | {get(50):.3f} | {get(95):.3f} | {expo[name]:.2f} |")
    L += ["", "**3. Policy ranking** (mean per-step reward = the spec's weighted multi-objective, `REWARD_WEIGHTS`, per group and tick, "
          f"over {rank_days} days of each policy on the cluster and {rank_days} generated days in each twin; "
          "the MAIL twin's value is the mean over all its ensemble members on the same populations):", "",
          "| policy | real | MAIL twin | MAIL twin, replaying the evaluation days' populations | MAIL twin, nothing "
          "declared | supervised twin | FQE (d3rlpy) | FQE (trees) | twin out-of-support |",
          "|---|---|---|---|---|---|---|---|---|"]
    for _, r in rank.iterrows():
        L.append(f"| {r['policy']} | {r['real']:.3f} | {r['twin']:.3f} | {r[REPLAY_COL]:.3f} | {r[UNDECLARED_COL]:.3f} "
                 f"| {r['supervised twin']:.3f} | {r['fqe']:.3f} | {r['fqe (trees)']:.3f} | {100 * r['out_of_support']:.0f} % |")
    L += ["", noise_floor_text(rank, rank_days)]
    L += ["", "Scored as the off-policy-evaluation literature does (DOPE, Fu et al. 2021): beside Spearman rho and the "
          "mean relative error, the mean absolute error and the regret of the evaluator's pick, both divided by the "
          "span of the real values; [90 % bootstrap intervals over the policies].", "",
          "| evaluator | Spearman rho | mean relative error | normalised abs. error | regret@1 (normalised) | its pick |",
          "|---|---|---|---|---|---|",
          "| target (issue 19, MAIL twin) | >= 0.95 | <= 10 % | - | 0 | - |"]

    def ci(sc: dict, k: str, pct: bool = False) -> str:  # type: ignore[type-arg]
        lo, hi = sc[f"{k}_ci90"]
        f = (lambda v: f"{100 * v:.0f} %") if pct else (lambda v: f"{v:.2f}")
        return f"{f(sc[k])} [{f(lo)}, {f(hi)}]"

    for k, sc in scores.items():
        L.append(f"| {k} | {ci(sc, 'spearman')} | {ci(sc, 'rel_err', True)} | {ci(sc, 'norm_abs_error')} "
                 f"| {ci(sc, 'regret_at_1')} | {sc['pick']} |")
    L += ["", "FQE (d3rlpy): d3rlpy 2.5's `FQE` (Le et al. 2019) on the training logs' per-agent transitions, gamma "
          "0.9, standardised observations, 5,000 batches of 256; FQE (trees): the earlier hand-written version with "
          "sklearn gradient-boosted trees, 10 iterations, 40k transitions. Each estimate is (1-gamma) x mean Q(s, pi(s)) "
          "over logged states, comparable to a mean per-step reward.", "",
          "**4. Throughput** (agent-steps/s, uniformly random actions, one process, 1 torch thread; twin without "
          "ensemble disagreement):", "", "| agents | twin | emulated cluster | twin / cluster |", "|---|---|---|---|"]
    for n, (tw, cl) in tp.items():
        L.append(f"| {n:,} | {tw:,.0f} | {cl:,.0f} | {tw / cl:.2f} |")
    return "\n".join(L) + "\n"


def _write_section(md: str) -> None:
    """Replace the section with ``md``, keeping its hand-kept `KEEP_SUBSECTIONS`."""
    from _docs import write_section

    write_section(SECTION, md, DOC, keep=KEEP_SUBSECTIONS)

if __name__ == "__main__":
    main()
