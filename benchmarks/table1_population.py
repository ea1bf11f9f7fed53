"""Seed 004 Table 1: KL divergence between virtual (generated) and real agents, four models.

GAN-SMMSG vs GMM (10 components) vs GAN vs WGAN(-GP), each fitted on the training agents and
asked for 100,000 new ones, scored against HELD-OUT real agents on:

* the paper's four columns: average task time, convergence time, offloading ratio, agent (type /
  scenario) -- KL(real || generated), binned as in `edgetwin.contract.metrics.marginal_histograms`;
* extra columns: mean and max KL over all profile features, MMD^2 (RBF, median heuristic),
  classifier two-sample AUC (0.5 = indistinguishable), rank-correlation distance, fit time.

Two data sets:

1. ``cluster``: logs of the emulated edge-cloud cluster (`edgetwin.emulator.logs.generate_logs`,
   random logging policy), one row per service group: its 11 ``profile.*`` features, among them
   ``mean_task_s`` (average task time), ``convergence_steps`` (convergence time) and
   ``base_offload`` (its baseline offloading ratio); scenarios mbb / iot / iov are the agent types.
   Held-out = whole episodes (fresh populations) the models never saw.
2. ``alibaba``: the task features of the real Alibaba cluster-trace-v2017 ``batch_task.csv``
   (duration, cpu per instance, memory per instance, number of instances), scenario = the task's
   final status (Terminated / Failed). Held-out = a random 20 % of the tasks.

A "real (train)" row scores the training agents themselves against the held-out ones: the floor
that sampling noise puts under any model's numbers.

Usage::

    python benchmarks/table1_population.py            # full: ~60k cluster agents, 100k generated
    python benchmarks/table1_population.py --quick    # minutes: fewer agents, steps and samples

Writes the Markdown table into docs/benchmarks/table1/README.md under "## Table 1 — population (GAN-SMMSG)"
(replacing only that section) and PNGs of the marginals to docs/img/.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from edgetwin.contract.metrics import fidelity_report
from edgetwin.contract.spec import Feature, TwinSpec
from edgetwin.generative import agent_profiles, fit_population
from edgetwin.generative.report import plot_marginals

REPO = Path(__file__).resolve().parents[1]
SECTION = "## Table 1 — population (GAN-SMMSG)"
ALIBABA = (
    REPO.parent / "shared" / "data" / "Workload-Prediction-of-Alibaba-Cluster-Dataset" / "batch_task.csv"
)

#: Seed 004 Table 1 (KL: average task time, convergence time, offloading ratio, agent).
PAPER = {
    "gan-smmsg": (0.00, 0.00, 0.01, 0.00),
    "gmm": (0.03, 0.03, 0.07, 0.32),
    "gan": (0.70, 0.11, 0.18, 0.90),
    "wgan": (0.68, 0.03, 0.28, 0.02),
}
LABELS = {
    "gan-smmsg": "GAN-SMMSG",
    "gmm": "GMM",
    "gan": "GAN",
    "wgan": "WGAN",
    "gan-smmsg-raw": "ablation: GAN-SMMSG without calibration",
    "gmm-cal": "ablation: GMM + same calibration",
    "gmm-base-cal": "ablation: GMM with GAN-SMMSG's base K + same calibration",
    "real": "real (train)",
}
#: The four models of the paper's table; the ablations are extra rows, not contestants.
MAIN = ("gan-smmsg", "gmm", "gan", "wgan")
#: Row order of the table.
ORDER = (*MAIN, "gan-smmsg-raw", "gmm-cal", "gmm-base-cal", "real")
#: Per-data-set results of every model's latest run; rows of models not re-run are kept.
CACHE = REPO / "docs" / "benchmarks" / "table1"


# ------------------------------------------------------------------------------------- data
def cluster_data(agents: int, episodes: int, held_out_episodes: int, seed: int) -> dict[str, Any]:
    """Profiles of the emulated cluster's service groups; held-out = the last episodes."""
    from edgetwin.emulator.cluster import ClusterConfig
    from edgetwin.emulator.logs import generate_logs

    # Profiles are drawn at reset, so one tick per episode logs every group's profile.
    log, spec = generate_logs(
        ClusterConfig(n_agents=agents, steps=1), episodes=episodes, seed=seed, progress=True
    )
    prof = agent_profiles(log, spec)
    test_mask = prof["episode"].to_numpy() >= episodes - held_out_episodes
    cols = ["scenario", *spec.names("profile")]
    return {
        "name": "cluster",
        "title": f"emulated edge-cloud cluster ({agents} groups x {episodes} episodes, random logging policy)",
        "spec": spec,
        "train": prof.loc[~test_mask, cols].reset_index(drop=True),
        "test": prof.loc[test_mask, cols].reset_index(drop=True),
        "paper_cols": ["profile.mean_task_s", "profile.convergence_steps", "profile.base_offload"],
        "paper_names": ["avg task time", "convergence time", "offload ratio"],
    }


