"""How faithful a twin is to (held-out) logs of the real system.

* `response_kl`: per-feature KL(real || twin) of ``response.*`` / ``kpi.*`` / ``reward`` under the
  logging policy (seed 004 Table 1 style).
* `time_slices`: a column's mean over 12 slices of the day, real vs twin (seed 004 Fig. 4).
* `logged_rollout`: run a policy in the twin on a log's own populations (its episodes' agents,
  sites, profiles and first states) instead of generated ones: "replay last week's traffic".
* `replay_errors`: compounding error of open-loop multi-step predictions when the twin replays
  the logged actions of held-out episodes from their logged first state, for horizons 1..H;
  `growth_exponent` fits ``error ~ h^b``.
* `fidelity_report`: all of the above, with PNGs; `two_way_validation`: fit on half of the
  episodes, score on the other half, and swap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from edgetwin.contract.errors import InputError
from edgetwin.contract.logs import ordered_columns
from edgetwin.contract.metrics import kl_marginal
from edgetwin.contract.policy import PlatformPolicy
from edgetwin.contract.spec import REWARD_COLUMN, TwinSpec
from edgetwin.imitation.layout import DAY_SECONDS
from edgetwin.imitation.steps import group_means
from edgetwin.imitation.world import World
from edgetwin.twin.simulation import RolloutRecord, Simulation
from edgetwin.twin.twin import Twin, load_log
from edgetwin.twin.whatif import logged_episodes


def response_kl(
    real: pd.DataFrame, virtual: pd.DataFrame, spec: TwinSpec, columns: list[str] | None = None
) -> dict[str, float]:
    """KL(real || virtual) of each output column's marginal, in nats."""
    cols = columns or [
        c for c in spec.names("response") + spec.names("kpi") + [REWARD_COLUMN] if c in real and c in virtual
    ]
    out = {}
    for c in cols:
        feat = spec.feature(c) if c != REWARD_COLUMN else None
        out[c] = kl_marginal(real[c].to_numpy(np.float64), virtual[c].to_numpy(np.float64), feat)
    return out


def time_slices(df: pd.DataFrame, column: str, step_seconds: float, slices: int = 12) -> np.ndarray:
    """``(slices,)`` mean of ``column`` per slice of the day (NaN where a slice has no row)."""
    sl = (((df["t"].to_numpy(np.float64) * step_seconds) % DAY_SECONDS) / DAY_SECONDS * slices).astype(int)
    sl = np.clip(sl, 0, slices - 1)
    vals = df[column].to_numpy(np.float64)
    sums = np.bincount(sl, weights=vals, minlength=slices)
    counts = np.bincount(sl, minlength=slices)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def _episode_simulation(
    twin: Twin, n_agents: int, seed: int, episode: int, stochastic: bool, member: int | None
) -> Simulation:
    """The simulation for logged episode number ``episode``, with its own seed derived from ``seed``."""
    return Simulation(
        twin,
        n_agents=n_agents,
        seed=int(np.random.default_rng([seed, episode]).integers(2**31)),
        stochastic=stochastic,
        member=member,
    )


def logged_rollout(
    twin: Twin,
    policy: PlatformPolicy,
    log: pd.DataFrame,
    seed: int = 0,
    stochastic: bool = True,
    all_members: bool = False,
    max_episodes: int | None = None,
) -> pd.DataFrame:
    """Run ``policy`` in the twin on the populations of a log's episodes.

    Each episode of ``log`` gives the agents (those present at its first tick), their scenarios,
    sites and profiles, its first states and its first tick; from there the twin simulates the
    policy's actions and its own responses and states, as `Twin.rollout` does from a generated
    population. This separates the response model's error from the population's: on the same
    episodes the real system's returns and the twin's differ only by the twin's dynamics.

    Args:
        twin: the twin.
        policy: acts on ``(N, P+S)`` raw observations ``[profile.*, state.*]``.
        log: a table in the contract (e.g. held-out days of the real system); only its first tick's
            profiles and states, its sites and its episode lengths are used.
        seed: seeds the response noise (and the acting member when not ``all_members``).
        stochastic: sample client responses (True) or use their mean.
        all_members: run every episode once per ensemble member (episodes labelled
            ``<episode>-m<member>``), so that mean returns are the ensemble's mean.
        max_episodes: use at most this many (the last) episodes of ``log``.

    Returns:
        One row per ``(episode, t, agent)`` with the contract's columns and ``reward``, agent and
        site names as in ``log``; ``df.attrs["support"]`` as in `Twin.rollout` (the profile redraw
        shares are 0: logged profiles are never redrawn).

    Raises:
        InputError: the log lacks a column of the twin or has a scenario it does not know.
    """
    lay = twin.layout
    episodes = logged_episodes(log, twin, max_episodes=max_episodes)
    records = []
    for e, ep in enumerate(episodes):
        members = range(twin.n_members) if all_members else [None]
        for m in members:
            sim = _episode_simulation(twin, len(ep.agents), seed, e, stochastic, m)
            sim.place(
                World(
                    lay,
                    ep.scenario.copy(),
                    ep.site.copy(),
                    lay.scalers["profile"].legalise(ep.profile),
                    lay.scalers["state"].legalise(ep.state[0]),
                    np.zeros((len(ep.site_names), lay.n_lag)),
                    t=ep.t0,
                )
            )
            sim.agent_names = [str(a) for a in ep.agents]
            sim.site_names = list(ep.site_names)
            sim.profile_redrawn = sim.profile_outside = 0.0
            name = ep.name if m is None else f"{ep.name}-m{m}"
            rec = sim.run(policy, steps=ep.steps, episode=name)
            rec.frame["t"] += ep.t0
            records.append(rec)
    return RolloutRecord.concat(records, twin.support.threshold)


