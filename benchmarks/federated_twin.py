"""Federated twin: a twin fitted across sites without moving a raw log, against the centralised one.

Four heterogeneous sites, each its own emulated cluster (one edge site and its cloud region, its own
scenario mix, provisioning and drift), logged under uniformly random actions. Measured:

1. Federated vs centralised, same logs, same policy set as the twin-fidelity benchmark (its
   `ranking_policies`, without the PPO policy): Spearman rho and mean relative error of each twin
   against the clusters, from generated populations and replaying the evaluation days' populations.
   Both twins are the default family of `Twin.fit` (GAN-SMMSG population, MAIL responses: behaviour
   cloning then adversarial rounds; 1 member) with the same number of BC epochs, GAIL rounds and
   GAN steps, so the difference is the cost of federation; the light federated family (BC +
   mixture) is scored beside them.
2. The data-poor site: one site has a single day, the others several; on its own held-out days, the
   ranking error of (a) a twin fitted on its logs alone, (b) the federated twin, (c) the federated
   twin personalised to it (`personalise`: the federated models, proximal fine-tunings of them or
   local-only fits, chosen on held-out service groups in closed loop; then local GAIL rounds), all of the
   default family; ``--poor-hours 6``: the poor site logged only the first 6 hours of its day.
3. Bytes per site per round of each phase and in total, dense / int8 / top-k + int8 / secure
   aggregation, against the size of the site's raw log (Parquet and CSV).

Run: ``python benchmarks/federated_twin.py`` (``--quick``: fewer days and rounds; say so). Writes the
``## Federated twin`` section of docs/benchmarks/federated_twin/README.md and docs/benchmarks/federated_twin/results.json.
"""

from __future__ import annotations

import argparse
import copy
import io
import json
import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _docs import write_section  # noqa: E402
from twin_fidelity import ranking_policies, ranking_scores  # noqa: E402

from edgetwin.emulator.cluster import ClusterConfig, cluster_spec  # noqa: E402
from edgetwin.emulator.logs import generate_logs  # noqa: E402
from edgetwin.emulator.sites import default_sites  # noqa: E402
from edgetwin.federation.twin.fit import (  # noqa: E402
    CRITERIA,
    SITE_ALONE,
    FitOptions,
    personalise,
    strategy_schedule,
    validation_agents,
)
from edgetwin.federation.twin.runner import MODEL_PHASES, FederatedFitFailed, fit_federated  # noqa: E402
from edgetwin.twin.fidelity import logged_rollout  # noqa: E402
from edgetwin.twin.twin import Twin  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks" / "federated_twin"
SECTION = "## Federated twin"
#: hand-written subsections a rerun keeps (`_docs.write_section`)
KEEP = ("### What part 2 says", "### What part 4 says")
#: part 2's columns of the personalisation candidates (each rebuilt on all the site's rows)
CANDIDATE = "personalisation candidate: "


def site_configs(n_agents: int, steps: int) -> dict[str, ClusterConfig]:
    """Four heterogeneous sites: each one edge site + its cloud, its own mix, load and drift."""
    base = {s.name: s for s in default_sites()}
    edges = [base["edge-ams"], base["edge-fra"], base["edge-waw"], replace(base["edge-ams"], name="edge-lis")]
    mixes = [{"mbb": 0.6, "iot": 0.3, "iov": 0.1}, {"mbb": 0.2, "iot": 0.6, "iov": 0.2},
             {"mbb": 0.3, "iot": 0.2, "iov": 0.5}, {"mbb": 0.45, "iot": 0.35, "iov": 0.2}]
    utils = [0.35, 0.5, 0.6, 0.45]
    drifts = ["0d", "0d", "1w", "1m"]
    out = {}
    for e, mix, u, d in zip(edges, mixes, utils, drifts, strict=True):
        cloud = base[e.cloud]
        out[e.name] = ClusterConfig(n_agents=n_agents, steps=steps, sites=(replace(e, weight=1.0), cloud),
                                    scenario_weights=mix, target_util=u, drift=d)
    return out


def site_logs(cfgs: dict[str, ClusterConfig], days: dict[str, int], policy: Any, seed: int) -> dict[str, pd.DataFrame]:
    logs = {}
    for k, (name, cfg) in enumerate(cfgs.items()):
        if days.get(name, 0) < 1:
            continue
        df, _ = generate_logs(cfg, episodes=days[name], policy=policy, seed=seed + 37 * k)
        df["episode"] = name + "/" + df["episode"].astype(str)
        logs[name] = df
    return logs


def centralised(logs: dict[str, pd.DataFrame], spec: Any, o: FitOptions, bc_epochs: int) -> Twin:
    """The same model family fitted on the pooled rows (what federation must match): the default
    MAIL + GAN-SMMSG with as many BC epochs, GAIL rounds and GAN steps, or the light BC + GMM."""
    df = pd.concat(logs.values(), ignore_index=True)
    return fit_alone(df, spec, o, bc_epochs)


def fit_alone(df: pd.DataFrame, spec: Any, o: FitOptions, bc_epochs: int) -> Twin:
    """`Twin.fit` of ``o``'s family on one table, with ``bc_epochs`` behaviour-cloning epochs."""
    common = {"seed": o.seed, "members": o.members, "progress": False, "bc_epochs": bc_epochs,
              "net_arch": o.net_arch, "engine_arch": o.engine_arch}
    if not o.adversarial and not o.gan_population:
        return Twin.fit(df, spec, response_model="bc", population_model="gmm",
                        population_hyper={"n_components": o.n_components}, **common)
    return Twin.fit(df, spec, response_model="mail", population_model="gan-smmsg",
                    population_hyper={"steps": o.gan_rounds * o.gan_local_steps, **o.gan},
                    rounds=o.adv_rounds, **{**common, **o.mail})