def alibaba_spec(cpu_values: list[float]) -> TwinSpec:
    """A twin spec for per-task features of Alibaba v2017 batch_task (built here, not in the library)."""
    return TwinSpec(
        features=(
            Feature("profile.duration_s", "heavy_tailed", low=0.0, unit="s (end - create)"),
            Feature("profile.cpu_cores", "discrete", values=tuple(cpu_values), unit="cores per instance"),
            Feature("profile.memory", "heavy_tailed", low=0.0, high=1.0, unit="normalised, per instance"),
            Feature("profile.instances", "heavy_tailed", low=1.0, unit="instances"),
            Feature("action.placement", "continuous", low=0.0, high=1.0),  # a spec needs an action
        ),
        name="alibaba-v2017-batch-task",
    )


def alibaba_data(seed: int, max_rows: int | None = None) -> dict[str, Any]:
    """Tasks of Alibaba v2017 that finished (Terminated / Failed) with cpu and memory requests."""
    raw = pd.read_csv(ALIBABA, skipinitialspace=True)
    raw.columns = [c.strip() for c in raw.columns]
    cpu = raw["number_of_cpus_requested_per_instance_in_the_task"]
    mem = raw["normalized_memory_requested_per_instance_in_the_task"]
    dur = raw["task_end_time"] - raw["task_create_time"]
    keep = raw["status"].isin(["Terminated", "Failed"]) & cpu.notna() & mem.notna() & (dur > 0)
    df = pd.DataFrame(
        {
            "scenario": raw.loc[keep, "status"].to_numpy(),
            "profile.duration_s": dur[keep].to_numpy(np.float64),
            "profile.cpu_cores": cpu[keep].to_numpy(np.float64) / 100.0,
            "profile.memory": mem[keep].to_numpy(np.float64),
            "profile.instances": raw.loc[keep, "number_of_instances"].to_numpy(np.float64),
        }
    )
    rng = np.random.default_rng(seed)
    df = df.iloc[rng.permutation(len(df))].reset_index(drop=True)
    if max_rows is not None:
        df = df.iloc[:max_rows]
    n_test = len(df) // 5
    spec = alibaba_spec(sorted(df["profile.cpu_cores"].unique().tolist()))
    return {
        "name": "alibaba",
        "title": f"Alibaba cluster-trace-v2017 batch_task ({len(df):,} finished tasks; scenario = status)",
        "spec": spec,
        "train": df.iloc[n_test:].reset_index(drop=True),
        "test": df.iloc[:n_test].reset_index(drop=True),
        "paper_cols": ["profile.duration_s", "profile.cpu_cores", "profile.memory"],
        "paper_names": ["task duration", "cpu (paper: conv. time)", "memory (paper: offload)"],
    }


# ------------------------------------------------------------------------------------- run
def _evaluate(test: pd.DataFrame, gen: pd.DataFrame, spec: TwinSpec, seed: int) -> dict[str, Any]:
    return fidelity_report(test, gen, spec, spec.names("profile"), seed=seed)