def one_step_outputs(
    twin: Twin,
    log: pd.DataFrame,
    seed: int = 0,
    stochastic: bool = True,
    member: int = 0,
    max_episodes: int | None = None,
) -> pd.DataFrame:
    """The twin's outputs and reward at every step of a log, teacher forced.

    At each tick of each episode the twin is placed in the logged states, with the site means of
    the logged actions and outputs of the previous tick, and answers the logged actions; nothing
    it predicts feeds the next tick. Set beside the log, this is the response model's error
    without compounding (`logged_rollout` is the same population left to run on its own).

    Args:
        twin: the twin.
        log: a table in the contract with the twin's state, action and output columns.
        seed: seeds the response noise.
        stochastic: sample client responses (True) or use their mean.
        member: the ensemble member that answers.
        max_episodes: use at most this many (the last) episodes of ``log``.

    Returns:
        One row per logged ``(episode, t, agent)`` (agents present at the episode's first tick)
        with the contract's columns: profiles, states and actions as logged, outputs and
        ``reward`` as the twin predicts them.

    Raises:
        InputError: the log lacks a column of the twin or has a scenario it does not know.
    """
    lay = twin.layout
    sc = lay.scalers
    missing = [c for c in lay.outputs if c not in log.columns]
    if missing:
        raise InputError(f"the log lacks output column(s) {missing} needed to teacher-force the twin", "log")
    cols = ordered_columns(twin.spec, [REWARD_COLUMN])
    frames = []
    for e, ep in enumerate(logged_episodes(log, twin, max_episodes=max_episodes)):
        sim = _episode_simulation(twin, len(ep.agents), seed, e, stochastic, member)
        n_sites = len(ep.site_names)
        lag = np.zeros((n_sites, lay.n_lag))
        rows = np.arange(len(ep.agents))
        for t in range(ep.steps):
            state, action = ep.state[t], ep.action[t]
            y_log = np.stack([ep.columns[c][t] for c in lay.outputs], axis=1) if lay.outputs else None
            if np.isnan(state).any() or np.isnan(action).any():
                break  # an agent left: the episode's fixed population no longer matches
            sim.place(World(lay, ep.scenario, ep.site, ep.profile.copy(), state.copy(), lag.copy(), t=ep.t0 + t))
            out, reward, _ = sim.respond(rows, action, with_disagreement=False)
            blk: dict[str, Any] = {"episode": ep.name, "t": ep.t0 + t, "agent": ep.agents,
                                   "scenario": np.asarray(lay.scenarios)[ep.scenario],
                                   "site": np.asarray(ep.site_names)[ep.site]}
            for j, c in enumerate(lay.profile):
                blk[c] = ep.profile[:, j]
            for j, c in enumerate(lay.state):
                blk[c] = state[:, j]
            for j, c in enumerate(lay.action):
                blk[c] = sim.pending_action[:, j]
            for j, c in enumerate(lay.outputs):
                blk[c] = out[:, j]
            blk[REWARD_COLUMN] = reward
            frames.append(pd.DataFrame(blk))
            if y_log is None or np.isnan(y_log).any():
                break
            zy = sc["outputs"].transform(y_log)
            lag = group_means(np.concatenate([sc["action"].transform(action), zy], axis=1), ep.site, n_sites)
    df = pd.concat(frames, ignore_index=True)
    return df[[c for c in cols if c in df.columns]]