#: columns whose means per policy and twin part 2 records beside the reward (which of them is off)
DIAG_COLUMNS = ("response.offload_ratio", "kpi.slo_violation", "state.site_util", "state.site_backlog_s",
                "state.latency_ms", "action.edge_share")


def evaluate(twins: dict[str, Twin], policies: dict[str, Any], cfgs: dict[str, ClusterConfig], eval_days: int,
             n_agents: int, steps: int, seed: int, replay_only: bool = False,
             diagnostics: list[dict[str, Any]] | None = None) -> pd.DataFrame:
    """Return of every policy on the clusters and in every twin (generated and replayed); with
    ``diagnostics``, the means of `DIAG_COLUMNS` on the cluster and in each twin's replay are
    appended to it (one record per policy and source)."""
    rows = []
    for i, (pname, pol) in enumerate(policies.items()):
        real = site_logs(cfgs, dict.fromkeys(cfgs, eval_days), pol, seed + 500 + i)
        real_df = pd.concat(real.values(), ignore_index=True)
        row = {"policy": pname, "real": float(real_df["reward"].mean())}
        if diagnostics is not None:
            diagnostics.append({"policy": pname, "source": "real",
                                **{c: float(real_df[c].mean()) for c in DIAG_COLUMNS if c in real_df}})
        for tname, tw in twins.items():
            if not replay_only:
                gen = tw.rollout(pol, episodes=2, seed=seed + 900 + i, n_agents=n_agents, steps=steps, all_members=True)
                row[f"{tname}"] = float(gen["reward"].mean())
            rep = logged_rollout(tw, pol, real_df, seed=seed + 900 + i, all_members=True)
            row[f"{tname} (replay)"] = float(rep["reward"].mean())
            if diagnostics is not None:
                diagnostics.append({"policy": pname, "source": tname,
                                    **{c: float(rep[c].mean()) for c in DIAG_COLUMNS if c in rep}})
        rows.append(row)
        print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    return pd.DataFrame(rows)


#: the weight-update options whose cost in fidelity part 4 measures (`fit_federated` keywords)
OPTIONS: dict[str, dict[str, Any]] = {
    "dense (FedAvg)": {},
    "int8": {"compression": "int8"},
    "top-k 10 % + int8": {"compression": "topk+int8"},
    "secure aggregation": {"secure": True},
    "FedAvgM": {"strategy": "fedavgm"},
    "DP (noise multiplier 1, clip 1)": {"strategy": "dp_gaussian", "dp": {"clip_norm": 1.0, "noise_multiplier": 1.0}},
}


def options_cost(logs: dict[str, pd.DataFrame], spec: Any, o: FitOptions, cfgs: dict[str, ClusterConfig],
                 eval_days: int, n_agents: int, steps: int, seed: int) -> dict[str, Any]:
    """Part 4: part 1's federated fit once per `OPTIONS` entry, on the same logs, each twin scored on
    the same days with a fresh copy of one policy set (built from the first twin, as part 1 builds
    it from one): every option faces the same policies and the same random draws, so the differences
    are the options'. Gaussian DP runs its own schedule (`DP_SCHEDULE`, what the CLI runs under DP
    when no rounds are given). Returns, per option, its scores, the bytes a site sent and the DP budget."""
    out: dict[str, Any] = {}
    pristine: dict[str, Any] | None = None
    for label, kw in OPTIONS.items():
        t0 = time.perf_counter()
        schedule = strategy_schedule(kw.get("strategy", "fedavg"))
        try:
            twin, rep = fit_federated(logs, spec, options=FitOptions.from_dict({**o.to_dict(), **schedule}), **kw)
        except FederatedFitFailed as e:
            out[label] = {"options": kw, "schedule": schedule, "diverged": str(e),
                          "fit_seconds": time.perf_counter() - t0, "load": os.getloadavg()[0]}
            print(label, "diverged:", e, flush=True)
            continue
        secs = time.perf_counter() - t0
        if pristine is None:
            pristine = copy.deepcopy(ranking_policies(spec, twin))
        rank = evaluate({label: twin}, copy.deepcopy(pristine), cfgs, eval_days, n_agents, steps, seed)
        sc = {c: ranking_scores(rank, c) for c in rank.columns if c not in ("policy", "real")}
        up = rep.secure_bytes if rep.secure else rep.bytes_up
        out[label] = {"options": kw, "schedule": schedule, "fit_seconds": secs, "load": os.getloadavg()[0],
                      "bytes_up_per_site": float(np.mean(list(up.values()))), "privacy": rep.privacy,
                      "scores": {("replay" if c.endswith("(replay)") else "generated"):
                                 {m: v[m] for m in ("spearman", "mean_rel_error", "spearman_ci90", "rel_err_ci90",
                                                    "regret_at_1")} for c, v in sc.items()}}
        print(label, json.dumps(out[label]["scores"]), flush=True)
    return out