def run_dataset(
    data: dict[str, Any], models: list[str], steps: int, n_gen: int, seed: int, run: dict[str, Any]
) -> dict[str, Any]:
    """Fit and score ``models`` on one data set; returns ``{key: row}`` for the rows it (re)computed.

    The GMM is always fitted first: it is the timing baseline of the run (fit times are ratios to it).
    ``gan-smmsg`` also yields ``gan-smmsg-raw`` (the same fitted model sampled without its
    calibration layer); ``gmm-cal`` is a GMM with the same calibration layer.
    """
    spec: TwinSpec = data["spec"]
    train, test = data["train"], data["test"]
    print(f"\n== {data['title']}: {len(train):,} train / {len(test):,} held-out agents", flush=True)
    rows: dict[str, dict[str, Any]] = {}
    rows["real"] = {**_evaluate(test, train, spec, seed), "fit_seconds": float("nan"), "run": run}
    gmm_s = float("nan")
    # the GMM first (timing baseline), gmm-base-cal after gan-smmsg (it takes its base's K)
    todo = ["gmm", *[m for m in models if m not in ("gmm", "gmm-base-cal")]]
    todo += ["gmm-base-cal"] if "gmm-base-cal" in models else []
    base_k: int | None = None
    for m in todo:
        base = "gmm" if m in ("gmm-cal", "gmm-base-cal") else m
        hyper: dict[str, Any] = {"calibrate": True} if m in ("gmm-cal", "gmm-base-cal") else {}
        if m == "gmm-base-cal":
            if base_k is None:
                print("skipping gmm-base-cal: it needs gan-smmsg in the same run", file=sys.stderr)
                continue
            hyper["n_components"] = base_k
        if base not in ("gmm",):
            hyper["steps"] = steps
        t0 = time.perf_counter()
        pm = fit_population(train, spec, base, seed=seed, progress=True, **hyper)
        fit_s = time.perf_counter() - t0
        if m == "gmm":
            gmm_s = fit_s
        if m == "gan-smmsg":
            base_k = pm.meta.get("base_components_selected")
        variants = [(m, pm.calibration)]
        if m == "gan-smmsg" and pm.calibration is not None:
            variants.append(("gan-smmsg-raw", None))
        for key, cal in variants:
            pm.calibration = cal
            t0 = time.perf_counter()
            gen = pm.sample(n_gen, seed=seed + 1)
            sample_s = time.perf_counter() - t0
            rep = _evaluate(test, gen, spec, seed)
            rows[key] = {
                **rep,
                "fit_seconds": fit_s,
                "fit_ratio": fit_s / gmm_s,
                "gmm_seconds": gmm_s,
                "sample_per_s": n_gen / max(sample_s, 1e-9),
                "hyper": pm.hyper,
                "model_choices": {
                    k: pm.meta[k]
                    for k in (
                        "base_components_selected",
                        "base_components_val_loglik",
                        "selected_step",
                        "selection",
                    )
                    if k in pm.meta
                },
                "run": run,
            }
            print(
                f"{key:14s} fit {fit_s:7.1f}s  KL {[round(rep['kl'][c], 4) for c in data['paper_cols']]} "
                f"agent {rep['kl_label']:.4f}  mean {rep['kl_mean']:.4f}  max {rep['kl_max']:.4f}  "
                f"MMD {rep['mmd']:.4f}  AUC {rep['c2st_auc']:.3f}  corr {rep['corr_dist']:.3f}",
                flush=True,
            )
            if key in MAIN or key == "gmm-cal":
                _GENERATED.setdefault(data["name"], {})[LABELS[key]] = gen
    return rows


#: Generated samples of this process, for the marginals figure: {data set: {label: rows}}.
_GENERATED: dict[str, dict[str, pd.DataFrame]] = {}


def merge_cached(data: dict[str, Any], new_rows: dict[str, Any], cache_dir: Path | None) -> dict[str, Any]:
    """Combine ``new_rows`` with the cached rows of models not re-run; write the cache back."""
    cached: dict[str, Any] = {}
    path = None if cache_dir is None else cache_dir / f"{data['name']}.json"
    if path is not None and path.is_file():
        old = json.loads(path.read_text())
        if old.get("n_train") == len(data["train"]) and old.get("n_test") == len(data["test"]):
            cached = old["rows"]
        else:
            print(f"ignoring {path}: it was made on a different split", file=sys.stderr)
    rows = {**cached, **new_rows}
    res = {
        "name": data["name"],
        "title": data["title"],
        "paper_cols": data["paper_cols"],
        "paper_names": data["paper_names"],
        "rows": rows,
        "img": f"docs/img/table1_{data['name']}_marginals.png",
        "n_train": len(data["train"]),
        "n_test": len(data["test"]),
    }
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(res, indent=1, default=_json_default))
    return res