def replay_errors(
    twin: Twin, log: pd.DataFrame, max_horizon: int = 100, member: int = 0, max_episodes: int = 8
) -> pd.DataFrame:
    """Open-loop error of the twin replaying logged actions, by horizon.

    Each held-out episode starts from its logged agents, sites and first states; at every tick the
    twin gets the logged actions and predicts (mean, no noise) outputs and next states; its own
    predictions feed the next tick. Errors are mean absolute differences in standardised units.

    Returns:
        DataFrame ``[h, outputs, state, n]``: error of the outputs at tick ``h-1`` and of the
        state at tick ``h`` (``h`` = steps predicted), averaged over agents and episodes.
    """
    lay = twin.layout
    sc = lay.scalers
    acc: dict[int, list[tuple[float, float, int]]] = {}
    for e, ep in list(log.groupby("episode", sort=False))[:max_episodes]:
        ep = ep.sort_values(["t", "agent"])
        t0 = int(ep["t"].min())
        first = ep[ep["t"] == t0]
        agents = first["agent"].to_numpy()
        scen_map = {s: i for i, s in enumerate(lay.scenarios)}
        scen = first["scenario"].astype(str).map(scen_map)
        if scen.isna().any():
            raise InputError(f"episode {e!r} has a scenario the twin does not know", "log")
        site, _ = pd.factorize(first["site"].astype(str))
        by_t = {t: g.set_index("agent").reindex(agents) for t, g in ep.groupby("t")}
        sim = Simulation(twin, n_agents=len(agents), seed=0, stochastic=False, member=member)
        sim.place(
            World(
                lay,
                scen.to_numpy(np.int64),
                site.astype(np.int64),
                first[lay.profile].to_numpy(np.float64),
                first[lay.state].to_numpy(np.float64),
                np.zeros((int(site.max()) + 1, lay.n_lag)),
                t=t0,
            )
        )
        for h in range(1, max_horizon + 1):
            t = t0 + h - 1
            now, nxt = by_t.get(t), by_t.get(t + 1)
            if now is None or now[lay.action].isna().any().any():
                break
            res = sim.step(now[lay.action].to_numpy(np.float64), with_disagreement=False)
            err_y = (
                float(
                    np.abs(
                        sc["outputs"].transform(res.outputs)
                        - sc["outputs"].transform(now[lay.outputs].to_numpy(np.float64))
                    ).mean()
                )
                if lay.n_outputs
                else 0.0
            )
            err_s = np.nan
            if nxt is not None and not nxt[lay.state].isna().any().any() and lay.state:
                err_s = float(
                    np.abs(
                        sc["state"].transform(res.next_state)
                        - sc["state"].transform(nxt[lay.state].to_numpy(np.float64))
                    ).mean()
                )
            acc.setdefault(h, []).append((err_y, err_s, len(agents)))
    rows = []
    for h, vals in sorted(acc.items()):
        a = np.array(vals, dtype=np.float64)
        rows.append(
            {
                "h": h,
                "outputs": float(np.average(a[:, 0], weights=a[:, 2])),
                "state": float(np.nanmean(a[:, 1])) if np.isfinite(a[:, 1]).any() else np.nan,
                "n": int(a[:, 2].sum()),
            }
        )
    return pd.DataFrame(rows, columns=["h", "outputs", "state", "n"])


def growth_exponent(h: np.ndarray, err: np.ndarray) -> float:
    """``b`` of the least-squares fit ``log err = a + b log h`` (NaN if fewer than 3 points)."""
    h, err = np.asarray(h, np.float64), np.asarray(err, np.float64)
    ok = np.isfinite(err) & (err > 0) & (h > 0)
    if ok.sum() < 3:
        return float("nan")
    return float(np.polyfit(np.log(h[ok]), np.log(err[ok]), 1)[0])


def fidelity_report(
    twin: Twin,
    log: pd.DataFrame,
    policy: PlatformPolicy | None = None,
    seed: int = 0,
    episodes: int = 4,
    max_horizon: int = 100,
    out_dir: str | Path | None = None,
    coverage: bool = True,
) -> dict[str, Any]:
    """Score a twin against a held-out log (under its logging policy); PNGs into ``out_dir``.

    Args:
        twin: the twin.
        log: held-out log (contract format) of the real system under its logging policy.
        policy: the logging policy, if known; default the twin's behaviour clone of it.
        seed: seeds the rollouts.
        episodes: twin episodes to roll out.
        max_horizon: longest replay horizon for the compounding error.
        out_dir: where to write ``fidelity_kl.png``, ``fidelity_time_slices.png`` and
            ``fidelity_compounding.png`` (nothing written when None).
        coverage: also measure how often the logged KPIs fall inside the twin's calibrated 90 %
            interval (`edgetwin.twin.intervals.held_out_coverage`, cross-fitted over the log's
            episodes).

    Returns:
        ``{"kl": {column: nats}, "mean_kl", "time_slices": {column: {"real", "twin"}},
        "replay": [{h, outputs, state, n}], "growth_exponent", "support": {...},
        "coverage": {...}}``.
    """
    lay = twin.layout
    policy = policy or twin.logging_policy(seed=seed)
    agents = int(log.groupby("episode")["agent"].nunique().median())
    virt = twin.rollout(
        policy,
        episodes=episodes,
        seed=seed,
        n_agents=agents,
        steps=int(log.groupby("episode")["t"].nunique().median()),
    )
    kl = response_kl(log, virt, twin.spec)
    slices = {
        c: {
            "real": time_slices(log, c, twin.spec.step_seconds).tolist(),
            "twin": time_slices(virt, c, twin.spec.step_seconds).tolist(),
        }
        for c in lay.response
    }
    rep = replay_errors(twin, log, max_horizon=max_horizon)
    report: dict[str, Any] = {
        "kl": kl,
        "mean_kl": float(np.mean(list(kl.values()))) if kl else float("nan"),
        "time_slices": slices,
        "replay": rep.to_dict("records"),
        "growth_exponent": growth_exponent(rep["h"].to_numpy(), rep["outputs"].to_numpy())
        if len(rep)
        else float("nan"),
        "support": virt.attrs.get("support", {}),
        "n_real_rows": len(log),
        "n_twin_rows": len(virt),
    }
    if coverage:
        from edgetwin.twin.calibration import held_out_coverage

        report["coverage"] = held_out_coverage(twin, log, seed=seed)
    if out_dir is not None:
        report["figures"] = _plots(report, Path(out_dir))
    return report