def raw_sizes(df: pd.DataFrame) -> dict[str, int]:
    buf = io.BytesIO()
    df.to_parquet(buf, index=False)
    return {"parquet": len(buf.getvalue()), "csv": len(df.to_csv(index=False).encode())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer days and rounds (a few minutes per part)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--parts", default="1,2,3")
    ap.add_argument("--train-days", type=int, default=None, help="training days of every site but the poor one")
    ap.add_argument("--poor-hours", type=float, default=None,
                    help="part 2: the poor site logged only the first HOURS of its day (default: the whole day)")
    ap.add_argument("--hold-back", action="store_true",
                    help="part 2: the poor site keeps personalise's held-out groups out of the federation")
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--merge", action="store_true", help="keep the other parts' results from results.json")
    ap.add_argument("--markdown-only", action="store_true", help="rewrite the docs section from results.json")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.markdown_only:
        res = json.loads((OUT / "results.json").read_text())
        plot(res)
        write_section(SECTION, markdown(res, argparse.Namespace(**{**vars(args), "quick": res["args"]["quick"]})), keep=KEEP)
        return
    parts = {int(p) for p in args.parts.split(",")}
    n_agents, steps = (40, 96) if args.quick else (80, 96)
    train_days, poor_days, eval_days = (3, 1, 1) if args.quick else (7, 1, 2)
    train_days = args.train_days or train_days
    # the federated BC phase runs `FitOptions`' default schedule (many short rounds); the
    # centralised and single-site fits get whole epochs (`centralised_epochs`)
    o = FitOptions(members=1, em_iters=10 if args.quick else 20, adv_rounds=10, gan_rounds=10, gan_local_steps=50,
                   seed=args.seed)
    bc_epochs = centralised_epochs(o.to_dict(), args.quick)
    light = FitOptions.light(**{k: v for k, v in o.to_dict().items() if k not in ("response_model", "population_model")})
    cfgs = site_configs(n_agents, steps)
    spec = cluster_spec(next(iter(cfgs.values())))
    t_all = time.perf_counter()
    load0 = os.getloadavg()[0]
    results: dict[str, Any] = {"args": vars(args), "options": o.to_dict(), "sites": list(cfgs),
                               "n_agents": n_agents, "train_days": train_days, "poor_days": poor_days}
    logs = site_logs(cfgs, dict.fromkeys(cfgs, train_days), "random", args.seed)

    if 1 in parts:
        t0 = time.perf_counter()
        fed, rep = fit_federated(logs, spec, options=o, on_round=lambda r: print("round", r, flush=True))
        t_fed = time.perf_counter() - t0
        t0 = time.perf_counter()
        cen = centralised(logs, spec, o, bc_epochs)
        t_cen = time.perf_counter() - t0
        t0 = time.perf_counter()
        fed_light, _ = fit_federated(logs, spec, options=light)
        t_light = time.perf_counter() - t0
        policies = ranking_policies(spec, cen)
        rank = evaluate({"federated": fed, "centralised": cen, "federated, light family (BC + GMM)": fed_light},
                        policies, cfgs, eval_days, n_agents, steps, args.seed)
        scores = {c: ranking_scores(rank, c) for c in rank.columns if c not in ("policy", "real")}
        results["part1"] = {"options": o.to_dict(), "seed": args.seed,
                            "fit_seconds": {"federated": t_fed, "centralised": t_cen, "federated_light": t_light},
                            "policies": rank.to_dict("records"), "bytes_by_phase": rep.bytes_by_phase,
                            "phase_rounds": {ph: sum(1 for x in rep.rounds if x["phase"] == ph)
                                             for ph in {x["phase"] for x in rep.rounds}},
                            "scores": {k: {m: v[m] for m in ("spearman", "mean_rel_error", "spearman_ci90", "rel_err_ci90",
                                                             "regret_at_1")} for k, v in scores.items()},
                            "bytes_up": rep.bytes_up, "bytes_down": rep.bytes_down, "rounds": len(rep.rounds),
                            "train_days": train_days}
        print(json.dumps(results["part1"]["scores"], indent=1), flush=True)

    if 2 in parts:
        poor = list(cfgs)[0]
        days = dict.fromkeys(cfgs, train_days)
        days[poor] = poor_days
        logs2 = {k: (v[v["episode"].isin(v["episode"].unique()[:poor_days])] if k == poor else v) for k, v in logs.items()}
        key2 = "part2"
        if args.poor_hours is not None:
            # a genuinely small site: it logged only the first hours of its one day (a site that
            # came online that morning); everything else as the whole-day configuration
            ticks = max(1, int(round(args.poor_hours / 24.0 * steps)))
            logs2[poor] = logs2[poor][logs2[poor]["t"] < ticks]
            key2 = f"part2_{args.poor_hours:g}h"
        if args.seed:
            key2 = f"seed{args.seed}_{key2}"
        fed_logs = logs2
        if args.hold_back:
            # the site draws the groups `personalise` will score on before it federates and keeps
            # them back, so that no federation-derived candidate has seen them
            srt = logs2[poor].sort_values(["episode", "t", "agent"], kind="stable").reset_index(drop=True)
            fed_logs = {**logs2, poor: srt[~validation_agents(srt, 0.25, o.seed)]}
            key2 += "_holdback"
        alone = fit_alone(logs2[poor], spec, o, bc_epochs)
        fed2, _ = fit_federated(fed_logs, spec, options=o)
        # chosen on held-out service groups of the site's own log among the federated twin's
        # adaptations and the site's own twin (refitted on the kept groups to be scored), then
        # rebuilt on all its rows; every candidate is rebuilt too, to set its score beside its error
        cands: dict[str, Twin] = {}
        pers = personalise(fed2, logs2[poor], epochs=bc_epochs, local_epochs=bc_epochs, seed=o.seed,
                           site_alone=lambda d: fit_alone(d, spec, o, bc_epochs), site_alone_twin=alone, candidates=cands)
        meta = pers.meta["personalised"]
        pooled = centralised(logs2, spec, o, bc_epochs)  # diagnostic: is it federation, or pooling unlike sites?
        policies = ranking_policies(spec, alone)
        diag: list[dict[str, Any]] = []
        cand_cols = {h: f"{CANDIDATE}{h}" for h in cands if h != SITE_ALONE}
        rank2 = evaluate({"own logs alone": alone, "federated": fed2,
                          **{cand_cols[h]: cands[h] for h in cand_cols},
                          "centralised on the pooled logs (not private)": pooled}, policies,
                         {poor: cfgs[poor]}, 2, n_agents, steps, args.seed + 7, replay_only=True, diagnostics=diag)
        # the personalised twin is one of the candidates (the same object): its column is that one's
        chosen_col = "own logs alone" if meta["twin_choice"] == SITE_ALONE else cand_cols[meta["twin_choice"]]
        rank2.insert(4, "federated, personalised (replay)", rank2[f"{chosen_col} (replay)"])
        diag += [{**d, "source": "federated, personalised"} for d in diag if d["source"] == chosen_col]
        sc2 = {c: ranking_scores(rank2, c) for c in rank2.columns if c not in ("policy", "real")}
        selection = {h: {**{c: meta["twin_scores_by_criterion"][c].get(h) for c in CRITERIA},
                         "mean_rel_error": sc2[("own logs alone" if h == SITE_ALONE else cand_cols[h]) + " (replay)"][
                             "mean_rel_error"]} for h in cands}
        results[key2] = {"options": o.to_dict(), "site": poor, "policies": rank2.to_dict("records"),
                         "other_days": train_days,
                         "command": "python benchmarks/federated_twin.py " + " ".join(sys.argv[1:]),
                         "load": [load0, os.getloadavg()[0]], "minutes": (time.perf_counter() - t_all) / 60,
                         "poor_rows": len(logs2[poor]), "poor_hours": args.poor_hours or 24.0,
                         "choices": meta["choices"], "diagnostics": diag,
                         "twin_choice": meta["twin_choice"], "criterion": meta["criterion"],
                         "twin_scores": meta["twin_scores"], "selection": selection,
                         "scores": {k: {m: v[m] for m in ("spearman", "mean_rel_error", "norm_abs_error", "spearman_ci90",
                                                          "rel_err_ci90")} for k, v in sc2.items()}}
        print(json.dumps(results[key2]["scores"], indent=1), flush=True)
        if results[key2]["choices"]:
            print(pd.DataFrame(results[key2]["choices"])[["scenario", "model", "choice", "epochs"]].to_string(), flush=True)
        print("twin-level choice:", results[key2]["twin_choice"], json.dumps(selection, indent=1), flush=True)

    if 3 in parts:
        small = {k: v[v["episode"].isin(v["episode"].unique()[:1])] for k, v in logs.items()}
        o3 = replace(o, rounds=2, em_iters=3, adv_rounds=2, gan_rounds=2, gan_local_steps=10)
        rows = []
        for label, kw in (("dense", {}), ("int8", {"compression": "int8"}), ("top-k 10 % + int8", {"compression": "topk+int8"}),
                          ("secure aggregation", {"secure": True})):
            _, r3 = fit_federated(small, spec, options=o3, **kw)
            n_sites = len(r3.bytes_up)
            n_rounds = {ph: sum(1 for x in r3.rounds if x["phase"] == ph) for ph in MODEL_PHASES}
            up = r3.secure_bytes if r3.secure else r3.bytes_up
            total = float(np.mean(list(up.values())))
            # secure: the masked inputs, split over the phases as the plain bytes are
            scale = total / float(np.mean(list(r3.bytes_up.values()))) if r3.secure else 1.0
            per_round = {ph: scale * r3.bytes_by_phase.get(ph, 0) / n_sites / max(n_rounds[ph], 1) for ph in MODEL_PHASES}
            rows.append({"mode": label, "total_up_per_site": total, "rounds": len(r3.rounds), "model_rounds": n_rounds,
                         "weight_rounds": n_rounds["weights"], "weights_per_site_per_round": per_round["weights"],
                         "per_site_per_round": per_round,
                         "statistics_per_site": scale * sum(v for k, v in r3.bytes_by_phase.items()
                                                            if k not in MODEL_PHASES) / n_sites,
                         "bytes_down": r3.bytes_down, "bytes_by_phase": r3.bytes_by_phase})
            print(rows[-1], flush=True)
        results["part3"] = {"modes": rows, "raw_log_one_day": {k: raw_sizes(v) for k, v in small.items()},
                            "raw_log_train": {k: raw_sizes(v) for k, v in logs.items()}}
    if 4 in parts:
        results["part4"] = options_cost(logs, spec, o, cfgs, eval_days, n_agents, steps, args.seed)
        results["part4_seed"] = args.seed
        results["part4_options"] = o.to_dict()
    results["minutes"] = (time.perf_counter() - t_all) / 60
    if args.merge and (OUT / "results.json").is_file():
        old = json.loads((OUT / "results.json").read_text())
        for k in old:
            if (k.startswith(("part", "seed")) or k in ("previous_part2", "before_schedule_change")) and k not in results:
                if k == "part4" and "part4_options" not in old:  # run before the options were recorded
                    results["part4_options"] = old.get("options", {})
                results[k] = old[k]
        results["minutes"] += float(old.get("minutes", 0.0))
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "results.json").write_text(json.dumps(results, indent=1, default=str))
    plot(results)
    md = markdown(results, args)
    print(md)
    if not args.no_write:
        write_section(SECTION, md, keep=KEEP)