def _f(x: float, nd: int = 3) -> str:
    return "–" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{x:.{nd}f}"


def markdown(results: list[dict[str, Any]]) -> str:
    lines = [
        SECTION,
        "",
        f"Machine: {platform.machine()}, 2 CPU cores shared with other jobs (load average 4-10 during "
        f"these runs), no GPU; torch {torch.__version__} with 1 thread. Each row comes from the run "
        "named in its *run* column (commands below each table); per-model results are kept in "
        "`docs/benchmarks/table1/<data set>.json`, so a model that was not re-run keeps its last numbers.",
        "",
        "KL(real ‖ generated) in nats on HELD-OUT real agents, 50 equal-width bins over the real data's "
        "[q0.1 %, q99.9 %] (for heavy-tailed features in log(x − low + δ) space, δ = 1 % of the real median "
        "above low; one bin per allowed value for discrete ones), +1e-6 smoothing. *Agent* = KL of the "
        "scenario (agent type) frequencies. Extra columns: mean / max KL over all profile features, MMD² "
        "(RBF, median-heuristic bandwidth, standardised, 2,000 rows each), C2ST = cross-validated ROC AUC "
        "of a gradient-boosting classifier separating 5,000 real from 5,000 generated rows (0.5 = "
        "indistinguishable; its run-to-run noise is about ±0.01), corr = RMS difference of Spearman "
        "correlation matrices. *real (train)* scores the training agents themselves: the sampling-noise "
        "floor. Fit time is a ratio to the GMM's fit in the same run (GMM seconds in brackets).",
        "",
    ]
    for res in results:
        rows = res["rows"]
        pc = res["paper_names"]
        runs: list[str] = []
        for key in ORDER:
            if key in rows and key != "real":
                rid = _run_label(rows[key].get("run"))
                if rid not in runs:
                    runs.append(rid)
        lines += [
            f"**{res['title']}** — {res['n_train']:,} training / {res['n_test']:,} held-out agents.",
            "",
            f"| model | {pc[0]} | {pc[1]} | {pc[2]} | agent | paper (task / conv. / offload / agent) "
            "| mean KL | max KL | MMD² | C2ST AUC | corr | fit time | run |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for key in ORDER:
            if key not in rows:
                continue
            r = rows[key]
            kls = [_f(r["kl"][c]) for c in res["paper_cols"]]
            paper = " / ".join(f"{v:.2f}" for v in PAPER[key]) if key in PAPER else "–"
            if key == "real":
                fit, run = "–", "–"
            else:
                run = str(runs.index(_run_label(r.get("run"))) + 1)
                ratio = r.get("fit_ratio")
                if key == "gmm":
                    fit = f"1.0 ({r['fit_seconds']:.1f} s)"
                elif ratio is None:
                    fit = "–"
                else:
                    secs = r["fit_seconds"]
                    fit = (
                        f"{ratio:.0f}× ({secs / 60:.1f} min)"
                        if secs >= 60
                        else f"{ratio:.1f}× ({secs:.1f} s)"
                    )
            name = LABELS[key]
            lines.append(
                f"| {name} | {' | '.join(kls)} | {_f(r['kl_label'])} | {paper} | {_f(r['kl_mean'])} | "
                f"{_f(r['kl_max'])} | {_f(r['mmd'], 4)} | {_f(r['c2st_auc'])} | {_f(r['corr_dist'])} | {fit} | {run} |"
            )
        lines += [""]
        for i, rid in enumerate(runs, 1):
            lines.append(f"{i}. {rid}  ")
        lines += ["", _winners(res), ""]
        ch = rows.get("gan-smmsg", {}).get("model_choices", {})
        if ch.get("selection"):
            sel = ", ".join(f"{r['step']}: {r['val_c2st_auc']:.3f}" for r in ch["selection"])
            lines += [
                f"GAN-SMMSG's choices on its validation split: base K = {ch.get('base_components_selected')}; "
                f"kept checkpoint = step {ch.get('selected_step')} (validation C2ST AUC by step — {sel})."
                + (
                    " Step 0 is the mixture start before any adversarial update: on this data set eq. 4's "
                    "training did not improve on its start, so the kept GAN-SMMSG is its mixture base plus "
                    "calibration."
                    if ch.get("selected_step") == 0
                    else ""
                ),
                "",
            ]
        rel = Path(res["img"]).relative_to("docs")
        lines += [
            f"![marginals]({rel.as_posix()})",
            "",
            "(The figure shows the models of the four that were fitted in this data set's latest run.)",
            "",
        ]
    lines += [
        "Notes on the setup (not on the numbers): every model learns on the same transformed features "
        "(a quantile map to normal scores with dequantised point masses; one-hot for discrete columns, "
        "numeric codes snapped to allowed values for the GMM), and all are conditioned on the scenario, "
        "whose proportions are the training frequencies, so *agent* is ≈ 0 for every model by "
        "construction (the paper's unconditional baselines had to learn it). All GANs sample from an EMA "
        "of the generator's weights.",
        "",
        "What GAN-SMMSG is here (seed 004 eq. 4 with α = β = 1, α decaying to 0 over the first quarter "
        "of training; instance + DeepSets group discriminator): (1) its generator starts from a "
        "GMM per scenario fitted on the training codes and learns a residual on top of it "
        '(zero at the start, `base="gmm"`); the mixture\'s size K is chosen from 10 / 20 / 30 by '
        "log-likelihood on a validation split of the training rows; and (2) after training, a **marginal calibration layer** "
        "maps each column of its raw output, per scenario, monotonically onto the training rows' "
        "marginal (quantile matching for continuous columns, a logit bias for discrete ones; fitted on "
        "training rows only, `edgetwin.generative.calibration`). The checkpoint it keeps is chosen every "
        "500 updates (start and end included) by C2ST AUC against a validation split of 10 % of the "
        "training rows, which it does not train on. The ablation rows separate what "
        "each part does: *GAN-SMMSG without calibration* is the same fitted model sampled without "
        "layer (2); *GMM + same calibration* applies layer (2) to the GMM baseline (10 components, as in the paper); "
        "*GMM with GAN-SMMSG's base K + same calibration* is GAN-SMMSG without its adversarial training "
        "(its generator at step 0, up to sampling noise): the difference to GAN-SMMSG is what eq. 4's "
        "training adds.",
        "",
    ]
    return "\n".join(lines) + "\n"


def _run_label(run: dict[str, Any] | None) -> str:
    if not run:
        return "unknown run"
    st = run.get("settings", {})
    return f"{run.get('date', '?')}: `{run.get('command', '?')}` (seed {st.get('seed')}, {st.get('n_gen', 0):,} generated agents, GAN models {st.get('steps')} generator updates)"


def _winners(res: dict[str, Any]) -> str:
    """One line naming the best model (lowest; C2ST closest to 0.5) of each column, from the numbers."""
    all_rows = res["rows"]
    rows = {k: v for k, v in all_rows.items() if k in MAIN}
    metrics: list[tuple[str, Any]] = [
        (n, lambda r, c=c: r["kl"][c]) for n, c in zip(res["paper_names"], res["paper_cols"], strict=True)
    ]
    metrics += [
        ("mean KL", lambda r: r["kl_mean"]),
        ("max KL", lambda r: r["kl_max"]),
        ("MMD²", lambda r: r["mmd"]),
        ("C2ST", lambda r: abs(r["c2st_auc"] - 0.5)),
        ("corr", lambda r: r["corr_dist"]),
    ]
    parts = []
    for name, key in metrics:
        best = min(rows, key=lambda m: key(rows[m]))
        parts.append(f"{name}: {LABELS[best]}")
    under = [c for c, v in rows.get("gan-smmsg", {}).get("kl", {}).items() if v <= 0.01]
    n_cols = len(rows.get("gan-smmsg", {}).get("kl", {}))
    tail = f" GAN-SMMSG has KL ≤ 0.01 on {len(under)} of {n_cols} profile features." if n_cols else ""
    if "gan-smmsg" in all_rows:
        a = all_rows["gan-smmsg"]["c2st_auc"]
        for key in ("gmm-cal", "gmm-base-cal", "gan-smmsg-raw"):
            if key not in all_rows:
                continue
            b = all_rows[key]["c2st_auc"]
            verdict = (
                "lower (better) than"
                if a < b - 0.01
                else "higher (worse) than"
                if a > b + 0.01
                else "within noise (±0.01) of"
            )
            tail += f" GAN-SMMSG's C2ST ({a:.3f}) is {verdict} the {LABELS[key].removeprefix('ablation: ')} ({b:.3f})."
    return "Best of the four per column (from the numbers above) — " + "; ".join(parts) + "." + tail


def write_section(md: str, path: Path) -> None:
    """Replace (or append) this benchmark's section of its page, docs/benchmarks/table1/README.md, in one write."""
    import _docs

    _docs.write_section(SECTION, md, path)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small run: fewer agents, steps and samples")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=None, help="generator updates of the GAN models")
    p.add_argument("--n-gen", type=int, default=None, help="agents to generate per model")
    p.add_argument(
        "--models",
        default="gan-smmsg,gmm,gmm-cal,gmm-base-cal,gan,wgan",
        help="comma-separated: gan-smmsg (also gives the gan-smmsg-raw ablation), gmm, gmm-cal, "
        "gmm-base-cal (needs gan-smmsg), gan, wgan",
    )
    p.add_argument("--datasets", default="cluster,alibaba")
    p.add_argument(
        "--no-write", action="store_true", help="print only; do not touch docs/benchmarks/table1/README.md or the PNGs"
    )
    p.add_argument("--json", type=Path, default=None, help="also write this run's numbers to this JSON file")
    p.add_argument(
        "--cache",
        type=Path,
        default=CACHE,
        help="directory of per-data-set result files: models not re-run keep their cached rows",
    )
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the cache")
    p.add_argument(
        "--render", action="store_true", help="fit nothing: re-render the doc section from the cache"
    )
    args = p.parse_args(argv)
    cmd = "python benchmarks/table1_population.py " + " ".join(argv if argv is not None else sys.argv[1:])
    torch.set_num_threads(1)
    steps = args.steps or (600 if args.quick else 3000)
    n_gen = args.n_gen or (20_000 if args.quick else 100_000)
    settings = {"seed": args.seed, "steps": steps, "n_gen": n_gen, "quick": args.quick}
    run = {"date": time.strftime("%Y-%m-%d %H:%M"), "command": cmd.strip(), "settings": settings}
    models = [m for m in args.models.split(",") if m]
    unknown = sorted(set(models) - (set(ORDER) - {"real"}))
    if unknown:
        raise SystemExit(f"unknown model(s) {unknown}; known: {', '.join(m for m in ORDER if m != 'real')}")
    # Quick runs are not comparable with full ones: they never touch the committed cache.
    cache = None if (args.quick or args.no_cache) else args.cache
    results = []
    for name in [] if args.render else [d for d in args.datasets.split(",") if d]:
        if name == "cluster":
            data = cluster_data(500, 10, 3, args.seed) if args.quick else cluster_data(2000, 30, 6, args.seed)
        elif name == "alibaba":
            if not ALIBABA.is_file():
                print(f"skipping alibaba: {ALIBABA} not found", file=sys.stderr)
                continue
            data = alibaba_data(args.seed, max_rows=20_000 if args.quick else None)
        else:
            raise SystemExit(f"unknown dataset {name!r}")
        new_rows = run_dataset(data, models, steps, n_gen, args.seed, run)
        res = merge_cached(data, new_rows, cache)
        gens = _GENERATED.get(name, {})
        if gens and not args.no_write:
            plot_marginals(
                data["test"],
                gens,
                data["spec"],
                data["spec"].names("profile"),
                REPO / res["img"],
                title=f"{data['title']}: held-out real vs generated ({', '.join(gens)}; run {run['date']})",
            )
        results.append(res)
    if args.json is not None:
        args.json.write_text(json.dumps({"run": run, "results": results}, indent=1, default=_json_default))
    if cache is not None:  # the doc shows every data set that has a cache, not only this run's
        names = [r["name"] for r in results]
        for f in sorted(cache.glob("*.json")):
            if f.stem not in names:
                results.append(json.loads(f.read_text()))
        order = {"cluster": 0, "alibaba": 1}
        results.sort(key=lambda r: order.get(r["name"], 9))
    md = markdown(results)
    print("\n" + md)
    if not args.no_write:
        write_section(md, REPO / "docs" / "benchmarks" / "table1" / "README.md")
        print(f"wrote {SECTION!r} in docs/benchmarks/table1/README.md")


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)


if __name__ == "__main__":
    main()