def _plots(report: dict[str, Any], out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    paths = []
    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = list(report["kl"])
    ax.bar(range(len(names)), [report["kl"][n] for n in names])
    ax.set_xticks(range(len(names)), names, rotation=40, ha="right", fontsize=8)
    ax.set_ylabel("KL(real || twin), nats")
    ax.set_title("Twin vs real: output marginals")
    fig.tight_layout()
    fig.savefig(out / "fidelity_kl.png", dpi=110)
    plt.close(fig)
    paths.append(str(out / "fidelity_kl.png"))
    if report["time_slices"]:
        cols = list(report["time_slices"])
        fig, axes = plt.subplots(1, len(cols), figsize=(4.5 * len(cols), 3.2), squeeze=False)
        for ax, c in zip(axes[0], cols, strict=True):
            d = report["time_slices"][c]
            ax.plot(range(1, 13), d["real"], "o-", label="real")
            ax.plot(range(1, 13), d["twin"], "s--", label="twin")
            ax.set_xlabel("time slice of the day (2 h)")
            ax.set_title(c, fontsize=9)
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / "fidelity_time_slices.png", dpi=110)
        plt.close(fig)
        paths.append(str(out / "fidelity_time_slices.png"))
    if report["replay"]:
        rep = pd.DataFrame(report["replay"])
        fig, ax = plt.subplots(figsize=(5, 3.5))
        ax.loglog(rep["h"], rep["outputs"], label="outputs")
        if rep["state"].notna().any():
            ax.loglog(rep["h"], rep["state"], label="state")
        ax.set_xlabel("horizon h (steps)")
        ax.set_ylabel("mean |error| (std units)")
        ax.set_title(f"Compounding error (growth exponent {report['growth_exponent']:.2f})")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "fidelity_compounding.png", dpi=110)
        plt.close(fig)
        paths.append(str(out / "fidelity_compounding.png"))
    return paths


def split_episodes(log: pd.DataFrame, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Two halves of a log by episode (shuffled with ``seed``)."""
    eps = log["episode"].unique()
    if len(eps) < 2:
        raise InputError("two-way validation needs at least 2 episodes", "log")
    rng = np.random.default_rng(seed)
    eps = eps[rng.permutation(len(eps))]
    half = set(eps[: len(eps) // 2].tolist())
    mask = log["episode"].isin(half)
    return log[mask].reset_index(drop=True), log[~mask].reset_index(drop=True)


def two_way_validation(
    log: pd.DataFrame | str | Path,
    spec: TwinSpec | str | Path | None = None,
    seed: int = 0,
    episodes: int = 4,
    max_horizon: int = 100,
    **fit_kwargs: Any,
) -> dict[str, Any]:
    """Fit on one half of the episodes, score on the other, and swap; the mean of both scores.

    Returns:
        ``{"folds": [report A->B, report B->A], "mean_kl", "growth_exponent"}``.
    """
    df, sp = load_log(log, spec)
    a, b = split_episodes(df, seed)
    folds = []
    for train, test in ((a, b), (b, a)):
        tw = Twin.fit(train, sp, seed=seed, **fit_kwargs)
        folds.append(fidelity_report(tw, test, seed=seed, episodes=episodes, max_horizon=max_horizon))
    return {
        "folds": folds,
        "mean_kl": float(np.mean([f["mean_kl"] for f in folds])),
        "growth_exponent": float(np.nanmean([f["growth_exponent"] for f in folds])),
    }