def plot(res: dict[str, Any]) -> Path | None:
    """Real vs twin returns per policy, parts 1 and 2 (docs/benchmarks/federated_twin/ranking.png)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [(k, t) for k, t in (("part1", "1. all sites"), ("part2", "2. the data-poor site (1 day)"),
                                  ("part2_6h", "2. the data-poor site (6 hours)")) if k in res]
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 5), squeeze=False)
    for ax, (k, title) in zip(axes[0], panels, strict=True):
        df = pd.DataFrame(res[k]["policies"])
        for col in [c for c in df.columns if c not in ("policy", "real")]:
            ax.scatter(df["real"], df[col], label=col, s=18)
        lo, hi = float(df.drop(columns="policy").min().min()), float(df.drop(columns="policy").max().max())
        ax.plot([lo, hi], [lo, hi], "k--", lw=0.8)
        ax.set_xlabel("return on the emulated cluster")
        ax.set_ylabel("return in the twin")
        ax.set_title(title)
        ax.legend(fontsize=7)
    fig.tight_layout()
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / "ranking.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def schedule(o: dict[str, Any], short: bool = False) -> str:
    """The federated behaviour-cloning schedule of a run's `FitOptions` (as stored in results.json)."""
    if o.get("local_steps"):
        if short:
            return f"{o['rounds']} x {o['local_steps']} steps"
        return (f"{o['rounds']} FedAvg rounds x {o['local_steps']} minibatches per site and model"
                + (", Adam state kept between rounds" if o.get("keep_optimizer") else ""))
    if short:
        return f"{o.get('rounds')} x {o.get('local_epochs')} epochs"
    return f"{o.get('rounds')} FedAvg rounds x {o.get('local_epochs')} BC epochs per site"


