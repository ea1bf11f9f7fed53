"""A randomized-saturation canary against the twin's interference term, simulated before any verdict run
(issue 48; `benchmarks/closed_loop.py --saturation --designs-fleet 1000`).

**What it is for.** The verdict's estimand is the fleet-wide effect of switching every group, averaged
over the days the decision lives with. A canary with a few per cent of the groups on the candidate
measures the candidate's effect *at that share*; what the full switch adds (congestion of the edge sites
when every group sends work there: the interference) no such canary measures, so the loop takes it from
the twin and carries the twin's uncertainty about it (`edgetwin.loop.ppi.interference_var`: its members'
spread). A randomized-saturation design (Hudgens & Halloran 2008; Baird, Bohren, McIntosh & Özler 2018)
spends the same candidate share differently: each site gets its own candidate share, drawn at random
(here ``s̄ × (0, 1, 2)`` over the 3 edge sites, a random permutation, ``s̄`` the candidate arm's 5 %: the
same expected share × hours × loss), and the control groups' outcome against their site's share
estimates the spillover per unit share ``β``. Prediction-powered, the twin predicts the same slope and
the rectifier is observed − predicted; the full switch's interference is the twin's plus
``(1 − s̄)·(β̂ − β_twin)``, whose variance ``(1 − s̄)²·Var(β̂)`` (an OLS slope over the sites' control
means, ``K − 2`` degrees of freedom) replaces the members' spread.

**The simulation** (`saturation_comparison`): `coverage_experiment`'s construction (the emulator's
per-group SLO-violation rates of ``--days`` days at ``--designs-fleet`` groups, a twin 20 % wrong per
group and 5 points optimistic on the effect, the day-to-day term from 6 other days), two designs on the
same canaries, both with the rest of the fleet as control and a CUPED slope per arm:

* ``twin``: a uniformly random candidate arm of ``s̄`` of the fleet; the interference term is the twin's
  members' spread: a relative sd of ``interference_sd`` of the baseline level on ``members − 1``
  degrees of freedom (3 members; the sd is `members_interference_sd`: the median over the loop's own
  first-day canaries at 1,000 groups of the SLO-violation pairs' interference term, read from the
  stored levers runs);
* ``saturation``: the candidate arm drawn per site at the site's saturation; the interference term is
  the measured slope's, as above.

No interference is simulated (A/A and the regressing candidate as in the design tables): the question
is only how wide each design's interval is when it has to say how large the interference is.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np

#: the candidate shares per site, in units of the candidate arm's share (a random permutation per canary)
SATURATIONS = (0.0, 1.0, 2.0)
MEMBERS = 3


def members_interference_sd(levers_dir: Path, kpi: str = "kpi.slo_violation", lever: str = "fleet_control_per_arm") -> float:
    """The twin members' interference term as a relative sd of the baseline level: the median over the
    stored levers runs' first-day canaries (``levers_seed*.json``: each pair's interference half-width
    at the look's level and degrees of freedom, divided by that t quantile) of ``kpi``'s pairs."""
    from scipy import stats

    sds = []
    for path in sorted(levers_dir.glob("levers_seed*.json")):
        d = json.loads(path.read_text())
        for c in d["candidates"].values():
            v = (c["levers"].get(lever) or {}).get(kpi) or {}
            if v.get("interference") is not None and v.get("df") is not None:
                sds.append(v["interference"] / float(stats.t.ppf(0.5 + d["level"] / 2, v["df"])))
    if not sds:
        raise SystemExit(f"no stored levers run under {levers_dir} to read the members' interference term from")
    return float(np.median(sds))


def site_slope(r: np.ndarray, site: np.ndarray, share: dict[str, float]) -> tuple[float, float, float]:
    """The OLS slope of the sites' mean ``r`` (the control groups' rectified outcome) on the sites'
    candidate share: ``(β̂, Var(β̂), degrees of freedom K − 2)``; ``Var`` is infinite with fewer than 3
    sites or no spread of the shares (no slope can be measured)."""
    names = sorted(share)
    s = np.array([share[k] for k in names])
    m = np.array([float(np.mean(r[site == k])) if np.any(site == k) else np.nan for k in names])
    ok = np.isfinite(m)
    s, m = s[ok], m[ok]
    sxx = float(np.sum((s - s.mean()) ** 2))
    if len(s) < 3 or sxx <= 0:
        return 0.0, float("inf"), 0.0
    beta = float(np.sum((s - s.mean()) * (m - m.mean())) / sxx)
    resid = m - m.mean() - beta * (s - s.mean())
    return beta, float(np.sum(resid**2) / (len(s) - 2)) / sxx, float(len(s) - 2)


def saturation_comparison(days_data: list[dict[str, Any]], runs: int, seed: int, share: float = 0.05,
                          interference_sd: float = 0.0, members: int = MEMBERS) -> dict[str, Any]:
    """Per design (``twin``, ``saturation``) and candidate type (A/A, regressing): the median width of
    the 90 % interval of the relative change, its coverage of the truth and the share decided, on
    ``runs`` simulated canaries (module docstring). ``days_data``: `closed_loop._emulated_days` with
    ``site``."""
    from closed_loop import COVERAGE_TYPES, MARGIN
    from scipy.stats import binomtest

    from edgetwin.contract.margins import KPIMargin
    from edgetwin.loop.ppi import LEVEL, ppi_mean_difference, ppi_verdict

    rng = np.random.default_rng([seed, 4848])
    margin = [KPIMargin("kpi.slo_violation", MARGIN)]
    out: dict[str, Any] = {"twin": {}, "saturation": {}}
    slopes: list[float] = []
    for name in ("aa", "regressing"):
        delta = COVERAGE_TYPES[name]
        u = rng.normal(0.0, 0.02, len(days_data)) if delta else np.zeros(len(days_data))
        worlds = []
        for d, dd in enumerate(days_data):
            y = dd["y"]
            v = rng.normal(0.0, 0.10, len(y)) if delta else np.zeros(len(y))
            fb = y * np.exp(rng.normal(0.0, 0.2, len(y)))
            worlds.append((y, y * (1.0 + delta + u[d] + v), fb, fb * (1.0 + delta - 0.05), dd["x"], dd["site"]))
        truth = float(sum(w[1].sum() for w in worlds) / sum(w[0].sum() for w in worlds) - 1.0)
        got: dict[str, list[tuple[float, bool, str]]] = {"twin": [], "saturation": []}
        for _ in range(runs):
            d = int(rng.integers(len(days_data)))
            y, yc, fb, fc, x, site = worlds[d]
            n = len(y)
            others = [worlds[j] for j in rng.choice([j for j in range(len(days_data)) if j != d], 6, replace=False)]
            day = (float(np.var([np.mean(w[3] - w[2]) for w in others], ddof=1)),
                   float(np.var([np.mean(w[2]) for w in others], ddof=1)))  # fmt: skip
            n_c = max(2, int(round(share * n)))
            arms = {"twin": rng.choice(n, n_c, replace=False)}
            names = sorted(set(site.tolist()))
            sat = dict(zip(names, share * rng.permutation(np.array(SATURATIONS[: len(names)])), strict=True))
            arms["saturation"] = np.concatenate([rng.permutation(np.flatnonzero(site == k))[: int(round(sat[k] * np.sum(site == k)))]
                                                 for k in names])  # fmt: skip
            for design, cand in arms.items():
                ctrl = np.setdiff1d(np.arange(n), cand)
                if design == "twin":
                    tv, tdf, shift = ((interference_sd * float(np.mean(fb))) ** 2, 0.0), float(members - 1), 0.0
                else:  # the measured spillover slope, rectified against the twin's (0: no interference predicted)
                    s_bar = len(cand) / n
                    rb = y[ctrl] - fb[ctrl]
                    xb = x[ctrl] - x[ctrl].mean()
                    rb = rb - float(np.sum(xb * rb) / max(np.sum(xb * xb), 1e-300)) * xb
                    beta, var_b, tdf = site_slope(rb, site[ctrl], sat)
                    slopes.append(beta)
                    tv, shift = ((1.0 - s_bar) ** 2 * var_b, 0.0), (1.0 - s_bar) * beta
                e = ppi_mean_difference(fc, fb, yc[cand], fc[cand], y[ctrl], fb[ctrl], LEVEL, x_cand=x[cand],
                                        x_ctrl=x[ctrl], transport_var=tv, transport_df=tdf, day_var=day, day_df=5.0,
                                        cuped="per_arm")  # fmt: skip
                if shift:
                    e = {**e, "rel": e["rel"] + shift / abs(e["base"]), "rel_lo": e["rel_lo"] + shift / abs(e["base"]),
                         "rel_hi": e["rel_hi"] + shift / abs(e["base"])}  # fmt: skip
                e.update(n_fleet=float(n), n_candidate=float(len(cand)), n_control=float(len(ctrl)))
                verdict, checks = ppi_verdict({"kpi.slo_violation": e}, margin)
                lo, hi = checks[0].interval
                got[design].append((hi - lo, lo <= truth <= hi, verdict))
        for design, rows in got.items():
            cov = sum(c for _, c, _ in rows)
            w = np.array([wd for wd, _, _ in rows])
            out[design][name] = {
                "truth": truth, "median_width": float(np.median(w[np.isfinite(w)])) if np.isfinite(w).any() else float("inf"),
                "infinite_widths": int((~np.isfinite(w)).sum()), "coverage": cov / len(rows),
                "coverage_ci": list(binomtest(cov, len(rows)).proportion_ci(0.95, "exact")),
                "decided": sum(v in ("promote", "refuse") for _, _, v in rows) / len(rows),
            }  # fmt: skip
    out["settings"] = {"runs": runs, "seed": seed, "share": share, "saturations": list(SATURATIONS),
                       "interference_sd": interference_sd, "members": members, "n": len(days_data[0]["y"]),
                       "days": len(days_data), "slope_sd": float(np.std(slopes)) if slopes else None}  # fmt: skip
    return out


def site_share_of_residual(days_data: list[dict[str, Any]]) -> dict[str, float]:
    """How much a candidate arm stratified by site could narrow the group split: per emulated day, the
    share of the groups' CUPED-adjusted outcome variance (``y − b·x``, one slope) that their site's mean
    explains (a stratified arm removes that share of the own term's variance, at best). Median,
    minimum and maximum over the days."""
    shares = []
    for d in days_data:
        y, x, site = (np.asarray(d[k]) for k in ("y", "x", "site"))
        ok = np.isfinite(y) & np.isfinite(x.astype(float))
        y, x, site = y[ok].astype(float), x[ok].astype(float), site[ok]
        r = y - float(np.cov(x, y)[0, 1] / max(np.var(x, ddof=1), 1e-300)) * x
        means = {k: float(np.mean(r[site == k])) for k in set(site.tolist())}
        within = r - np.array([means[k] for k in site])
        shares.append(1.0 - float(np.var(within)) / max(float(np.var(r)), 1e-300))
    return {"median": float(np.median(shares)), "min": float(np.min(shares)), "max": float(np.max(shares)),
            "days": len(shares)}  # fmt: skip


def update_narrowing(scale_dir: Path, n: int = 1000) -> dict[str, Any]:
    """Does `Twin.update` after each canary look narrow the members' disagreement about the interference?
    Measured on the stored extended loops (``extended_seed*.json``: the slice as control;
    ``extended_fc_seed*.json``: the fleet as control), per (candidate, KPI) looked at twice or more: the
    interference term's sd relative to the baseline at the first look and at the last (each look's is
    pooled over its rounds as perfectly correlated, every round's from the twin updated before it, so a
    later look's is a weighted mean of the updated twins' terms)."""
    out: dict[str, Any] = {}
    for label, prefix in (("slice", "extended_seed"), ("fleet", "extended_fc_seed")):
        first, last = [], []
        for path in sorted(scale_dir.glob(f"{prefix}[0-9]*.json")):
            for c in json.loads(path.read_text())["by_fleet_size"][str(n)]["per_candidate"]:
                looks = [r for r in c.get("rounds", []) if r.get("why")]
                for k, w in (looks[0]["why"] if len(looks) >= 2 else {}).items():
                    a, b = w.get("terms"), (looks[-1]["why"].get(k) or {}).get("terms")
                    if a and b and a["base"] and b["base"]:
                        first.append(np.sqrt(a["interference"]) / abs(a["base"]))
                        last.append(np.sqrt(b["interference"]) / abs(b["base"]))
        f, la = np.array(first), np.array(last)
        ok = f > 0
        out[label] = {"pairs": len(f), "median_first": float(np.median(f)) if len(f) else None,
                      "median_last": float(np.median(la)) if len(la) else None,
                      "median_ratio": float(np.median(la[ok] / f[ok])) if ok.any() else None,
                      "narrower": int(np.sum(la[ok] < f[ok])), "compared": int(ok.sum())}  # fmt: skip
    return out


SECTION = "## A randomized-saturation canary against the interference term (simulated, before any verdict run)"
KEEP = ("### What the saturation simulation says",)


def saturation_section(res: dict[str, Any], command: str) -> str:
    """The page's section from `saturation_comparison`'s result."""
    st = res["settings"]
    doc = (__doc__ or "").split("\n\n")
    lines = [SECTION, "", f"Command: `{command}` ({st['n']:,} groups, {st['days']} emulated days, seed {st['seed']}, "
             f"{st['runs']} canaries per design and type; `benchmarks/_closed_loop_saturation.py`). "
             + " ".join(re.sub(r"(^|\n)\* ", " — ", "\n\n".join(doc[1:5])).split()), "",
             "| design | median width (A/A) | coverage (A/A) | decided (A/A) | median width (regressing) | coverage (regressing) | decided (regressing) |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    text = {"twin": f"fleet control + CUPED per arm, the twin's interference term ({st['members']} members, sd "
                    f"{100 * st['interference_sd']:.1f} % of the baseline)",
            "saturation": "randomized saturation by site (0 / 1× / 2× the candidate share) + fleet control + CUPED per "
                          "arm, the measured spillover slope"}  # fmt: skip
    for design in ("twin", "saturation"):
        a, g = res[design]["aa"], res[design]["regressing"]
        lines.append(f"| {text[design]} | {100 * a['median_width']:.1f} pp | {100 * a['coverage']:.1f} % | "
                     f"{100 * a['decided']:.0f} % | {100 * g['median_width']:.1f} pp | {100 * g['coverage']:.1f} % | "
                     f"{100 * g['decided']:.0f} % |")  # fmt: skip
    sd = st.get("slope_sd")
    lines += ["", f"The measured slope's spread over the simulated canaries: sd {sd:.4f} per unit share (KPI units)."
              if sd is not None else ""]
    sh = res.get("site_share")
    if sh:
        lines += ["", f"A candidate arm stratified by site (`site_share_of_residual`): the sites' means explain a median "
                  f"{100 * sh['median']:.1f} % (from {100 * sh['min']:.1f} % to {100 * sh['max']:.1f} % over the "
                  f"{sh['days']} days) of the groups' CUPED-adjusted SLO-violation variance: at best that share of "
                  "the group split's variance, about half of it in width."]
    upd = res.get("update_narrowing") or {}
    if upd:
        lines += ["", "Does `Twin.update` after each canary look narrow the members' disagreement (`update_narrowing`, "
                  "from the stored 1,000-group extended loops, pairs looked at twice or more; the interference term's "
                  "sd relative to the baseline, first look → last look):", "",
                  "| control arm | pairs | median first look | median last look | median ratio last / first | narrower |",
                  "|---|---:|---:|---:|---:|---|"]
        for label, u in upd.items():
            if u["pairs"]:
                lines.append(f"| {label} | {u['pairs']} | {100 * u['median_first']:.2f} % | {100 * u['median_last']:.2f} % | "
                             f"{u['median_ratio']:.2f}× | {u['narrower']} of {u['compared']} |")
    return "\n".join(lines) + "\n"