def centralised_epochs(o: dict[str, Any], quick: bool) -> int:
    """The centralised and single-site fits' BC epochs for a run's federated options: as many as the
    federated whole-epoch rounds add up to, else 12 (quick) or 20 (`Twin.fit`'s default)."""
    return int(o.get("rounds", 0) * o.get("local_epochs", 0)) if not o.get("local_steps") else (12 if quick else 20)


def markdown(res: dict[str, Any], args: argparse.Namespace) -> str:
    o = res.get("options", {})
    fam = (f"GAN-SMMSG population ({o.get('gan_rounds')} rounds x {o.get('gan_local_steps')} steps per site; centralised: "
           f"the same {o.get('gan_rounds', 0) * o.get('gan_local_steps', 0)} steps), MAIL responses ({schedule(o)}, "
           f"then {o.get('adv_rounds')} adversarial rounds; centralised: {centralised_epochs(o, args.quick)} BC epochs, "
           f"{o.get('adv_rounds')} GAIL rounds), 1 member. Runs of an earlier schedule say so where they are shown")
    L = [SECTION, "", f"Command: `python benchmarks/federated_twin.py{' --quick' if args.quick else ''} --parts 1 --seed {args.seed}` "
         "and `--quick --parts 2,3 --train-days 7` "
         "(2 shared CPU cores; part 1 last run on 2026-11-27 with `--merge --no-write`, 45 min on a machine shared "
         "by about 7 sessions, so its fit seconds are not comparable with earlier runs'; "
         f"part 2's runs and their commands below). {len(res['sites'])} sites, each an emulated cluster with one "
         f"edge site and its cloud ({', '.join(res['sites'])}), its own scenario mix, load (target utilisation 0.35-0.6) "
         f"and drift (0d / 0d / 1w / 1m); {res['n_agents']} service groups, logged under random actions, "
         f"{res.get('part1', {}).get('train_days', res['train_days'])} training days per site in part 1. No public system fits a simulator federatedly, so there is no "
         "paper number to put beside these; the yardstick is the centralised twin of **the same default family as "
         f"`Twin.fit`** on the pooled logs: {fam}. What the federated fit does differently, each because it would need "
         "rows in one place: the population encoding is the standard one from pooled moments (not the quantile map), "
         "no marginal calibration layer, no checkpoint selection on a validation split, no EMA generator; each site's "
         "GAIL training world is populated from its own logged profiles (centrally: from the GAN)."
         + (" **Quick variant**: 40 service groups, fewer BC rounds and EM iterations, 1 evaluation day per site and "
            "policy; part 1 with fewer days than the issue's week per site." if args.quick else ""), ""]
    if "part1" in res:
        p = res["part1"]
        fs = p["fit_seconds"]
        L += ["### 1. Federated vs centralised", "",
              f"Federated behaviour cloning: {schedule(p.get('options', o))}. "
              f"Fit: federated {fs['federated']:.0f} s ({p['rounds']} rounds over the in-process bus, the 4 sites' "
              f"local work done one after the other on this machine), centralised {fs['centralised']:.0f} s"
              + (f", federated light family {fs['federated_light']:.0f} s" if "federated_light" in fs else "")
              + ". Policies: the twin-fidelity set without PPO.", "",
              "| twin | Spearman ρ (90 % CI) | mean relative error (90 % CI) | regret@1 |", "|---|---|---|---|"]
        for k, v in p["scores"].items():
            L.append(f"| {k} | {v['spearman']:.2f} ({v['spearman_ci90'][0]:.2f}-{v['spearman_ci90'][1]:.2f}) | "
                     f"{100 * v['mean_rel_error']:.0f} % ({100 * v['rel_err_ci90'][0]:.0f}-{100 * v['rel_err_ci90'][1]:.0f}) | "
                     f"{v['regret_at_1']:.2f} |")
        f, c = p["scores"]["federated"], p["scores"]["centralised"]
        fr, cr = p["scores"]["federated (replay)"], p["scores"]["centralised (replay)"]
        L += ["", f"Target: within 0.05 of ρ and 5 points of error. Generated populations: Δρ = "
              f"{f['spearman'] - c['spearman']:+.2f}, Δerror = {100 * (f['mean_rel_error'] - c['mean_rel_error']):+.1f} points; "
              f"replaying the evaluation days: Δρ = {fr['spearman'] - cr['spearman']:+.2f}, Δerror = "
              f"{100 * (fr['mean_rel_error'] - cr['mean_rel_error']):+.1f} points. With 11 policies the intervals are "
              "wide: an earlier run of the same configuration whose in-process sites drew from shared random "
              "generators in racing threads (fixed since; the fit is now deterministic) gave the federated twin "
              "ρ 0.74 / 14 % and the light family 0.95 / 15 % on generated populations (replay 0.92 / 8 % and "
              "0.89 / 8 %): differences below ~0.2 in ρ on generated populations are within run-to-run noise."]
        seeds = {int(p.get("seed", 0)): p, **{int(k[4:].split("_")[0]): res[k] for k in sorted(res) if k.startswith("seed") and k.endswith("_part1")}}
        if len(seeds) > 1:
            L += ["", "Per seed (other logs, fits and policy sets; `--parts 1 --seed S`), federated minus centralised:", "",
                  "| seed | generated: Δρ | Δerror | replay: Δρ | Δerror | centralised, generated: ρ / error |",
                  "|---|---:|---:|---:|---:|---|"]
            deltas = []
            for sd, q in sorted(seeds.items()):
                sc = q["scores"]
                d = [sc["federated"]["spearman"] - sc["centralised"]["spearman"],
                     100 * (sc["federated"]["mean_rel_error"] - sc["centralised"]["mean_rel_error"]),
                     sc["federated (replay)"]["spearman"] - sc["centralised (replay)"]["spearman"],
                     100 * (sc["federated (replay)"]["mean_rel_error"] - sc["centralised (replay)"]["mean_rel_error"])]
                deltas.append(d)
                L.append(f"| {sd} | {d[0]:+.2f} | {d[1]:+.1f} | {d[2]:+.2f} | {d[3]:+.1f} | "
                         f"{sc['centralised']['spearman']:.2f} / {100 * sc['centralised']['mean_rel_error']:.0f} % |")
            m = np.mean(deltas, axis=0)
            L.append(f"| mean | {m[0]:+.2f} | {m[1]:+.1f} | {m[2]:+.2f} | {m[3]:+.1f} | |")
        b1 = res.get("before_schedule_change", {}).get("part1")
        if b1 and b1["options"].get("local_steps") != p.get("options", {}).get("local_steps"):
            L += ["", f"The same run before the federated behaviour-cloning schedule changed ({schedule(b1['options'])}): "
                  + "; ".join(f"{k} ρ {v['spearman']:.2f} / {100 * v['mean_rel_error']:.0f} %" for k, v in b1["scores"].items()
                              if k.startswith("federated")) + "."]
        L.append("")
    p2 = [k for k in ("part2", *sorted(k for k in res if k.startswith("part2_"))) if k in res]
    if p2:
        L += ["### 2. The data-poor site", "",
              "Site edge-ams has 1 day of logs, the others "
              f"{res[p2[0]].get('other_days', res['train_days'])}; every twin is scored on 2 held-out days of that site, "
              "replaying their populations (so the site's own agents and capacity are simulated and only the response "
              "model differs). Every twin is of the default family. **Personalised** (`personalise`, at the site, "
              "nothing travels): a quarter of the site's service groups is held out; for each scenario's client and "
              "engine model the candidates are the federated model, proximal fine-tuning from it "
              "(`mu/2 ||θ - θ_fed||²`, mu in {0, 0.1, 1, 10}, FedProx/Ditto style) and a fit of the site's rows alone "
              "(epochs chosen on the one-step likelihood of a second quarter of the groups). Four twins compete, all fitted "
              "without the held-out groups: three assembled from those models (all federated; per model the best one-step "
              "candidate; all local), each with as many local GAIL rounds as the fit had, and the site's own twin "
              "(`fit_alone` on the kept groups: `Twin.fit`, GAIL included). Each runs the site's day in closed loop "
              "under its cloned logging policy; the one whose mean outputs and reward on the held-out groups are "
              "closest to the logged ones (in logged standard deviations) is rebuilt on all the site's rows (the "
              "site's own twin: the row 'own logs alone' itself). Only the site's own logged day is used to choose; "
              "the held-out days below are not. Every candidate is also rebuilt on all rows and scored on the "
              "held-out days (rows 'personalisation candidate'), to check the criterion. Two configurations: the issue's (a whole day "
              "of 40 service groups, 3,840 rows), and a genuinely small site, chosen before measuring and kept "
              "whichever way it came out: the same site logged only the first 6 hours of its day (a site that came "
              "online that morning; 960 rows, night hours only), everything else identical.", ""]
        for key in p2:
            p = res[key]
            hours = float(p.get("poor_hours", 24.0))
            label = "whole day (the issue's configuration)" if hours >= 24 else f"first {hours:g} hours of the day only"
            if key.endswith("_holdback"):
                label = "whole day, the site's held-out groups kept out of the federation (`--hold-back`)"
            run = (f" `{p['command']}`, 2 shared cores, load {p['load'][0]:.0f} at the start and {p['load'][1]:.0f} at the end, "
                   f"{p['minutes']:.0f} min" if "command" in p else "")
            L += [f"**{label}** ({p.get('poor_rows', '?')} rows of the site;{run}; federated behaviour cloning: "
                  f"{schedule(p.get('options', o))}):", "",
                  "| twin | Spearman ρ | mean relative error (90 % CI) | normalised abs. error |", "|---|---|---|---|"]
            for k, v in p["scores"].items():
                ci = v.get("rel_err_ci90")
                ci_s = f" ({100 * ci[0]:.1f}-{100 * ci[1]:.1f})" if ci else ""
                L.append(f"| {k} | {v['spearman']:.2f} | {100 * v['mean_rel_error']:.1f} %{ci_s} | {v['norm_abs_error']:.2f} |")
            sc = p["scores"]
            a = sc["own logs alone (replay)"]["mean_rel_error"]
            cands = {k.removesuffix(" (replay)"): v["mean_rel_error"] for k, v in sc.items()
                     if k.startswith("federated") and "pooled" not in k}
            bname = min(cands, key=cands.__getitem__)
            b = cands[bname]
            gain = 100 * (1 - b / a) if a > 0 else 0.0
            ch = pd.DataFrame(p.get("choices", []))
            if "selection" in p:
                L += ["", f"Twin-level choice: **{p['twin_choice']}** (criterion: {p.get('criterion', 'closed loop')}; "
                      "selection scores of every candidate beside its real error below)."]
            elif "twin_choice" in p:
                sc_ = ", ".join(f"{k} {v:.3f}" for k, v in p["twin_scores"].items())
                L += ["", f"Twin-level choice: **{p['twin_choice']}** (closed-loop error on the held-out groups: {sc_})."]
            if len(ch):
                counts = ch.groupby(["model", "choice"]).size()
                summary = "; ".join(f"{m}s: " + ", ".join(f"{c} {n}" for (mm, c), n in counts.items() if mm == m)
                                    for m in ("client", "engine"))
                L += ["", f"Chosen per scenario on the held-out groups ({summary})."]
            prev = res.get("previous_part2", {}).get("scores", {}).get("federated, personalised (replay)")
            if key == "part2" and prev is not None:
                L += ["", f"Before this personalisation (4 BC epochs from the federated weights, then the local GAIL "
                      f"rounds; same seed and logs): ρ {prev['spearman']:.2f}, {100 * prev['mean_rel_error']:.1f} % error."]
            pe = sc.get("federated, personalised (replay)", {}).get("mean_rel_error", float("nan"))
            L += ["", f"Target: (b) or (c) at least 30 % lower error than (a): best {bname} {100 * b:.1f} % vs "
                  f"{100 * a:.1f} % ({abs(gain):.0f} % {'lower' if gain >= 0 else 'higher'}: "
                  f"{'met' if gain >= 30 else 'missed'}). Personalised no worse than the site alone: "
                  f"{100 * pe:.1f} % vs {100 * a:.1f} % ({'holds' if pe <= a + 1e-12 else 'does not hold'}).", ""]
        # by seed, then whole day / fewer hours / hold-back (results.json's order is that of the --merge runs)
        other = sorted(((k, v) for k, v in res.items() if k.startswith("seed") and "part2" in k),
                       key=lambda kv: (int(kv[0][4:].split("_", 1)[0]), -float(kv[1].get("poor_hours", 24.0)),
                                       kv[0].endswith("_holdback")))
        if other:
            names = [n for n in other[0][1]["scores"] if not n.startswith(CANDIDATE)]
            L += ["Other seeds (everything redrawn: logs, fits, held-out days), mean relative error (90 % CI; ρ):", "",
                  "| run | federated BC | " + " | ".join(n.removesuffix(" (replay)") for n in names) + " | choice |",
                  "|---|---|" + "---|" * (len(names) + 1)]
            for k, v in other:
                L.append(f"| `{v.get('command', k)}` | {schedule(v.get('options', o), short=True)} | " + " | ".join(
                    f"{100 * v['scores'][n]['mean_rel_error']:.1f} % ({100 * v['scores'][n]['rel_err_ci90'][0]:.1f}-"
                    f"{100 * v['scores'][n]['rel_err_ci90'][1]:.1f}; ρ {v['scores'][n]['spearman']:.2f})"
                    if n in v["scores"] else "-" for n in names) + f" | {v.get('twin_choice', '-')} |")
            L.append("")
        runs = [(k, res[k]) for k in p2] + other
        if any("selection" in v for _, v in runs):
            crit = list(CRITERIA)
            L += ["Does the selection score predict the error on the held-out days? Per run, every candidate's "
                  "closed-loop score on the site's held-out groups of its logged day (fitted without them; lower is "
                  "better; the first is the criterion used) beside its mean relative error on the 2 held-out days "
                  "(rebuilt on all the site's rows). **bold**: chosen.", "",
                  "| run | candidate | " + " | ".join(crit) + " | real mean relative error |",
                  "|---|---|" + "---|" * (len(crit) + 1)]
            for k, v in runs:
                for h, r in v.get("selection", {}).items():
                    name = f"**{h}**" if h == v.get("twin_choice") else h
                    cells = " | ".join("-" if r.get(c) is None else f"{r[c]:.4f}" for c in crit)
                    L.append(f"| {v.get('command', k).removeprefix('python benchmarks/federated_twin.py ')} | {name} | "
                             f"{cells} | {100 * r['mean_rel_error']:.1f} % |")
            L.append("")
        diag = pd.DataFrame(res[p2[0]].get("diagnostics", []))
        if len(diag):
            pick = [q for q in ("all edge, cap 1, price .5", "all cloud, cap 1, price .5", "heuristic (SLO-aware)")
                    if q in set(diag["policy"])]
            cols = [c for c in DIAG_COLUMNS if c in diag.columns and c not in ("action.edge_share", "state.site_backlog_s")]
            L += ["Where the federated twin is off on this site (whole-day configuration; means over the replayed "
                  "days, real cluster first):", "",
                  "| policy | source | " + " | ".join(c.split(".", 1)[1] for c in cols) + " |",
                  "|---|---|" + "---|" * len(cols)]
            for q in pick:
                for _, r in diag[diag["policy"] == q].iterrows():
                    if "selection only" in r["source"] or r["source"].startswith(CANDIDATE):
                        continue
                    L.append(f"| {q} | {r['source']} | " + " | ".join(f"{r[c]:.3g}" for c in cols) + " |")
            L.append("")
    before = res.get("before_schedule_change", {})
    if before:
        L += ["**The same runs before and after the federated behaviour-cloning schedule changed** (the runs before: "
              f"{schedule(next(iter(before.values()))['options'])}; after: {schedule(o)}; same seeds, logs, policies "
              "and held-out days; mean relative error, ρ in brackets):", "",
              "| run | federated: before | after | federated, personalised: before | after | own logs alone |",
              "|---|---|---|---|---|---|"]
        def order(k: str) -> tuple[bool, int]:  # whole day first, then by seed
            return ("_6h" in k, int(k[4:].split("_", 1)[0]) if k.startswith("seed") else 0)

        for k, b in sorted(before.items(), key=lambda kv: order(kv[0])):
            a = res.get(k, {})
            if k == "part1":
                continue  # in part 1's own paragraph
            if not a or a.get("options", {}).get("local_steps") == b["options"].get("local_steps"):
                continue  # not rerun on the new schedule

            def cell(sc: dict[str, Any], name: str) -> str:
                v = sc.get(name)
                return "-" if v is None else f"{100 * v['mean_rel_error']:.1f} % ({v['spearman']:.2f})"

            names = ("federated (replay)", "federated, personalised (replay)", "own logs alone (replay)")
            cells = [cell(b["scores"], names[0]), cell(a["scores"], names[0]), cell(b["scores"], names[1]),
                     cell(a["scores"], names[1]), cell(a["scores"], names[2])]
            label = f"`{a.get('command', k).removeprefix('python benchmarks/federated_twin.py ')}`"
            L.append(f"| {label} | " + " | ".join(cells) + " |")
        L.append("")
    if "part3" in res:
        p = res["part3"]
        raw = np.mean([v["parquet"] for v in p["raw_log_one_day"].values()])
        raw_csv = np.mean([v["csv"] for v in p["raw_log_one_day"].values()])
        raw_w = np.mean([v["parquet"] for v in p["raw_log_train"].values()])
        L += ["### 3. Bytes", "", "Measured on a small fit of the default family (one day per site, 2 rounds of each "
              "model phase, 3 EM iterations); what a site sends does not depend on how many rows it has: per model "
              "round it is one delta of the models (BC `weights`: engine and client policies; `adversarial`: client "
              "actor-critics and discriminators; `population`: generator, instance and set discriminators), per "
              "statistics phase a vector whose size the spec and the models fix. A whole fit sends "
              "`statistics + Σ rounds x per-round bytes` per site. "
              f"A site's raw log: {raw / 1e3:.0f} kB Parquet ({raw_csv / 1e3:.0f} kB CSV) per day; "
              f"{raw_w / 1e3:.0f} kB Parquet for its {res['train_days']} training days.", "",
              "| uplink | BC weights, per site per round | adversarial, per site per round | population, per site per round "
              "| statistics phases, per site | this whole fit, per site | tasks downlink (all sites read them) |",
              "|---|---|---|---|---|---|---|"]
        for r in p["modes"]:
            pr = r.get("per_site_per_round", {"weights": r.get("weights_per_site_per_round", float("nan"))})
            cell = [f"{pr.get(ph, float('nan')) / 1e3:.0f} kB" for ph in ("weights", "adversarial", "population")]
            L.append(f"| {r['mode']} | {' | '.join(cell)} | {r.get('statistics_per_site', float('nan')) / 1e3:.0f} kB | "
                     f"{r['total_up_per_site'] / 1e3:.0f} kB | {r['bytes_down'] / 1e3:.0f} kB |")
        if "part1" in res:
            b1 = np.mean(list(res["part1"]["bytes_up"].values()))
            n_sites = len(res["part1"]["bytes_up"])
            byp = res["part1"].get("bytes_by_phase", {})
            pr_ = res["part1"].get("phase_rounds", {})
            split = ", ".join(f"{ph} {byp[ph] / n_sites / 1e3:.0f} kB ({pr_.get(ph, '?')} rounds)" for ph in
                              ("weights", "adversarial", "population") if ph in byp)
            L += ["", f"At the size of part 1 ({res['part1']['rounds']} rounds, dense) each site sent {b1 / 1e3:,.0f} kB in "
                  f"all ({split}), for {res['part1'].get('train_days', '?')} days of raw log "
                  f"(~{raw * res['part1'].get('train_days', 1) / 1e3:,.0f} kB Parquet); the coordinator's tasks came to "
                  f"{res['part1']['bytes_down'] / 1e3:,.0f} kB."]
        L += ["", "Secure aggregation: the masked inputs are 64-bit fixed point (twice the float32 bytes) plus the key "
              "shares; the protocol runs in-process at the coordinator (as in the policy federation), so these are the "
              "bytes a deployed protocol would send, computed from its transcript. Compression applies to the model "
              "deltas only (statistics are sums and must stay exact).", ""]
    if "part4" in res:
        L += ["### 4. What the weight-update options cost in fidelity", "",
              f"Part 1's federated fit (the same logs, {len(res['part4'])} options, seed "
              f"{res.get('part4_seed', 0)}; federated behaviour cloning: {schedule(res.get('part4_options', o))}), "
              "once per option; "
              "every twin is scored on the same days with a fresh copy of one policy set (the same policies and the same "
              "random draws), so the differences are the options' (`--parts 4`). Bytes: what a site sent in the whole fit "
              "(secure aggregation: its masked inputs and key shares). ε: the RDP accountant's, summed over the three model "
              "phases, at δ = 1e-5.", "",
              "| option | bytes up per site | ε | Spearman ρ (90 % CI) | mean relative error (90 % CI) | replay: ρ | replay: error |",
              "|---|---:|---:|---|---|---:|---|"]
        noise: list[str] = []
        for label, d in res["part4"].items():
            if d.get("schedule"):  # an option with its own behaviour-cloning schedule (DP)
                label = f"{label}, {schedule({**res.get('part4_options', o), **d['schedule']})}"
            if "diverged" in d:  # the fit stopped: its models were no longer finite, or its sites failed
                L.append(f"| {label} | - | - | fit stopped: {d['diverged']} | | | |")
                continue
            nts = d["privacy"].get("noise_to_signal", {})
            if nts:
                noise.append(f"{label}: " + ", ".join(f"{k} {v:,.0f}x" for k, v in nts.items()))
            g, r = d["scores"]["generated"], d["scores"]["replay"]
            eps = d["privacy"].get("epsilon")
            L.append(f"| {label} | {d['bytes_up_per_site'] / 1e3:,.0f} kB | {'-' if eps is None else f'{eps:.1f}'} | "
                     f"{g['spearman']:.2f} ({g['spearman_ci90'][0]:.2f}-{g['spearman_ci90'][1]:.2f}) | "
                     f"{100 * g['mean_rel_error']:.1f} % ({100 * g['rel_err_ci90'][0]:.1f}-{100 * g['rel_err_ci90'][1]:.1f}) | "
                     f"{r['spearman']:.2f} | {100 * r['mean_rel_error']:.1f} % ({100 * r['rel_err_ci90'][0]:.1f}-"
                     f"{100 * r['rel_err_ci90'][1]:.1f}) |")
        L.append("")
        if noise:
            L += ["How much larger each round's DP noise was than the largest update it protects (the noise's norm on "
                  "the mean, z C sqrt(D) / n, over C): " + "; ".join(noise) + ".", ""]
    L += ["![real vs twin returns per policy](benchmarks/federated_twin/ranking.png)", ""]
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    main()
