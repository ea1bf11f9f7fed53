"""Scale: how long a twin takes to fit as the logs grow, serially and on a process pool, and how
fast the fitted twin steps against the emulated cluster it mimics.

1. Fit wall time and peak memory (resident set of the fitting process and of its largest pool
   worker) for logs of the emulated cluster of growing size, serially (``workers=1``) and on the
   local process pool (``workers=0``: one per core), and the fitted exponent of time against
   rows. Each fit runs in a fresh subprocess so that its peak memory is its own.
   ``--compare-with DIR`` also fits the first size serially with another checkout of the package
   (e.g. the code before a speed-up): a ratio in the same run, on the same loaded machine.
2. Twin throughput (agent-steps/s, uniformly random actions, one process, 1 torch thread) at
   1,000 and 10,000 agents against the emulated cluster in the same run, and the top entries of
   a cProfile of the twin's tick.

Targets (issue 22): 1M rows <= 15 min and <= 8 GiB on 2 cores; >= 500k agent-steps/s at 1k agents
and >= the emulator's at 10k. The decision path's latency has its own section
(benchmarks/edge_latency.py, "Edge decision latency").

    python benchmarks/scale.py                       # 100k, 300k, 1M rows, default twin (hours on 2 cores)
    python benchmarks/scale.py --quick               # small sizes and a small twin (minutes)
    python benchmarks/scale.py --ray auto            # the pool fits on a Ray cluster instead

Writes the ``## Scale`` section of docs/benchmarks/scale/README.md and docs/benchmarks/scale/results.json.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import json
import os
import platform
import pstats
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import _docs
import _scale_causal_parts as _causal_parts
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "docs" / "benchmarks" / "scale"
SECTION = "## Scale"
RESULTS = OUT / "results.json"
FIT_SECTION = "## The fit"
AGENTS = 500  # service groups per logged episode; episodes = rows / (agents * 96)
QUICK_AGENTS = 100


def load() -> str:
    return ", ".join(f"{x:.1f}" for x in os.getloadavg())


# ------------------------------------------------------------------------------------ 1. fits
class TreeMemory:
    """Peak memory of this process and all its descendants (a fit's pool workers) *together*,
    sampled from /proc every ``interval`` seconds in a thread (Linux; elsewhere it stays 0).

    Two sums per sample: RSS (resident set; pages a forked worker still shares with its parent
    count in both, so an upper bound) and PSS (proportional set: a page shared by k processes
    counts 1/k in each, so the sum is what the processes hold together). `resource`'s
    ``ru_maxrss`` gives each process's own exact peak; this gives their combined peak, which
    they may reach at different moments, to within one sampling interval.
    """

    def __init__(self, interval: float = 1.0) -> None:
        self.interval = interval
        self.peak_rss_kib = 0
        self.peak_pss_kib = 0
        self.samples = 0
        self.max_processes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tree-memory", daemon=True)

    def __enter__(self) -> TreeMemory:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while True:
            self.sample()
            if self._stop.wait(self.interval):
                break

    def sample(self) -> None:
        pids = [os.getpid(), *_descendants(os.getpid())]
        rss = pss = 0
        for pid in pids:
            r, p = _memory_kib(pid)
            rss, pss = rss + r, pss + p
        self.peak_rss_kib, self.peak_pss_kib = max(self.peak_rss_kib, rss), max(self.peak_pss_kib, pss)
        self.samples += 1
        self.max_processes = max(self.max_processes, len(pids))


def _descendants(root: int) -> list[int]:
    """Process ids below ``root`` (children, their children, ...), from /proc/*/stat."""
    parent: dict[int, int] = {}
    for d in os.listdir("/proc") if os.path.isdir("/proc") else []:
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as fh:
                    # the command name (2nd field) may hold spaces: the ppid is 2nd after its ")"
                    parent[int(d)] = int(fh.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out, frontier = [], [root]
    while frontier:
        kids = [p for p, pp in parent.items() if pp in frontier]
        out += kids
        frontier = kids
    return out


def _memory_kib(pid: int) -> tuple[int, int]:
    """``(RSS, PSS)`` of a process in KiB from /proc/<pid>/smaps_rollup ((0, 0) once it is gone)."""
    rss = pss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Rss:"):
                    rss = int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1])
    except (OSError, ValueError):
        pass
    return rss, pss


def fit_once(rows: int, workers: int, hyper: dict, seed: int, ray: str | None, out: Path, agents: int = AGENTS) -> dict:
    """Fit in this process (called in a subprocess by `timed_fit`); returns time and peak memory."""
    import torch

    from edgetwin.emulator.cluster import ClusterConfig
    from edgetwin.emulator.logs import generate_logs
    from edgetwin.twin.twin import Twin

    torch.set_num_threads(1)
    episodes = max(2, int(round(rows / (agents * 96))))
    df, spec = generate_logs(ClusterConfig(n_agents=agents, steps=96), episodes=episodes, seed=seed)
    kw = dict(hyper)
    pop = {"steps": kw.pop("population_steps")} if "population_steps" in kw else {}
    t0 = time.perf_counter()
    if workers != 1 or ray is not None:  # (an older checkout of `--compare-with` knows neither)
        kw.update(workers=workers, ray_address=ray)
    phases: dict[str, dict[str, float]] = {}
    with TreeMemory() as mem, fit_phases(phases):
        twin = Twin.fit(df, spec, seed=seed, progress=False, population_hyper=pop, **kw)
    secs = time.perf_counter() - t0
    twin.save(out)
    self_use, kids_use = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    # CPU seconds (user + system) of the fitting process and of its finished pool workers: on a
    # shared machine the wall clock also counts the time other jobs held the cores, these do not
    return {"rows": len(df), "episodes": episodes, "workers": workers, "seconds": secs,
            "peak_gib_main": self_use.ru_maxrss / 2**20, "peak_gib_worker": kids_use.ru_maxrss / 2**20,  # KiB -> GiB
            "cpu_s_main": self_use.ru_utime + self_use.ru_stime, "cpu_s_workers": kids_use.ru_utime + kids_use.ru_stime,
            # the fitting process and its workers together (sampled each second; see TreeMemory)
            "peak_gib_total_pss": mem.peak_pss_kib / 2**20, "peak_gib_total_rss": mem.peak_rss_kib / 2**20,
            "memory_samples": mem.samples, "max_processes": mem.max_processes,
            "phases": phases, "load_after": load()}


#: the steps of `Twin.fit` timed by `fit_phases`: (attribute path in edgetwin.twin.twin, phase name)
PHASES = (("load_log", "load and validate the log"), ("overlap_report", "overlap report"), ("Layout.fit", "layout"),
          ("data_sha256", "data hash"), ("Twin._fit_population", "population model (GAN-SMMSG)"),
          ("Composition.fit", "composition"), ("InitialStates.fit", "initial states"),
          ("_choose_invariances", "causal invariance choice"), ("_fit_members", "members (MAIL-MMSG or causal)"),
          ("_support_and_action_bounds", "support index"), ("episode_hashes", "episode hashes"))


@contextlib.contextmanager
def fit_phases(out: dict[str, dict[str, float]]):  # type: ignore[no-untyped-def]
    """Time the steps of `Twin.fit` (`PHASES`) while the block runs: per phase, the CPU seconds of
    this process, of its children that finished within it (the pool's workers) and the wall
    seconds, added into ``out``. The functions are wrapped where `Twin.fit` looks them up (the
    module's globals, the classes' attributes) and restored after; a name an older checkout does
    not have is skipped."""
    import edgetwin.twin.twin as tw

    undo = []
    for path, name in PHASES:
        *owner_path, attr = path.split(".")
        owner = tw
        for part in owner_path:
            owner = getattr(owner, part, None)
        if owner is None or attr not in vars(owner):
            continue
        raw = vars(owner)[attr]
        fn = raw.__func__ if isinstance(raw, (staticmethod, classmethod)) else raw

        def timed(*a, _fn=fn, _name=name, **k):  # type: ignore[no-untyped-def]
            c, w = time.process_time(), time.perf_counter()
            kids = resource.getrusage(resource.RUSAGE_CHILDREN)
            try:
                return _fn(*a, **k)  # (a classmethod's class comes first in ``a``)
            finally:
                after = resource.getrusage(resource.RUSAGE_CHILDREN)
                rec = out.setdefault(_name, {"cpu_main": 0.0, "cpu_workers": 0.0, "wall": 0.0})
                rec["cpu_main"] += time.process_time() - c
                rec["cpu_workers"] += after.ru_utime + after.ru_stime - kids.ru_utime - kids.ru_stime
                rec["wall"] += time.perf_counter() - w

        kind = type(raw) if isinstance(raw, (staticmethod, classmethod)) else None
        setattr(owner, attr, kind(timed) if kind else timed)
        undo.append((owner, attr, raw))
    try:
        yield out
    finally:
        for owner, attr, raw in reversed(undo):
            setattr(owner, attr, raw)


def timed_fit(rows: int, workers: int, hyper: dict, seed: int, ray: str | None, pkg: Path | None,
              out: Path) -> dict:
    """`fit_once` in a fresh interpreter (its own peak memory); ``pkg``: import edgetwin from there."""
    env = dict(os.environ)
    if pkg is not None:
        env["PYTHONPATH"] = str(pkg)
    args = json.dumps({"rows": rows, "workers": workers, "hyper": hyper, "seed": seed, "ray": ray, "out": str(out),
                       "agents": QUICK_AGENTS if hyper.get("quick") else AGENTS})
    before = load()
    res = subprocess.run([sys.executable, __file__, "--_fit", args], env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"fit of {rows} rows failed:\n{res.stderr[-3000:]}")
    rec = json.loads(res.stdout.strip().splitlines()[-1])
    rec["load_before"] = before
    return rec


# ------------------------------------------------------------------------------------ 2. rollout
def one_thread() -> None:
    """One thread for torch (the client MLP), numexpr (the declared dynamics) and the BLAS under
    numpy (the emulator's), as "one process" means: with 2 threads on a loaded 2-core machine
    the MLP's kernels spin-wait (2-9x slower); numexpr's second thread costs more than it saves
    on a twin's arrays (10,000 agents: 36 vs 21 us per expression on a quiet machine); and
    OpenBLAS's second thread made the emulator spend two CPU-seconds per second at 1,000 agents
    for the same wall time (so its "per CPU-second" figure was halved) when the other core was idle."""
    import numexpr
    import torch
    from threadpoolctl import threadpool_limits

    torch.set_num_threads(1)
    numexpr.set_num_threads(1)
    threadpool_limits(1)  # every native pool (OpenBLAS, OpenMP), for the rest of this process


#: agent-steps of one throughput run at least (`throughput_ticks`)
RUN_AGENT_STEPS = 200_000


def throughput_ticks(n: int) -> int:
    """Ticks of one throughput or phase-timing run at ``n`` agents: 40, or more where 40 ticks are
    fewer than `RUN_AGENT_STEPS` agent-steps (1,000 agents: 200 ticks, ~0.2 CPU-s: 40 ticks there
    were ~50 ms, a few scheduler slices on a loaded machine)."""
    return max(40, RUN_AGENT_STEPS // max(n, 1))


def throughput(twin_dir: Path, n: int, ticks: int, rounds: int = 3, seed: int = 0) -> dict:
    """Best of ``rounds`` alternating runs of the twin and the cluster (each ``ticks`` ticks, after
    ``ticks // 4`` warm-up ticks of the twin)."""
    from edgetwin.contract.policy import RandomPolicy
    from edgetwin.emulator.cluster import ClusterConfig, EdgeCluster
    from edgetwin.twin.twin import Twin

    one_thread()
    twin = Twin.load(twin_dir)
    pol = RandomPolicy(twin.spec, 0)
    best_t, best_c, cpu_t, cpu_c = 0.0, 0.0, 0.0, 0.0
    for r in range(seed, seed + rounds):
        sim = twin.simulation(n_agents=n, seed=r)
        acts = [pol.act(sim.obs()) for _ in range(ticks)]
        for a in acts[: ticks // 4]:
            sim.step(a, with_disagreement=False)
        t0, c0 = time.perf_counter(), time.process_time()
        for a in acts:
            sim.step(a, with_disagreement=False)
        best_t = max(best_t, n * ticks / (time.perf_counter() - t0))
        cpu_t = max(cpu_t, n * ticks / max(time.process_time() - c0, 1e-9))
        cl = EdgeCluster(ClusterConfig(n_agents=n, steps=ticks + 1))
        cl.reset(seed=r)
        t0, c0 = time.perf_counter(), time.process_time()
        for a in acts:
            cl.step(a)
        best_c = max(best_c, n * ticks / (time.perf_counter() - t0))
        cpu_c = max(cpu_c, n * ticks / max(time.process_time() - c0, 1e-9))
    # per CPU-second too: on a shared machine the wall clock also counts the time other jobs held the core
    return {"agents": n, "ticks": ticks, "twin": best_t, "emulator": best_c, "ratio": best_t / best_c, "twin_cpu": cpu_t,
            "emulator_cpu": cpu_c, "load": load()}


def throughput_compared(twin_dir: Path, sizes: tuple[int, ...], ticks: int, before: Path | None,
                        rounds: int = 3) -> list[dict]:
    """`throughput` of this code and (``before``) another checkout of the package, each in a fresh
    interpreter, alternating round by round, each run against the emulator in the same process:
    the before/after ratio and both twin/emulator ratios come from the same minutes of the machine."""
    out = []
    for n in sizes:
        best: dict[str, dict] = {}
        runs: dict[str, list[dict]] = {"after": [], "before": []}
        for r in range(rounds):
            for tag, pkg in (("after", None), ("before", before)):
                if tag == "before" and pkg is None:
                    continue
                env = dict(os.environ)
                if pkg is not None:
                    env["PYTHONPATH"] = str(pkg)
                args = json.dumps({"twin": str(twin_dir), "n": n, "ticks": ticks, "seed": r})
                res = subprocess.run([sys.executable, __file__, "--_throughput", args], env=env,
                                     capture_output=True, text=True)
                if res.returncode != 0:
                    raise SystemExit(f"throughput run failed:\n{res.stderr[-3000:]}")
                rec = json.loads(res.stdout.strip().splitlines()[-1])
                runs[tag].append(rec)
                if tag not in best or rec["twin"] > best[tag]["twin"]:
                    best[tag] = rec
                print(tag, rec, flush=True)
        row = dict(best["after"])
        for k in ("emulator", "emulator_cpu"):  # the emulator does not depend on the twin code: its best run
            row[k] = max(b[k] for rs in runs.values() for b in rs)
        row["twin_cpu"] = max(b["twin_cpu"] for b in runs["after"])
        row["ratio"] = row["twin"] / row["emulator"]
        row["ratio_cpu"] = row["twin_cpu"] / row["emulator_cpu"]
        # per run, the twin against the emulator stepped in the same process minutes later: under a
        # shifting load each run's pair shares its minutes, the bests above may not
        for tag, key in (("after", "paired_cpu"), ("before", "paired_cpu_before")):
            if runs[tag]:
                row[key] = [b["twin_cpu"] / b["emulator_cpu"] for b in runs[tag]]
        if "before" in best:
            row["twin_before"] = best["before"]["twin"]
            row["twin_cpu_before"] = max(b["twin_cpu"] for b in runs["before"])
            row["ratio_before"] = row["twin_before"] / row["emulator"]
            row["ratio_cpu_before"] = row["twin_cpu_before"] / row["emulator_cpu"]
            row["speedup"] = row["twin"] / row["twin_before"]
            row["speedup_cpu"] = row["twin_cpu"] / row["twin_cpu_before"]
        out.append(row)
    return out


#: the KPI columns `rollout_kpis` averages (those the emulated cluster's twin logs), plus the reward
KPI_PREFIXES = ("kpi.", "response.")


def rollout_kpis(twin_dir: Path, seeds: int, agents: int) -> dict:
    """Per seed, the mean of every KPI, response and the reward over a full-horizon rollout of
    ``agents`` agents (seed s: population, initial states, a random policy seeded s, member 0),
    once with the response noise (``stochastic``) and once with the models' means (``mean``)."""
    from edgetwin.contract.policy import RandomPolicy
    from edgetwin.twin.twin import Twin

    one_thread()
    twin = Twin.load(twin_dir)
    out: dict[str, list[dict[str, float]]] = {}
    for stochastic in (True, False):
        rows = []
        for seed in range(seeds):
            sim = twin.simulation(n_agents=agents, seed=seed, stochastic=stochastic, member=0)
            fr = sim.run(RandomPolicy(twin.spec, seed)).frame
            cols = ["reward"] + [c for c in fr.columns if c.startswith(KPI_PREFIXES)]
            rows.append({c: float(fr[c].mean()) for c in cols})
        out["stochastic" if stochastic else "mean"] = rows
    return out


def kpis_compared(twin_dir: Path, before: Path, seeds: int = 20, agents: int = 1000) -> dict:
    """`rollout_kpis` of this code and of ``before`` (each in a fresh interpreter) on the same seeds:
    per mode and column, both means over seeds, their difference, the seed-to-seed standard
    deviation, the difference in standard errors, and the largest per-seed relative change."""
    got = {}
    for tag, pkg in (("now", None), ("before", before)):
        env = dict(os.environ)
        if pkg is not None:
            env["PYTHONPATH"] = str(pkg)
        args = json.dumps({"twin": str(twin_dir), "seeds": seeds, "agents": agents})
        res = subprocess.run([sys.executable, __file__, "--_kpis", args], env=env, capture_output=True, text=True)
        if res.returncode != 0:
            raise SystemExit(f"KPI rollouts failed:\n{res.stderr[-3000:]}")
        got[tag] = json.loads(res.stdout.strip().splitlines()[-1])
    out: dict = {"seeds": seeds, "agents": agents, "modes": {}}
    for mode in ("stochastic", "mean"):
        rows = {}
        for col in got["before"][mode][0]:
            b = np.array([r[col] for r in got["before"][mode]])
            n = np.array([r[col] for r in got["now"][mode]])
            se = float(np.sqrt(b.var(ddof=1) / len(b) + n.var(ddof=1) / len(n)))
            rows[col] = {"before": float(b.mean()), "now": float(n.mean()), "diff": float(n.mean() - b.mean()),
                         "seed_sd": float(b.std(ddof=1)), "se": se,
                         "z": float((n.mean() - b.mean()) / se) if se > 0 else 0.0,
                         "max_rel": float(np.max(np.abs(n - b) / np.maximum(np.abs(b), 1e-12)))}
        out["modes"][mode] = rows
    return out


def kpis_text(k: dict, before: str) -> str:
    lines = [f"**What changed in the numbers** (`python benchmarks/scale.py --throughput-only --twin DIR --compare-with "
             f"BEFORE`, the same twin; {k['seeds']} seeds, {k['agents']:,} agents, a full-horizon rollout of a random "
             f"policy each, member 0; per seed the mean of each column over the rollout; this code against {before}). "
             "*mean*: the models' means, no response noise; *stochastic*: with the noise (where the two codes draw "
             "another normal stream, compare the means over seeds in standard errors):", "",
             "| column | mode | before | now | now - before | seed sd | (now - before) / se | largest per-seed relative change |",
             "|---|---|---:|---:|---:|---:|---:|---:|"]
    for mode in ("mean", "stochastic"):
        for col, r in k["modes"][mode].items():
            lines.append(f"| `{col}` | {mode} | {r['before']:.6g} | {r['now']:.6g} | {r['diff']:+.2g} | {r['seed_sd']:.3g} | "
                         f"{r['z']:+.2f} | {r['max_rel']:.1e} |")
    return "\n".join(lines)


def profile_tick(twin_dir: Path, n: int, ticks: int, top: int = 12) -> list[dict]:
    """cProfile of ``ticks`` twin ticks at ``n`` agents (1 torch thread, as the throughput runs):
    the top entries by own time."""
    from edgetwin.contract.policy import RandomPolicy
    from edgetwin.twin.twin import Twin

    one_thread()
    twin = Twin.load(twin_dir)
    sim = twin.simulation(n_agents=n, seed=0)
    pol = RandomPolicy(twin.spec, 0)
    acts = [pol.act(sim.obs()) for _ in range(ticks)]
    for a in acts[:5]:  # warm-up outside the profile: the first calls load numba's cached kernels
        sim.step(a, with_disagreement=False)
    prof = cProfile.Profile()
    prof.enable()
    for a in acts:
        sim.step(a, with_disagreement=False)
    prof.disable()
    st = pstats.Stats(prof, stream=io.StringIO())
    total = sum(v[2] for v in st.stats.values())  # type: ignore[attr-defined]
    rows = sorted(st.stats.items(), key=lambda kv: -kv[1][2])[:top]  # type: ignore[attr-defined]
    return [{"function": f"{Path(f).name}:{line}({name})", "calls": v[1], "own_s": v[2], "share": v[2] / total}
            for (f, line, name), v in rows]


def _timed(fn, spent: dict[str, float], key: str):  # type: ignore[no-untyped-def]
    """``fn`` wrapped to add its CPU seconds (`time.process_time`) to ``spent[key]`` per call."""

    def timed(*a, **k):  # type: ignore[no-untyped-def]
        c = time.process_time()
        try:
            return fn(*a, **k)
        finally:
            spent[key] = spent.get(key, 0.0) + time.process_time() - c

    return timed


def tick_phases(twin_dir: Path, n: int, ticks: int = 40, passes: int = 3) -> dict:
    """CPU milliseconds per tick of a twin's tick at ``n`` agents by phase: each function below is
    wrapped with a `time.process_time` timer (inclusive times; ~1 us of wrapper per call), the rest
    of `Simulation.step` is "other". One thread, as the throughput runs; after 10 warm-up ticks,
    ``passes`` passes of ``ticks`` ticks, the fastest kept whole (its phases and its total: on a
    loaded machine one pass's CPU time moves by ~10 %, the same as the changes it should show)."""
    import edgetwin.twin.fused as fused_mod
    import edgetwin.twin.simulation as sim_mod
    from edgetwin.contract.policy import RandomPolicy
    from edgetwin.imitation.layout import Layout
    from edgetwin.imitation.world import World
    from edgetwin.twin.fused import FusedTick
    from edgetwin.twin.twin import Twin

    one_thread()
    twin = Twin.load(twin_dir)
    sim = twin.simulation(n_agents=n, seed=0)
    pol = RandomPolicy(twin.spec, 0)
    acts = [pol.act(sim.obs()) for _ in range(ticks + 10)]
    spent: dict[str, float] = {}
    phases = {  # (owner, attribute, phase name)
        "network": (sim_mod.Simulation, "_grouped"),
        "noise draws": (sim_mod, "normals"),
        "fused: actions and agent inputs": (FusedTick, "legal_actions"),
        "fused: noise, outputs' inverse and z": (FusedTick, "outputs"),
        # the output noise by predicted level: inside the pass above since issue 47's second round
        # (`fused._level_draws`), its own pass before it (`Simulation._level_noise`); a phase the
        # code being timed does not have is left out
        "  of it: noise by predicted level": (fused_mod, "_level_draws"),
        "noise by predicted level (its own pass)": (sim_mod.Simulation, "_level_noise"),
        "fused: reward": (FusedTick, "reward_of"),
        "fused: end of tick (all of it)": (FusedTick, "end_tick"),
        # the declared dynamics: one compiled call (`FusedTick.declared`) since issue 47's fourth
        # round, numexpr's programs one by one (`Layout.apply_declared`) before it
        "  of it: declared dynamics (one compiled call)": (FusedTick, "declared"),
        "  of it: declared dynamics (numexpr)": (Layout, "apply_declared"),
        "  of it: next state's z-values": (FusedTick, "state_z"),
        "site inputs (site means of z(state), lags)": (World, "client_site_inputs"),
        "observation": (sim_mod.Simulation, "obs"),
    }
    saved = []
    for name, (owner, attr) in phases.items():
        if not hasattr(owner, attr):  # (an older checkout, `--compare-with`)
            continue
        fn = getattr(owner, attr)
        saved.append((owner, attr, fn))
        setattr(owner, attr, _timed(fn, spent, name))
    best: tuple[float, dict[str, float]] | None = None
    try:
        for a in acts[:10]:
            sim.step(a, with_disagreement=False)
        for _ in range(passes):  # the same ticks again (the world moves on): the fastest pass is kept
            spent.clear()
            c0 = time.process_time()
            for a in acts[10:]:
                sim.step(a, with_disagreement=False)
            total = time.process_time() - c0
            if best is None or total < best[0]:
                best = (total, dict(spent))
    finally:
        for owner, attr, fn in saved:
            setattr(owner, attr, fn)
    assert best is not None
    total, spent = best
    ms = {k: 1e3 * v / ticks for k in phases if (v := spent.get(k)) is not None}
    top = [k for k in ms if not k.startswith("  ")]
    ms["other"] = 1e3 * total / ticks - sum(ms[k] for k in top)
    return {"agents": n, "tick_ms": 1e3 * total / ticks, "phases_ms": ms, "load": load(), "ticks": ticks,
            "passes": passes}


# ------------------------------------------------------------------------------------ 2b. PPO in the twin
def ppo_rate(twin_dir: Path, n: int, timesteps: int, seed: int = 0, repeats: int = 3) -> dict:
    """SB3 PPO trained ``timesteps`` environment steps in the twin's `TwinVecEnv` and in the emulated
    cluster's ``EdgeClusterVecEnv`` (``n`` agents = sub-envs each), ``repeats`` times each, alternately in
    this process (twin first, then emulator first, ...), with edgetwin's PPO defaults for ``n`` envs
    (`default_hyper`) and SB3's MlpPolicy on the CPU, one thread.

    Per env, over its runs: environment steps per CPU-second of the whole ``learn``, and the CPU time
    inside the env's ``step_wait`` (the twin's tick, or the cluster's), inside ``PPO.train`` (SB3's
    update: 5 epochs of minibatch gradient steps) and the rest (SB3's rollout collection: the policy's
    forward pass per tick, the buffer, callbacks). CPU time of this process (`time.process_time`):
    the clock the shared machine's other jobs do not advance. ``ratio``: the median over the run
    pairs of twin / emulator steps per CPU-second (one pair shares its minutes of the load; SB3's
    update, the same work in both, is ~90 % of the time and moves with the load by more than the
    envs differ), ``pairs``: every pair's, ``pooled``: all steps over all CPU-seconds.
    """
    from stable_baselines3 import PPO

    from edgetwin.emulator.cluster import ClusterConfig
    from edgetwin.emulator.envs import EdgeClusterVecEnv
    from edgetwin.policies.train import default_hyper
    from edgetwin.twin.envs import TwinVecEnv
    from edgetwin.twin.twin import Twin

    one_thread()
    twin = Twin.load(twin_dir)
    makers = {"twin": lambda: TwinVecEnv(twin, n_agents=n, seed=seed),
              "emulator": lambda: EdgeClusterVecEnv(ClusterConfig(n_agents=n, steps=twin.layout.horizon), seed=seed)}
    out: dict = {"agents": n, "timesteps": timesteps, "hyper": default_hyper("ppo", n), "repeats": repeats}
    runs: dict[str, list[dict]] = {"twin": [], "emulator": []}
    for rep in range(repeats):
        for name in (("twin", "emulator") if rep % 2 == 0 else ("emulator", "twin")):
            env = makers[name]()
            env.reset()  # warm-up outside the clock: first calls (numba's cached kernels, torch) and a tick
            for _ in range(3):
                env.step(np.stack([env.action_space.sample() for _ in range(env.num_envs)]))
            spent: dict[str, float] = {"env": 0.0, "update": 0.0}
            env.step_wait = _timed(env.step_wait, spent, "env")  # type: ignore[method-assign]
            model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **out["hyper"])
            model.train = _timed(model.train, spent, "update")  # type: ignore[method-assign]
            c0, t0 = time.process_time(), time.perf_counter()
            model.learn(total_timesteps=timesteps)
            runs[name].append({"steps": model.num_timesteps, "cpu_s": time.process_time() - c0,
                               "wall_s": time.perf_counter() - t0, "env_cpu_s": spent["env"],
                               "update_cpu_s": spent["update"]})
    for name, rs in runs.items():
        steps, cpu = sum(r["steps"] for r in rs), sum(r["cpu_s"] for r in rs)
        env_s, upd_s = sum(r["env_cpu_s"] for r in rs), sum(r["update_cpu_s"] for r in rs)
        out[name] = {"steps": steps // len(rs), "cpu_s": cpu, "wall_s": sum(r["wall_s"] for r in rs),
                     "steps_per_cpu_s": steps / cpu, "env_share": env_s / cpu, "update_share": upd_s / cpu,
                     "other_share": 1.0 - (env_s + upd_s) / cpu, "env_cpu_s": env_s, "update_cpu_s": upd_s,
                     "runs": rs}
    out["pairs"] = [t["steps"] / t["cpu_s"] / (e["steps"] / e["cpu_s"])
                    for t, e in zip(runs["twin"], runs["emulator"], strict=True)]
    out["ratio"] = float(np.median(out["pairs"]))
    out["pooled"] = out["twin"]["steps_per_cpu_s"] / out["emulator"]["steps_per_cpu_s"]
    out["load"] = load()
    return out


def ppo_text(rows: list[dict]) -> str:
    lines = ["**2b. PPO in the twin** (`python benchmarks/scale.py --ppo --twin DIR`: SB3 PPO, MlpPolicy, CPU, one thread, "
             "edgetwin's PPO defaults for the env count (`default_hyper`: n_steps = max(8, 512 // agents), ~128-row "
             "minibatches, 5 epochs), trained in the twin's `TwinVecEnv` and then in the emulated cluster's "
             "`EdgeClusterVecEnv` in the same process, one sub-env per agent; CPU seconds of the process; *env*: inside "
             "the env's `step_wait` (the twin's tick or the cluster's), *update*: inside `PPO.train`, *rest*: SB3's "
             "rollout collection around the env (the policy's forward pass, the buffer); where runs were repeated, each "
             "env's runs alternate with the other's (twin first, then emulator first), the rates and shares are over "
             "all of an env's runs and *twin / emulator* is the median of the run pairs' ratios):", "",
             "| agents | env steps (per run) | twin steps/CPU-s | emulator steps/CPU-s | twin / emulator (each pair) | "
             "twin: env / update / rest | emulator: env / update / rest | load |", "|---:|---:|---:|---:|---:|---|---|---|"]
    for r in rows:
        t, e = r["twin"], r["emulator"]
        pairs = f" ({', '.join(f'{x:.2f}' for x in r['pairs'])})" if r.get("pairs") else ""
        lines.append(f"| {r['agents']:,} | {t['steps']:,}{' x ' + str(r['repeats']) if r.get('repeats', 1) > 1 else ''} | "
                     f"{t['steps_per_cpu_s']:,.0f} | {e['steps_per_cpu_s']:,.0f} | "
                     f"{r['ratio']:.2f}{pairs} | {100 * t['env_share']:.0f} / {100 * t['update_share']:.0f} / "
                     f"{100 * t['other_share']:.0f} % | {100 * e['env_share']:.0f} / {100 * e['update_share']:.0f} / "
                     f"{100 * e['other_share']:.0f} % | {r['load']} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ 2c. the episode reset
#: functions whose cumulative time splits a reset in `reset_compared`'s profile: (qualified name, label)
RESET_PARTS = (("simulation.py:_draw_profiles", "the population model's draws"),
               ("support.py:inside", "the support check"), ("world.py:sample", "the initial states"))


def reset_compared(twin_dir: Path, n: int, resets: int = 10, rounds: int = 6, seed: int = 0) -> dict:
    """CPU milliseconds of the twin's episode reset (`Simulation.reset`, ``n`` agents: the next
    population, its support check and initial states) against the code before issue 47's reset pass
    (`_scale_reset_before.reset_before`, the same twin) and the emulated cluster's reset
    (``EdgeClusterVecEnv.reset``), in this process, one thread.

    ``rounds`` rounds of ``resets`` resets each of the three, the order turning round by round, the
    twin's two codes on the same seeds; every reset of the two codes is compared bit for bit
    (observations, the world's arrays, the acting member, the redrawn shares and the random
    stream after it: ``identical``). Per variant the median over rounds of a round's mean; ``ratio``:
    the median over rounds of before / now (a round's two share its minutes of the load).
    ``profile_shares``: a cProfile of ``2 * resets`` resets now, the cumulative share of each of
    `RESET_PARTS`; ``draw_calls_per_reset``: the population model's calls per reset in it.
    """
    from _scale_reset_before import reset_before

    from edgetwin.emulator.cluster import ClusterConfig
    from edgetwin.emulator.envs import EdgeClusterVecEnv
    from edgetwin.twin.simulation import Simulation
    from edgetwin.twin.twin import Twin

    one_thread()
    twin = Twin.load(twin_dir)
    now, before = Simulation(twin, n_agents=n, seed=seed), Simulation(twin, n_agents=n, seed=seed)
    emulator = EdgeClusterVecEnv(ClusterConfig(n_agents=n, steps=twin.layout.horizon), seed=seed)
    identical = True

    def same(a: Simulation, b: Simulation) -> bool:
        wa, wb = a.world, b.world
        return (all(getattr(wa, k).tobytes() == getattr(wb, k).tobytes()
                    for k in ("scenario", "site", "profile", "state", "lag"))
                and a.obs().tobytes() == b.obs().tobytes() and a.member == b.member
                and (a.profile_redrawn, a.profile_outside) == (b.profile_redrawn, b.profile_outside)
                and a.rng.bit_generator.state == b.rng.bit_generator.state)

    for s in range(3):  # warm-up outside the clock
        now.reset(seed + s), reset_before(before, seed + s), emulator.reset()
    times: dict[str, list[float]] = {"now": [], "before": [], "emulator": []}
    for r in range(rounds):
        seeds = [seed + 1000 * (r + 1) + i for i in range(resets)]
        order = ("now", "before", "emulator") if r % 2 == 0 else ("emulator", "before", "now")
        for name in order:
            c = time.process_time()
            if name == "now":
                for sd in seeds:
                    now.reset(sd)
            elif name == "before":
                for sd in seeds:
                    reset_before(before, sd)
            else:
                for _ in seeds:
                    emulator.reset()
            times[name].append(1e3 * (time.process_time() - c) / resets)
        for sd in seeds[:2]:  # outside the clock: the two codes, reset for reset
            now.reset(sd), reset_before(before, sd)
            identical = identical and same(now, before)
    prof = cProfile.Profile()
    prof.enable()
    for i in range(2 * resets):
        now.reset(seed + i)
    prof.disable()
    st = pstats.Stats(prof)
    total = max(v[3] for k, v in st.stats.items() if k[2] == "reset" and k[0].endswith("simulation.py"))  # type: ignore[attr-defined]
    shares = {}
    for qual, label in RESET_PARTS:
        fname, func = qual.split(":")
        shares[label] = sum(v[3] for k, v in st.stats.items() if k[0].endswith(fname) and k[2] == func) / total  # type: ignore[attr-defined]
    draws = sum(v[1] for k, v in st.stats.items() if k[0].endswith("simulation.py") and k[2] == "_draw_profiles")  # type: ignore[attr-defined]
    med = {k: float(np.median(v)) for k, v in times.items()}
    return {"agents": n, "resets": resets, "rounds": rounds, "horizon": twin.layout.horizon, "ms": med, "rounds_ms": times,
            "ratio": float(np.median([b / a for a, b in zip(times["now"], times["before"], strict=True)])),
            "vs_emulator": med["now"] / med["emulator"], "identical": identical, "profile_shares": shares,
            "draw_calls_per_reset": draws / (2 * resets), "load": load()}


def reset_text(rows: list[dict], note: str | None = None) -> str:
    lines = ["**2c. The episode reset** (`python benchmarks/scale.py --reset --twin DIR`: CPU ms of one reset, in one process, "
             "one thread: the twin's `Simulation.reset` (the next population from the population model, its support check, "
             "the initial states) now and with the code before this pass (main at 869c062, kept in benchmarks/_scale_reset_before.py), "
             "and the emulated cluster's `EdgeClusterVecEnv.reset`; rounds of resets of each, the order turning round by round, "
             "the two codes on the same seeds and compared bit for bit; the median over rounds of a round's mean; *before / now*: "
             "the median of the rounds' ratios; *per tick*: the reset spread over the episode's ticks):", "",
             "| agents | rounds x resets | twin now, ms | twin before, ms | before / now | emulator, ms | twin now / emulator | "
             "per tick now (before), ms | same bits | load |", "|---:|---:|---:|---:|---:|---:|---:|---|---|---|"]
    for r in rows:
        ms = r["ms"]
        lines.append(f"| {r['agents']:,} | {r['rounds']} x {r['resets']} | {ms['now']:.2f} | {ms['before']:.2f} | "
                     f"{r['ratio']:.2f}x | {ms['emulator']:.2f} | {r['vs_emulator']:.2f} | "
                     f"{ms['now'] / r['horizon']:.3f} ({ms['before'] / r['horizon']:.3f}) | "
                     f"{'yes' if r['identical'] else 'NO'} | {r['load']} |")
    last = rows[-1]
    parts = ", ".join(f"{k} {100 * v:.0f} %" for k, v in last["profile_shares"].items())
    lines += ["", f"Where a reset's time goes now (cProfile of {2 * last['resets']} resets at {last['agents']:,} agents, "
              f"cumulative): {parts}."]
    if note:
        lines += ["", note]
    return "\n".join(lines)


def env_ms_per_tick(row: dict) -> dict[str, float]:
    """CPU ms inside each env's ``step_wait`` per tick of a `ppo_rate` row (all its runs)."""
    return {k: 1e3 * row[k]["env_cpu_s"] / (row[k]["steps"] * row["repeats"] / row["agents"]) for k in ("twin", "emulator")}


def ppo_reruns_text(reruns: list[dict]) -> str:
    """The ``--ppo`` runs of the code before and this code taken one after the other in one window
    (``ppo_reruns`` in results.json: ``{"code", "window", "rows"}`` per run, ``rows`` as `ppo_rate`'s)."""
    lines = ["**PPO reruns, the code before and this code in one window** (`python benchmarks/scale.py --ppo --twin DIR "
             "--no-write` with each code in turn, the same twin; *env ms per tick*: CPU ms inside `step_wait` per "
             "tick of the 100 or 1,000 sub-envs, resets included):", "",
             "| run | code | agents | twin / emulator (each pair) | twin env ms per tick | emulator env ms per tick | "
             "env: twin / emulator | load |",
             "|---:|---|---:|---:|---:|---:|---:|---|"]
    for i, run in enumerate(reruns):
        for r in run["rows"]:
            env = env_ms_per_tick(r)
            lines.append(f"| {i} | {run['code']} | {r['agents']:,} | {r['ratio']:.2f} "
                         f"({', '.join(f'{x:.2f}' for x in r['pairs'])}) | {env['twin']:.2f} | "
                         f"{env['emulator']:.2f} | {env['twin'] / env['emulator']:.2f} | {r['load']} |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ 4. the causal fit
def causal_profile(agents: int, days: int, seed: int = 0, rounds: int = 3, before: bool = False) -> dict:
    """The causal response model's fit against MAIL-MMSG's on the same multi-policy log (the causal-twin
    benchmark's log ``c1``: the SLO-aware heuristic + 10 % noise for ``days`` days, then a day on which
    10 % of the service groups are randomized into two arms; ``agents`` service groups x 96 ticks),
    2 members each, serially, the empirical population model (the same for both, left out), in this
    process: ``rounds`` rounds of both fits without a profiler, alternating which goes first (causal
    first in even rounds), each fit's CPU seconds and the round's ratio (the headline: the median of
    the rounds' ratios; each pair shares its minutes of the machine's load); then one more fit of each
    under cProfile for the cumulative time and calls of the functions where a fit's time goes (its CPU
    seconds are the profiled ones, inflated by the profiler in proportion to a fit's Python calls;
    the functions' times are CPU seconds). Each unprofiled fit also records where its CPU time goes
    by part and the training work of each (`_scale_causal_parts.watch_parts`).

    ``before``: every round also fits the causal model as before the selection's settled-band stop
    and its one-net folds (`edgetwin.imitation.causal.SELECTION_SETTLED` and `SELECTION_SHARED_FOLDS`
    off: the code before them, its held-out numbers to the bit on log c1), between the
    other two, in the round's order (``causal_before``): the stop's saving and ratio measured in the
    same minutes of the machine's load as the headline's."""
    import torch

    import edgetwin.imitation.causal as causal_mod

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from causal_twin import cluster_spec, log_regimes

    from edgetwin.emulator.cluster import ClusterConfig
    from edgetwin.emulator.logs import generate_logs
    from edgetwin.twin.twin import Twin

    torch.set_num_threads(1)
    cfg = ClusterConfig(n_agents=agents, steps=96)
    spec = cluster_spec(cfg)
    train, _ = generate_logs(cfg, regimes=log_regimes("c1", spec, seed, days), seed=seed)
    out: dict = {"rows": len(train), "agents": agents, "days": days, "members": 2, "rounds": []}
    watched = ("select_invariance", "_choose_invariances", "_train", "_train_stack", "fit_mail", "behaviour_clone",
               "build_steps", "fit_engines", "_fit_member")

    def fit(model: str, prof: cProfile.Profile | None = None) -> tuple[dict, Twin]:
        flags = causal_mod.SELECTION_SETTLED, causal_mod.SELECTION_SHARED_FOLDS
        causal_mod.SELECTION_SETTLED = causal_mod.SELECTION_SHARED_FOLDS = model != "causal_before"
        try:
            with _causal_parts.watch_parts() as rec:
                c, t = time.process_time(), time.perf_counter()
                if prof is not None:
                    prof.enable()
                twin = Twin.fit(train, spec, seed=seed, members=2, progress=False,
                                response_model="causal" if model == "causal_before" else model,
                                population_model="empirical", workers=1)
                if prof is not None:
                    prof.disable()
                times: dict[str, Any] = {"cpu_s": time.process_time() - c, "wall_s": time.perf_counter() - t}
        finally:
            causal_mod.SELECTION_SETTLED, causal_mod.SELECTION_SHARED_FOLDS = flags
        if prof is None:
            times.update(parts=_causal_parts.summary(rec), parts_total_cpu_s=rec["total_cpu_s"])
        if model != "mail":
            times["invariance_chosen"] = chosen_of(twin)
        return times, twin

    order = ("causal", "causal_before", "mail") if before else ("causal", "mail")
    for r in range(rounds):
        row: dict = {"first": "causal" if r % 2 == 0 else "mail", "load_before": load()}
        for model in (order if r % 2 == 0 else order[::-1]):
            row[model] = fit(model)[0]
        row["ratio_cpu"], row["load_after"] = row["causal"]["cpu_s"] / row["mail"]["cpu_s"], load()
        if before:
            row["ratio_cpu_before"] = row["causal_before"]["cpu_s"] / row["mail"]["cpu_s"]
        out["rounds"].append(row)
        print(f"round {r}: " + ", ".join(f"{m} {row[m]['cpu_s']:.1f}" for m in order) + f" CPU-s, ratio {row['ratio_cpu']:.2f}",
              file=sys.stderr, flush=True)
    for model in ("causal", "mail"):
        prof = cProfile.Profile(time.process_time)  # CPU seconds: the wall clock measures the load
        times, twin = fit(model, prof)
        st = pstats.Stats(prof, stream=io.StringIO()).stats  # type: ignore[attr-defined]
        cum = {f"{Path(f).name}:{name}": {"calls": v[1], "cum_s": v[3]} for (f, _, name), v in st.items() if name in watched}
        out[model] = {"profiled_cpu_s": times["cpu_s"], "profiled_wall_s": times["wall_s"], "functions": cum}
        if rounds:
            out[model]["cpu_s"] = float(np.median([row[model]["cpu_s"] for row in out["rounds"]]))
            out[model]["wall_s"] = float(np.median([row[model]["wall_s"] for row in out["rounds"]]))
        else:  # no unprofiled rounds: the profiled fits are the numbers (as before this option)
            out[model]["cpu_s"], out[model]["wall_s"] = times["cpu_s"], times["wall_s"]
        if model == "causal":  # the invariance weight of each member's client model of each scenario
            out[model]["invariance_chosen"] = chosen_of(twin)
    out["profile_clock"] = "CPU"
    out["ratio_cpu"] = (float(np.median([row["ratio_cpu"] for row in out["rounds"]])) if rounds
                        else out["causal"]["cpu_s"] / out["mail"]["cpu_s"])
    if before and rounds:
        out["causal_before"] = {"cpu_s": float(np.median([row["causal_before"]["cpu_s"] for row in out["rounds"]])),
                                "invariance_chosen": out["rounds"][-1]["causal_before"]["invariance_chosen"]}
        out["ratio_cpu_before"] = float(np.median([row["ratio_cpu_before"] for row in out["rounds"]]))
    out["load"] = load()
    return out


def chosen_of(twin: object) -> list[list[float]]:
    """The invariance weight of each member's causal client model of each scenario."""
    return [[float(cl.chosen) for _, cl in sorted(mem.clients.items())] for mem in twin.members]  # type: ignore[attr-defined]


def _steps_with_torch_adam(stack, opt, sched, steps: int) -> None:  # type: ignore[no-untyped-def]
    """``steps`` of `NetStack.run` as they were before `FlatAdam`: torch's foreach Adam and cosine
    schedule over the stack's parameters (kept here only to time and compare against)."""
    import torch as th

    for _ in range(steps):
        b = stack.batch
        idx = th.cat([g if len(g) <= b else g[th.randint(len(g), (b,), generator=stack.gen)] for g in stack.gt])
        stack._gradients(th.index_select(stack.xt, 0, idx), th.index_select(stack.yt, 0, idx))
        opt.step()
        sched.step()


def _torch_adam_stack():  # type: ignore[no-untyped-def]
    """`NetStack` as it trained before `FlatAdam` (torch's foreach Adam and cosine schedule; `keep`
    moving torch's Adam state), kept here only to time the choice of λ against."""
    import torch as th

    from edgetwin.imitation.causal import NetStack

    class TorchAdamStack(NetStack):
        def __init__(self, *a, **k) -> None:  # type: ignore[no-untyped-def]
            super().__init__(*a, **k)
            self.opt = th.optim.Adam([*self.weights, *self.biases], lr=self.model.lr, foreach=True)
            self.sched = th.optim.lr_scheduler.CosineAnnealingLR(self.opt, self.adam.steps)

        def run(self, until: int, history: list | None = None) -> None:
            _steps_with_torch_adam(self, self.opt, self.sched, until - self.step)
            self.step = max(self.step, until)

        def keep(self, which) -> None:  # type: ignore[no-untyped-def]
            ix = th.as_tensor(list(which), dtype=th.int64)
            group = self.opt.param_groups[0]
            state, fresh = {}, []
            for p in group["params"]:
                q = th.nn.Parameter(p.detach().index_select(0, ix).clone())
                old = self.opt.state.get(p, {})
                state[q] = {k: (v.index_select(0, ix).clone() if k != "step" and v.dim() else v.clone()) for k, v in old.items()}
                fresh.append(q)
            group["params"] = fresh
            self.opt.state.clear()
            self.opt.state.update(state)  # type: ignore[arg-type]
            n = len(self.weights)
            self.weights, self.biases = fresh[:n], fresh[n:]
            self.adam.keep(list(which))  # only for its gradient buffer, which `_gradients` writes
            self._grads = [th.from_numpy(v) for v in self.adam.views(self.adam.grad)]
            self.lam = self.lam.index_select(0, ix)
            self.lam_np = self.lam_np[list(which)]

    return TorchAdamStack


def choice_compared(rounds: int = 2, agents: int = 100, days: int = 4, seed: int = 0) -> dict:
    """CPU seconds of choosing λ on log c1 (`Twin.fit`'s `_choose_invariances`: every scenario's
    cross-fitting with successive halving, the causal fit's largest part) with `FlatAdam` (now) and
    with torch's Adam (before, `_torch_adam_stack`), alternating in this process, ``rounds`` each;
    the λ chosen per scenario by each."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from causal_twin import cluster_spec, log_regimes

    import edgetwin.imitation.causal as causal
    from edgetwin.emulator.cluster import ClusterConfig
    from edgetwin.emulator.logs import generate_logs
    from edgetwin.imitation.layout import Layout
    from edgetwin.imitation.mail import MailConfig
    from edgetwin.twin.logdata import load_log
    from edgetwin.twin.twin import _choose_invariances

    cfg_c = ClusterConfig(n_agents=agents, steps=96)
    spec = cluster_spec(cfg_c)
    train, _ = generate_logs(cfg_c, regimes=log_regimes("c1", spec, seed, days), seed=seed)
    df, spec = load_log(train, spec)
    df = df.sort_values(["episode", "t", "agent"], kind="stable").reset_index(drop=True)
    layout, cfg = Layout.fit(df, spec), MailConfig.from_hyper({})
    now_cls, before_cls = causal.NetStack, _torch_adam_stack()
    times: dict[str, list[float]] = {"now": [], "before": []}
    chosen: dict[str, list[float]] = {}
    try:
        for r in range(rounds):
            for which in (("now", "before") if r % 2 == 0 else ("before", "now")):
                causal.NetStack = now_cls if which == "now" else before_cls  # type: ignore[misc]
                c = time.process_time()
                got = _choose_invariances(df, layout, cfg, seed)
                times[which].append(time.process_time() - c)
                chosen[which] = [float(v.invariance) for _, v in sorted(got.items())]
    finally:
        causal.NetStack = now_cls  # type: ignore[misc]
    return {"rows": len(df), "rounds": rounds, "cpu_s": times, "chosen": chosen,
            "ratio": float(np.median([b / a for a, b in zip(times["now"], times["before"], strict=True)])), "load": load()}


def causal_adam_compared(rounds: int = 6, steps: int = 100, seed: int = 0) -> dict:
    """CPU ms per step of the causal fit's training (`NetStack.run`) with `FlatAdam` (now) and with
    torch's ``Adam(foreach=True)`` + ``CosineAnnealingLR`` (before), in this process, one thread,
    alternating round by round (``rounds`` rounds of ``steps`` steps each); on stacks of the shapes
    the causal fit of log c1 (``--causal-profile 100,4``) trains: 70 inputs, 24 outputs, hidden
    (64, 64), 3 policies of 95, 95 and 15,580 rows (random numbers: the time does not depend on
    them); *selection*: the 4 λ of a fold, 1,024 rows drawn per policy; *final*: one net, 4,096.
    Also the two fits' largest prediction gap after ``rounds * steps`` steps each, and the control:
    the gap between torch's fit and torch's fit from the same start with one weight of each net moved
    by one ulp (how far float rounding alone carries these fits)."""
    import torch as th

    from edgetwin.imitation.causal import GRID, CausalResponseModel, NetStack

    one_thread()
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((15_770, 70)).astype(np.float32)
    y = np.tanh(x[:, :24] + 0.3 * rng.standard_normal((15_770, 24))).astype(np.float32)
    codes = np.full(len(x), 2)
    codes[:95], codes[95:190] = 0, 1
    out: dict = {"rounds": rounds, "steps": steps, "stacks": []}
    total = rounds * steps
    for name, lams, batch in (("selection", GRID, 1024), ("final", (GRID[1],), 4096)):
        model = CausalResponseModel((64, 64), steps=total, batch=batch, seed=seed)
        now, before = NetStack(model, x, y, codes, lams, total, batch), NetStack(model, x, y, codes, lams, total, batch)
        opt = th.optim.Adam([*before.weights, *before.biases], lr=model.lr, foreach=True)
        sched = th.optim.lr_scheduler.CosineAnnealingLR(opt, total)
        times: dict[str, list[float]] = {"now": [], "before": []}
        for r in range(rounds):
            for which in (("now", "before") if r % 2 == 0 else ("before", "now")):
                c = time.process_time()
                if which == "now":
                    now.run(now.step + steps)
                else:
                    _steps_with_torch_adam(before, opt, sched, steps)
                times[which].append(1e3 * (time.process_time() - c) / steps)
        gap = max(float(np.abs(now.predict(x, i) - before.predict(x, i)).max()) for i in range(len(lams)))
        # the control: torch's Adam again from the same start but one weight of each net moved by one ulp
        nudged = NetStack(model, x, y, codes, lams, total, batch)
        first = nudged.adam.views(nudged.adam.theta)[0]  # (L, in, hidden): the nets' first layers
        first[:, 0, 0] = np.nextafter(first[:, 0, 0], np.float32(np.inf))
        n_opt = th.optim.Adam([*nudged.weights, *nudged.biases], lr=model.lr, foreach=True)
        _steps_with_torch_adam(nudged, n_opt, th.optim.lr_scheduler.CosineAnnealingLR(n_opt, total), total)
        control = max(float(np.abs(nudged.predict(x, i) - before.predict(x, i)).max()) for i in range(len(lams)))
        out["stacks"].append({"stack": name, "nets": len(lams), "batch": batch, "control_gap": control,
                              "ms_now": float(np.median(times["now"])), "ms_before": float(np.median(times["before"])),
                              "ratio": float(np.median([b / a for a, b in zip(times["now"], times["before"], strict=True)])),
                              "rounds_ms": times, "prediction_gap": gap, "output_scale": float(np.abs(y).max())})
    out["load"] = load()
    out["choice"] = choice_compared(seed=seed)
    return out


def causal_adam_text(ca: dict) -> str:
    parts = "; ".join(f"{r['stack']} ({r['nets']} net{'s' if r['nets'] > 1 else ''}, {r['batch']:,} rows per policy): "
                      f"{r['ms_before']:.2f} -> {r['ms_now']:.2f} ms a step, before / now {r['ratio']:.2f}x, the largest "
                      f"prediction gap after {ca['rounds'] * ca['steps']} steps {r['prediction_gap']:.1e} (torch's own fit "
                      f"with one weight of each net moved by one ulp: {r['control_gap']:.1e})"
                      for r in ca["stacks"])
    return ("**The causal fit's optimiser** (`python benchmarks/scale.py --causal-adam`: a training step of `NetStack` with "
            "Adam in numpy over one flat buffer (`FlatAdam`) against torch's foreach Adam and cosine schedule, in one "
            f"process, alternating, {ca['rounds']} rounds of {ca['steps']} steps, medians; stacks of the shapes the causal "
            f"fit of log c1 trains; load {ca['load']}): {parts}; outputs up to {ca['stacks'][0]['output_scale']:.2f}: "
            "a gap of the size one ulp's nudge alone leaves (float rounding, carried by the training)."
            + (choice_text(ca["choice"]) if ca.get("choice") else ""))


def choice_text(ch: dict) -> str:
    same = "the same λ" if ch["chosen"]["now"] == ch["chosen"]["before"] else "other λ"
    return (f" **Choosing λ on log c1** ({ch['rows']:,} rows, `Twin.fit`'s `_choose_invariances`: the three scenarios' "
            f"cross-fittings, the causal fit's largest part; the two optimisers alternating, {ch['rounds']} runs each, "
            f"load {ch['load']}): CPU s {', '.join(f'{v:.1f}' for v in ch['cpu_s']['before'])} before, "
            f"{', '.join(f'{v:.1f}' for v in ch['cpu_s']['now'])} now, before / now {ch['ratio']:.2f}x; {same} "
            f"({', '.join(f'{v:g}' for v in ch['chosen']['now'])} now, {', '.join(f'{v:g}' for v in ch['chosen']['before'])} before).")


# ------------------------------------------------------------------------------------ report
def exponent(rows: list[int], secs: list[float]) -> float:
    return float(np.polyfit(np.log(rows), np.log(secs), 1)[0]) if len(rows) > 1 else float("nan")


def peaks(f: dict) -> str:
    """A fit's peak memory cell: each process's own peak, and (when measured) all of them together."""
    cell = f"{f['peak_gib_main']:.2f} / {f['peak_gib_worker']:.2f}"
    if "peak_gib_total_pss" in f:
        cell += f" / {f['peak_gib_total_pss']:.2f} PSS ({f['peak_gib_total_rss']:.2f} RSS)"
    return cell


#: issue 47's targets: twin / emulator agent-steps per CPU-second, by agents
TICK_TARGETS = {1000: 1.0, 10_000: 1.5}


def tick_budget(throughput: list[dict], agents: int) -> float | None:
    """The CPU milliseconds a twin tick of ``agents`` agents may take to meet `TICK_TARGETS`, from the
    emulator's agent-steps per CPU-second in the same run's ``throughput`` rows (None: not measured)."""
    row = next((r for r in throughput if r["agents"] == agents and "emulator_cpu" in r), None)
    if row is None or agents not in TICK_TARGETS:
        return None
    return 1e3 * agents / (TICK_TARGETS[agents] * row["emulator_cpu"])


def _run_ticks(res: dict) -> str:
    """How many ticks a throughput run of ``res`` stepped, as the page says it."""
    return ", ".join(f"{r.get('ticks', 40)} ticks at {r['agents']:,} agents" for r in res["throughput"])


def section(res: dict) -> str:
    m = res["machine"]
    lines = [
        SECTION, "",
        f"Command: `{res['command']}`. Machine: {m}. Load average (1, 5, 15 min) is given beside every timing: "
        "this machine is shared by several sessions, so absolute times are pessimistic; compare ratios within a row.",
        "",
        f"**1. Fit time and peak memory** (twin: {res['twin']}; emulated-cluster logs, {res['agents']} service groups x 96 "
        "ticks per episode, random logging policy; each fit in a fresh process; peak = resident set of the fitting "
        "process / of its largest child process, i.e. pool worker; where given, / the peak of all of them together, "
        "sampled each second from /proc: the sum of their proportional sets (PSS: a page shared with a forked worker "
        "counted once) and, in brackets, of their resident sets (shared pages counted in each process, an upper bound)).",
        "",
        "| rows | mode | wall s | CPU s (main / workers) | peak GiB (main / worker / all together) | load before -> after |",
        "|---:|---|---:|---|---|---|",
    ]
    for f in res["fits"]:
        cpu = f"{f['cpu_s_main']:.0f} / {f['cpu_s_workers']:.0f}" if "cpu_s_main" in f else "-"
        lines.append(f"| {f['rows']:,} | {f['mode']} | {f['seconds']:.0f} | {cpu} | {peaks(f)} | "
                     f"{f['load_before']} -> {f['load_after']} |")
    for mode, e in res["exponent"].items():
        lines.append(f"\nTime ~ rows^{e:.2f} ({mode}).")
    if res.get("speedup"):
        lines.append("\n" + res["speedup"])
    extra = res.get("extra_runs", [])
    if extra:
        # one table of the other runs (results.json keeps them in the order they ran, with each run's
        # note); the page shows the latest run's note only: the earlier ones are history
        same = len({(r["twin"], r["agents"]) for r in extra}) == 1
        what = (f"twin: {extra[0]['twin']}; {extra[0]['agents']} service groups x 96 ticks per episode" if same
                else "twin and service groups per run")
        lines += ["", f"Other runs, oldest first (`extra_runs[i]` in results.json; {what}):", "",
                  "| run | command |" + ("" if same else " twin | groups |") + " rows | mode | wall s | "
                  "CPU s (main / workers) | peak GiB (main / worker / all together) | load before -> after |",
                  "|---:|---|" + ("" if same else "---|---:|") + "---:|---|---:|---|---|---|"]
        for i, run in enumerate(extra):
            for f in run["fits"]:
                cpu = f"{f['cpu_s_main']:.0f} / {f['cpu_s_workers']:.0f}" if "cpu_s_main" in f else "-"
                who = "" if same else f" {run['twin']} | {run['agents']} |"
                lines.append(f"| {i} | `{run['command']}` |{who} {f['rows']:,} | {f['mode']} | "
                             f"{f['seconds']:.0f} | {cpu} | {peaks(f)} | {f['load_before']} -> {f['load_after']} |")
        if extra[-1].get("note"):
            lines += ["", f"Run {len(extra) - 1}: {extra[-1]['note']}"]
    t = res["target_1m"]
    lines += ["", f"Target 1M rows <= 15 min and <= 8 GiB on 2 cores: {t}", "",
              "**2. Twin throughput** (agent-steps/s, uniformly random actions, one process, one thread each for torch, numexpr and the BLAS, "
              "no ensemble disagreement; best of 3 alternating runs of twin and emulator):", "",
              "| agents | twin | emulated cluster | twin / emulator | load |", "|---:|---:|---:|---:|---|"]
    before = [r for r in res["throughput"] if "twin_before" in r]
    if before:
        lines[-4] = ("**2. Twin throughput** (agent-steps/s, uniformly random actions, one process, one thread each for torch, numexpr and the BLAS, no "
                     f"ensemble disagreement; each number the best of {res['throughput'][0].get('rounds', 3)} runs, each run "
                     "a fresh process that steps the "
                     f"twin and then the emulator ({_run_ticks(res)}); the code before ({res.get('throughput_before', 'another checkout')}) "
                     "and this code alternate run by run on the same fitted twin; *wall*: agent-steps per second of "
                     "wall clock, *CPU*: per CPU-second of the stepping process, which leaves out the time other jobs "
                     "held the core):")
        lines[-2:] = ["| agents | clock | twin now | twin, code before | now / before | emulated cluster | twin / emulator "
                      "now (before) | load |", "|---:|---|---:|---:|---:|---:|---|---|"]
    for r in res["throughput"]:
        if "twin_before" in r:
            lines.append(f"| {r['agents']:,} | wall | {r['twin']:,.0f} | {r['twin_before']:,.0f} | {r['speedup']:.2f}x | "
                         f"{r['emulator']:,.0f} | {r['ratio']:.2f} ({r['ratio_before']:.2f}) | {r['load']} |")
            if "twin_cpu" in r:
                lines.append(f"| {r['agents']:,} | CPU | {r['twin_cpu']:,.0f} | {r['twin_cpu_before']:,.0f} | "
                             f"{r['speedup_cpu']:.2f}x | {r['emulator_cpu']:,.0f} | {r['ratio_cpu']:.2f} "
                             f"({r['ratio_cpu_before']:.2f}) | |")
        else:
            lines.append(f"| {r['agents']:,} | {r['twin']:,.0f} | {r['emulator']:,.0f} | {r['ratio']:.2f} | {r['load']} |")
    paired = [r for r in res["throughput"] if r.get("paired_cpu")]
    if paired:
        lines += ["", "Per run (twin / emulator per CPU-second, both stepped in the same process, so each pair shares "
                  "its minutes of the load): " + "; ".join(
                      f"{r['agents']:,} agents median {np.median(r['paired_cpu']):.2f} "
                      f"(runs {', '.join(f'{x:.2f}' for x in r['paired_cpu'])})"
                      + (f", code before median {np.median(r['paired_cpu_before']):.2f} "
                         f"({', '.join(f'{x:.2f}' for x in r['paired_cpu_before'])})" if r.get("paired_cpu_before") else "")
                      for r in paired) + "."]
    if res.get("throughput_twin"):
        lines += ["", f"Part 2 was rerun on its own: `{res.get('throughput_command')}`; twin stepped: "
                  f"{res['throughput_twin']}."]
    if res.get("throughput_note"):
        lines += ["", res["throughput_note"]]
    for ph in res.get("tick_phases", []):
        budget = tick_budget(res["throughput"], ph["agents"])
        old = next((b for b in res.get("tick_phases_before", []) if b["agents"] == ph["agents"]), None)
        passes = (f"; the fastest of {ph['passes']} passes of {ph['ticks']} ticks, in one process" if ph.get("passes")
                  else "")
        lines += ["", f"Where a tick's CPU time goes at {ph['agents']:,} agents (`tick_phases`: timers around each "
                  f"phase, inclusive, ms per tick{passes}; the tick {ph['tick_ms']:.2f} ms; load {ph['load']})"
                  + (f"; the target ({TICK_TARGETS[ph['agents']]:g}x the emulator) needs a tick of {budget:.2f} ms: "
                     f"{ph['agents']:,} agent-steps at {TICK_TARGETS[ph['agents']]:g}x the emulator's "
                     "agent-steps per CPU-second in the throughput rows above" if budget else "")
                  + (f"; *code before*: the same timers on {res.get('throughput_before', 'the code before')} in a "
                     f"fresh process of the same run (its tick {old['tick_ms']:.2f} ms, load {old['load']})" if old else "")
                  + ":", ""]
        if old:
            lines += ["| phase | ms per tick | share | code before, ms per tick |", "|---|---:|---:|---:|"]
            names = list(ph["phases_ms"]) + [k for k in old["phases_ms"] if k not in ph["phases_ms"]]
            names = [k for k in names if k != "other"] + ["other"]
            for k in names:
                v, b = ph["phases_ms"].get(k), old["phases_ms"].get(k)
                now, share = ("-", "-") if v is None else (f"{v:.3f}", f"{100 * v / ph['tick_ms']:.0f} %")
                lines.append(f"| {k} | {now} | {share} | {'-' if b is None else f'{b:.3f}'} |")
            lines.append(f"| the tick | {ph['tick_ms']:.3f} | 100 % | {old['tick_ms']:.3f} |")
        else:
            lines += ["| phase | ms per tick | share |", "|---|---:|---:|"]
            for k, v in ph["phases_ms"].items():
                lines.append(f"| {k} | {v:.3f} | {100 * v / ph['tick_ms']:.0f} % |")
    if res.get("ppo"):
        lines += ["", ppo_text(res["ppo"])]
        if res.get("ppo_note"):
            lines += ["", res["ppo_note"]]
    if res.get("reset"):
        lines += ["", reset_text(res["reset"], res.get("reset_note"))]
    if res.get("ppo_reruns"):
        lines += ["", ppo_reruns_text(res["ppo_reruns"])]
    if res.get("causal_adam"):
        lines += ["", causal_adam_text(res["causal_adam"])]
    cf = res.get("causal_fit")
    if cf:
        lines += ["", f"**4. The causal fit against MAIL-MMSG** (`python benchmarks/scale.py --causal-profile {cf['agents']},{cf['days']}`: "
                  f"the causal-twin benchmark's log c1, {cf['rows']:,} rows, 3 logged policies, {cf['members']} members each, serially, "
                  f"the empirical population model; load {cf['load']}): causal {cf['causal']['cpu_s']:.0f} CPU-s, MAIL-MMSG "
                  f"{cf['mail']['cpu_s']:.0f} CPU-s: **{cf['ratio_cpu']:.2f}x** (target 1.5x).", "",
                  "| fit | function | calls | cumulative s (cProfile, wall clock) |", "|---|---|---:|---:|"]
        for model in ("causal", "mail"):
            for fn, v in sorted(cf[model]["functions"].items(), key=lambda kv: -kv[1]["cum_s"]):
                lines.append(f"| {model} | `{fn}` | {v['calls']} | {v['cum_s']:.1f} |")
        if res.get("causal_note"):
            lines += ["", res["causal_note"]]
    if res.get("throughput_kpis"):
        lines += ["", kpis_text(res["throughput_kpis"], res.get("throughput_before", "the code before"))]
    for key, agents, ticks in (("profile_tick", "1,000", 40), ("profile_tick_10k", "10,000", 20)):
        if not res.get(key):
            continue
        lines += ["", f"Top of a cProfile of the twin's tick at {agents} agents ({ticks} ticks, own time):", "",
                  "| function | calls | own s | share |", "|---|---:|---:|---:|"]
        for p in res[key]:
            lines.append(f"| `{p['function']}` | {p['calls']} | {p['own_s']:.3f} | {100 * p['share']:.0f} % |")
    for k, cf in enumerate(res.get("cap_fidelity", [])):
        text = cap_fidelity_text(cf)
        lines += ["", text if k == 0 else text.replace("**3. The behaviour-cloning cap and fidelity**",
                                                      "**3, on a larger log**", 1)]
    lines += ["", "The decision path's latency (NATS request/reply) is measured by benchmarks/edge_latency.py: see "
              "its section, \"Edge decision latency\"."]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------ 3. the BC cap's fidelity
def cap_fit_eval(rows: int, cap: int, seed: int, agents: int = AGENTS, population_steps: int = 500) -> dict:
    """Fit a 1-member default twin with ``bc_max_steps=cap`` (0: no cap) on ``rows`` rows of
    emulated-cluster logs and score it on held-out days (run in a subprocess by `cap_fidelity`).

    Scores: one-step (teacher-forced, mean response) error of every output on 2 held-out days of
    the logging policy, in units of the output's held-out std; the replay error (own predictions
    fed back, logged actions) at 1, 24 and 96 ticks (`replay_errors`, standardised units); and
    the ranking of the quick twin-fidelity run's policies (2 evaluation days of ``agents`` agents
    each, real cluster against the twin, the twin drawing its own population).
    """
    import pandas as pd
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks"))
    from twin_fidelity import ranking_policies, ranking_scores

    from edgetwin.contract.policy import RandomPolicy
    from edgetwin.emulator.cluster import ClusterConfig
    from edgetwin.emulator.logs import generate_logs
    from edgetwin.twin.fidelity import one_step_outputs, replay_errors
    from edgetwin.twin.twin import Twin

    torch.set_num_threads(1)
    cfg = ClusterConfig(n_agents=agents, steps=96)
    episodes = max(2, int(round(rows / (agents * 96))))
    df, spec = generate_logs(cfg, episodes=episodes, seed=seed)
    t0, c0 = time.perf_counter(), time.process_time()
    twin = Twin.fit(df, spec, seed=seed, members=1, progress=False, population_hyper={"steps": population_steps},
                    bc_max_steps=cap)
    fit_s, fit_cpu = time.perf_counter() - t0, time.process_time() - c0
    n_rows = len(df)
    del df
    held, _ = generate_logs(cfg, episodes=2, policy=RandomPolicy(spec, seed + 1000), seed=seed + 1000)
    one = one_step_outputs(twin, held, seed=seed, stochastic=False)
    keys = ["episode", "t", "agent"]
    both = held.astype({k: str for k in keys}).merge(one.astype({k: str for k in keys}), on=keys, suffixes=("", "_twin"))
    outs = [c for c in twin.layout.outputs if f"{c}_twin" in both]
    one_step = {c: float((both[c] - both[f"{c}_twin"]).abs().mean() / max(both[c].std(), 1e-12)) for c in outs}
    rep = replay_errors(twin, held, max_horizon=96, max_episodes=2).set_index("h")
    rank = []
    for i, (name, pol) in enumerate(ranking_policies(spec, twin).items()):
        real, _ = generate_logs(cfg, episodes=2, policy=pol, seed=seed + 500)
        virt = twin.rollout(pol, episodes=2, seed=seed + 500 + i, n_agents=agents, steps=96)
        rank.append({"policy": name, "real": float(real["reward"].mean()), "twin": float(virt["reward"].mean())})
    sc = ranking_scores(pd.DataFrame(rank), "twin")
    return {"rows": n_rows, "cap": cap, "fit_seconds": fit_s, "fit_cpu_seconds": fit_cpu,
            "one_step_mean": float(np.mean(list(one_step.values()))), "one_step": one_step,
            "replay": {str(h): {"outputs": float(rep.loc[h, "outputs"]), "state": float(rep.loc[h, "state"])}
                       for h in (1, 24, 95) if h in rep.index},
            "spearman": sc["spearman"], "rel_err": sc["rel_err"], "regret_at_1": sc["regret_at_1"],
            "policies": rank, "load_after": load()}


def cap_fidelity(rows: int, seed: int, caps: tuple[int, ...]) -> dict:
    """`cap_fit_eval` for each cap, each in its own process, all at once (one core each)."""
    procs = []
    for cap in caps:
        args = json.dumps({"rows": rows, "cap": cap, "seed": seed})
        procs.append(subprocess.Popen([sys.executable, __file__, "--_capfit", args], stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    before = load()
    out = []
    for p in procs:
        so, se = p.communicate()
        if p.returncode != 0:
            raise SystemExit(f"cap fidelity fit failed:\n{se[-3000:]}")
        out.append(json.loads(so.strip().splitlines()[-1]))
    return {"rows": rows, "seed": seed, "load_before": before, "runs": out,
            "command": f"python benchmarks/scale.py --cap-fidelity {rows} --caps {','.join(map(str, caps))}"}


def cap_fidelity_text(cf: dict) -> str:
    runs = cf["runs"]
    rows = runs[0]["rows"] if runs else cf["rows"]
    lines = [f"**3. The behaviour-cloning cap and fidelity** (`{cf['command']}`: a 1-member twin with the default "
             f"hyper-parameters but GAN-SMMSG 500 steps, fitted on {rows:,} rows with each cap, the fits side by side, "
             "one core each; scored on 2 held-out days of the logging policy and on the quick fidelity run's 11 "
             "policies, 2 days each; one-step: teacher-forced mean response, mean over outputs of |error| / held-out "
             "std; replay: the twin's own predictions fed back under the logged actions, standardised units):", "",
             "| bc_max_steps | fit s (CPU s) | one-step error | replay outputs / state, h=1 | h=24 | h=95 | "
             "ranking Spearman | mean rel. error | regret@1 |",
             "|---|---|---:|---|---|---|---:|---:|---:|"]
    for r in runs:
        rep = r["replay"]
        cells = [f"{rep[h]['outputs']:.3f} / {rep[h]['state']:.3f}" if h in rep else "-" for h in ("1", "24", "95")]
        lines.append(f"| {r['cap'] or 'none'} | {r['fit_seconds']:.0f} ({r['fit_cpu_seconds']:.0f}) | "
                     f"{r['one_step_mean']:.4f} | {' | '.join(cells)} | {r['spearman']:.2f} | "
                     f"{100 * r['rel_err']:.1f} % | {r['regret_at_1']:.2f} |")
    lines.append(f"\nLoad before -> after: {cf['load_before']} -> {', '.join(r['load_after'] for r in runs)}.")
    return "\n".join(lines)


def target_1m(fits: list[dict], expo: dict[str, float]) -> tuple[str, float]:
    """The 1M-row verdict: measured when a fit of ~1M rows ran, else extrapolated from the fastest
    mode at the largest size when its exponent says time grows with rows (>= 0.5); below that the
    sizes were dominated by fixed costs (population model, GAIL rounds, worker start-up) and any
    extrapolation would be fiction."""
    own = [f for f in fits if "," not in f["mode"]]
    measured = [f for f in own if f["rows"] >= 950_000]
    if measured:
        # one run's time and memory, never the fastest run's time beside another run's memory: the
        # latest run that measured its processes together (runs are kept in the order they ran, and a
        # later one measures the later code), else the latest run
        together = [g for g in measured if "peak_gib_total_pss" in g]
        f = together[-1] if together else measured[-1]
        if together:
            peak = f["peak_gib_total_pss"]
            what = "the fitting process and its workers together, PSS"
        else:
            peak = max(f["peak_gib_main"], f["peak_gib_worker"])
            what = "the largest single process; the processes were not measured together"
        ok = f["seconds"] <= 900 and peak <= 8
        return (f"measured in one run, {f['seconds'] / 60:.1f} min ({f['mode']}) and {peak:.2f} GiB ({what}): "
                f"{'met' if ok else 'MISSED' + (' (memory)' if f['seconds'] <= 900 else '')}.", f["seconds"])
    largest = max(f["rows"] for f in own)
    best = min((f for f in own if f["rows"] == largest), key=lambda f: f["seconds"])
    e = expo.get(best["mode"], float("nan"))
    if not np.isfinite(e) or e < 0.5:
        return (f"not measured at 1M rows in this run, and not extrapolated: at these sizes time hardly grows with "
                f"rows (exponents {', '.join(f'{m} {v:.2f}' for m, v in expo.items())}; fixed costs and the load "
                "dominate).", float("nan"))
    est = best["seconds"] * (1_000_000 / best["rows"]) ** e
    return (f"not measured at 1M rows in this run; extrapolated from {best['mode']} at {largest:,} rows with "
            f"exponent {e:.2f}: {est / 60:.0f} min.", est)


def tick_phases_of(twin_dir: Path, n: int, pkg: Path) -> dict:
    """`tick_phases` with the edgetwin package of ``pkg`` (another checkout), in a fresh interpreter."""
    env = dict(os.environ, PYTHONPATH=str(pkg))
    res = subprocess.run([sys.executable, __file__, "--_phases", json.dumps({"twin": str(twin_dir), "n": n})],
                         env=env, capture_output=True, text=True)
    if res.returncode != 0:
        raise SystemExit(f"tick phases of {pkg} failed:\n{res.stderr[-3000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def throughput_only(args: argparse.Namespace) -> None:
    """Part 2 alone: rewrite results.json's throughput and tick profile, keep its fits."""
    twin_dir = args.twin
    twin_desc = f"{twin_dir}"
    if twin_dir is None:
        hyper = {"members": 2, "rounds": 2, "bc_epochs": 5, "population_steps": 300, "quick": True}
        twin_dir = Path(tempfile.mkdtemp(prefix="edgetwin-scale-")) / "twin"
        rec = timed_fit(19_200, 1, hyper, args.seed, None, None, twin_dir)
        twin_desc = (f"the quick twin (2 members, 2 MAIL rounds, 5 BC epochs, 300 GAN steps) fitted serially on "
                     f"{rec['rows']:,} rows of emulated-cluster logs, seed {args.seed}")
    tp = [throughput_compared(twin_dir, (n,), throughput_ticks(n), args.compare_with, rounds=args.rounds)[0]
          for n in (1000, 10_000)]
    for row in tp:
        row["rounds"] = args.rounds
    phases = [tick_phases(twin_dir, n, throughput_ticks(n)) for n in (1000, 10_000)]
    phases_before = [tick_phases_of(twin_dir, n, args.compare_with) for n in (1000, 10_000)] if args.compare_with else []
    prof = profile_tick(twin_dir, 1000, 40)
    prof_10k = profile_tick(twin_dir, 10_000, 20)
    res = json.loads((OUT / "results.json").read_text()) if (OUT / "results.json").is_file() else {}
    if args.compare_with:
        res["throughput_kpis"] = kpis_compared(twin_dir, args.compare_with)
    else:
        res.pop("throughput_kpis", None)
    res.update(throughput=tp, tick_phases=phases, tick_phases_before=phases_before, profile_tick=prof, profile_tick_10k=prof_10k, throughput_twin=twin_desc,
               throughput_command="python benchmarks/scale.py --throughput-only"
               + (" --twin DIR" if args.twin is not None else "")
               + (" --compare-with BEFORE" if args.compare_with else "")
               + (f" --rounds {args.rounds}" if args.rounds != 3 else ""))
    if args.compare_with:
        res["throughput_before"] = str(args.compare_with)
    print(json.dumps({k: res[k] for k in ("throughput", "profile_tick")}, indent=1, default=float))
    if not args.no_write and "fits" in res:
        (OUT / "results.json").write_text(json.dumps(res, indent=1, default=float))
        _docs.write_section(SECTION, section(res), keep=("### Profile of a default fit",))


def report_result(key: str, value: object, text: str, no_write: bool) -> None:
    """Print a run's JSON and its rendered text; unless ``no_write``, store it (`store_result`)."""
    print(json.dumps(value, indent=1, default=float))
    print(text)
    if not no_write:
        store_result(key, value)


def store_result(key: str, value: object) -> None:
    """Set ``key`` of results.json to ``value`` and render the ``## Scale`` section from it."""
    res = json.loads((OUT / "results.json").read_text())
    res[key] = value
    (OUT / "results.json").write_text(json.dumps(res, indent=1, default=float))
    _docs.write_section(SECTION, section(res), keep=("### Profile of a default fit",))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small sizes and a small twin (minutes)")
    ap.add_argument("--rows", default=None, help="comma-separated log sizes (default 100000,300000,1000000)")
    ap.add_argument("--modes", default="serial,pool", help="serial and/or pool")
    ap.add_argument("--ray", default=None, help="fit the 'pool' rows on this Ray cluster instead")
    ap.add_argument("--compare-with", type=Path, default=None,
                    help="a checkout of the edgetwin package to fit the first size serially with (a before/after ratio)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-write", action="store_true")
    ap.add_argument("--append", action="store_true",
                    help="keep results.json's runs and add this run's fits as a table of their own (e.g. the default "
                         "twin on 1M rows beside the quick run)")
    ap.add_argument("--render", action="store_true", help="rewrite the section from results.json (no runs)")
    ap.add_argument("--throughput-only", action="store_true",
                    help="rerun part 2 only (a quick twin fitted on 19,200 rows unless --twin), keep part 1's fits "
                         "from results.json; with --compare-with, the before code's twin throughput beside it")
    ap.add_argument("--twin", type=Path, default=None, help="--throughput-only: step this fitted twin")
    ap.add_argument("--rounds", type=int, default=3,
                    help="--throughput-only: alternating runs per size and code (the best and every pair are reported); "
                         "--causal-profile: alternating rounds of the two fits without the profiler (0: the profiled fits only)")
    ap.add_argument("--cap-fidelity", type=int, default=None, metavar="ROWS",
                    help="part 3 only: fit a 1-member twin on ROWS rows with each --caps value of bc_max_steps and "
                         "score them on held-out days; keeps the rest of results.json")
    ap.add_argument("--caps", default="0,5000", help="--cap-fidelity: bc_max_steps values (0: no cap)")
    ap.add_argument("--ppo", action="store_true",
                    help="part 2b only: SB3 PPO's env steps per CPU-second in the twin (--twin DIR) and the emulator, "
                         "and the share of its time in the env's tick vs its update; keeps the rest of results.json")
    ap.add_argument("--ppo-steps", type=int, default=40_000, help="--ppo: environment steps per run")
    ap.add_argument("--causal-adam", action="store_true",
                    help="the causal fit's training step with FlatAdam vs torch's Adam, in one process")
    ap.add_argument("--reset", action="store_true",
                    help="the twin's episode reset now vs the code before vs the emulator's, in one process (needs --twin)")
    ap.add_argument("--causal-profile", default=None, metavar="AGENTS,DAYS",
                    help="part 4 only: the causal fit's CPU time against MAIL-MMSG's on the same multi-policy log "
                         "(AGENTS service groups, DAYS production days + 1 randomized day) and where it goes")
    ap.add_argument("--causal-before", action="store_true",
                    help="--causal-profile: every round also fits the causal model as before the selection's settled-band "
                         "stop and one-net folds (SELECTION_SETTLED, SELECTION_SHARED_FOLDS off), alternating with the other "
                         "two: the before/after in one run")
    ap.add_argument("--results", type=Path, default=RESULTS,
                    help="the JSON the fit runs (--rows, --causal-profile) go to (default: results.json, and the page's "
                         "'## Scale' section); another file (e.g. docs/benchmarks/scale/fit.json) keeps its other keys "
                         "and renders the page's '## The fit' section")
    ap.add_argument("--fit-only", action="store_true", help="--rows: the fits only (no twin throughput or tick profile)")
    ap.add_argument("--_fit", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--_capfit", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--_throughput", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--_kpis", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--_phases", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args._phases:
        a = json.loads(args._phases)
        print(json.dumps(tick_phases(Path(a["twin"]), a["n"], throughput_ticks(a["n"]))))
        return
    if args._kpis:
        a = json.loads(args._kpis)
        print(json.dumps(rollout_kpis(Path(a["twin"]), a["seeds"], a["agents"])))
        return
    if args._throughput:
        a = json.loads(args._throughput)
        print(json.dumps(throughput(Path(a["twin"]), a["n"], a["ticks"], rounds=1, seed=a["seed"])))
        return
    if args._capfit:
        a = json.loads(args._capfit)
        print(json.dumps(cap_fit_eval(a["rows"], a["cap"], a["seed"]), default=float))
        return
    if args.throughput_only:
        throughput_only(args)
        return
    if args.causal_profile:
        agents, days = (int(v) for v in args.causal_profile.split(","))
        cp = causal_profile(agents, days, args.seed, args.rounds, before=args.causal_before)
        print(json.dumps(cp, indent=1, default=float))
        if not args.no_write:
            store_fits(args.results, {"causal_fit": cp})
        return
    if args.causal_adam:
        ca = causal_adam_compared(seed=args.seed)
        report_result("causal_adam", ca, causal_adam_text(ca), args.no_write)
        return
    if args.reset:
        if args.twin is None:
            raise SystemExit("--reset needs --twin DIR (a fitted twin, e.g. the one --throughput-only steps)")
        rows = [reset_compared(args.twin, n, seed=args.seed) for n in (100, 1000)]
        report_result("reset", rows, reset_text(rows), args.no_write)
        return
    if args.ppo:
        if args.twin is None:
            raise SystemExit("--ppo needs --twin DIR (a fitted twin, e.g. the one --throughput-only steps)")
        rows = [ppo_rate(args.twin, n, args.ppo_steps, args.seed) for n in (100, 1000)]
        report_result("ppo", rows, ppo_text(rows), args.no_write)
        return
    if args.cap_fidelity:
        cf = cap_fidelity(args.cap_fidelity, args.seed, tuple(int(c) for c in args.caps.split(",")))
        print(json.dumps(cf, indent=1, default=float))
        print(cap_fidelity_text(cf))
        if not args.no_write:
            res = json.loads((OUT / "results.json").read_text())
            # one entry per log size: a rerun at a size replaces that size's entry
            res["cap_fidelity"] = sorted([c for c in res.get("cap_fidelity", []) if c["rows"] != cf["rows"]] + [cf],
                                         key=lambda c: c["rows"])
            (OUT / "results.json").write_text(json.dumps(res, indent=1, default=float))
            _docs.write_section(SECTION, section(res), keep=("### Profile of a default fit",))
        return
    if args.render and args.results.resolve() != RESULTS.resolve():
        res = json.loads(args.results.read_text())
        _docs.write_section(FIT_SECTION, fit_section(res, _rel(args.results)), doc=OUT / "README.md", keep=("### ",))
        return
    if args.render:
        res = json.loads((OUT / "results.json").read_text())
        every = res["fits"] + [f for r in res.get("extra_runs", []) for f in r["fits"]]
        res["target_1m"], res["extrapolated_1m_seconds"] = target_1m(every, res["exponent"])
        (OUT / "results.json").write_text(json.dumps(res, indent=1, default=float))
        _docs.write_section(SECTION, section(res), keep=("### Profile of a default fit",))
        return
    if args._fit:
        a = json.loads(args._fit)
        hyper = {k: v for k, v in a["hyper"].items() if k != "quick"}
        print(json.dumps(fit_once(a["rows"], a["workers"], hyper, a["seed"], a["ray"], Path(a["out"]), a["agents"])))
        return
    if args.quick:
        rows = [int(x) for x in (args.rows or "19200,38400,76800").split(",")]
        hyper = {"members": 2, "rounds": 2, "bc_epochs": 5, "population_steps": 300, "quick": True}
        twin_desc = "quick: 2 members, 2 MAIL rounds, 5 BC epochs, 300 GAN steps"
    else:
        rows = [int(x) for x in (args.rows or "100000,300000,1000000").split(",")]
        hyper = {"members": 5}
        twin_desc = "defaults: 5 members, 10 MAIL rounds, 20 BC epochs (at most 5000 gradient steps per model), 3000 GAN steps"
    modes = [m.strip() for m in args.modes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="edgetwin-scale-"))
    fits = []
    if args.compare_with is not None:
        rec = timed_fit(rows[0], 1, hyper, args.seed, None, args.compare_with, work / "before")
        rec["mode"] = f"serial, {args.compare_with}"
        fits.append(rec)
        print(rec, flush=True)
    for n in rows:
        for mode in modes:
            rec = timed_fit(n, 1 if mode == "serial" else 0, hyper, args.seed, args.ray if mode == "pool" else None,
                            None, work / f"{mode}_{n}")
            rec["mode"] = mode if mode == "serial" or not args.ray else f"Ray {args.ray}"
            fits.append(rec)
            print(rec, flush=True)
    expo = {}
    for mode in {f["mode"] for f in fits if "," not in f["mode"]}:
        sel = [f for f in fits if f["mode"] == mode]
        expo[mode] = exponent([f["rows"] for f in sel], [f["seconds"] for f in sel])
    speed = ""
    if args.compare_with is not None:
        before = fits[0]
        after = next(f for f in fits if f["mode"] == "serial" and f["rows"] == before["rows"])
        speed = (f"Serial fit of {before['rows']:,} rows: {before['seconds']:.0f} s with {args.compare_with} vs "
                 f"{after['seconds']:.0f} s now ({before['seconds'] / after['seconds']:.2f}x).")
    target, est = target_1m(fits, expo)
    twin_dir = work / f"{modes[0]}_{rows[0]}"
    tp = [] if args.fit_only else [throughput(twin_dir, n, 20) for n in (1000, 10_000)]
    prof = [] if args.fit_only else profile_tick(twin_dir, 1000, 40)
    import torch

    res = {
        "command": "python benchmarks/scale.py" + (" --quick" if args.quick else "")
        + (f" --rows {args.rows}" if args.rows else "") + (f" --modes {args.modes}" if args.modes != "serial,pool" else "")
        + (f" --compare-with {args.compare_with}" if args.compare_with else "") + (" --append" if args.append else "")
        + (" --fit-only" if args.fit_only else "")
        + (f" --results {_rel(args.results)}" if args.results.resolve() != RESULTS.resolve() else ""),
        "machine": f"{os.cpu_count()} CPU cores shared with other sessions, {platform.machine()}, Python "
        f"{platform.python_version()}, torch {torch.__version__}",
        "twin": twin_desc, "agents": QUICK_AGENTS if args.quick else AGENTS, "fits": fits, "exponent": expo, "speedup": speed, "target_1m": target,
        "extrapolated_1m_seconds": est, "throughput": tp, "profile_tick": prof,
    }
    print(json.dumps(res, indent=1, default=float))
    if not args.no_write:
        OUT.mkdir(parents=True, exist_ok=True)
        if args.results.resolve() != RESULTS.resolve():
            store_fits(args.results, res, append=args.append)
            return
        if args.append and (OUT / "results.json").is_file():
            res = append_run(json.loads((OUT / "results.json").read_text()), res)
        (OUT / "results.json").write_text(json.dumps(res, indent=1, default=float))
        _docs.write_section(SECTION, section(res), keep=("### Profile of a default fit",))


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def store_fits(path: Path, run: dict, append: bool = False) -> None:
    """Write a fit run (``--rows``, or ``{"causal_fit": ...}``) into ``path`` and render the page's
    ``## The fit`` section from it (the default results.json and ``## Scale`` are written by `main`).

    A ``--rows`` run replaces the file's fits (with ``append``: adds them as an extra run, as
    results.json's runs); its other keys (the causal profile) stay."""
    res = json.loads(path.read_text()) if path.is_file() else {}
    if "causal_fit" in run and "fits" not in run:
        # the runs before stay, as ``history`` (oldest first; each without its own history)
        old = res.get("causal_fit")
        history = ([*old.get("history", []), {k: v for k, v in old.items() if k != "history"}] if old else [])
        res["causal_fit"] = {**run["causal_fit"], "history": history}
    elif append and res.get("fits"):
        res = append_run(res, run)
    else:
        res.pop("note", None)  # a note is about the run it came with
        res.update(run)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(res, indent=1, default=float))
    _docs.write_section(FIT_SECTION, fit_section(res, _rel(path)), doc=OUT / "README.md", keep=("### ",))


def fit_section(res: dict, source: str) -> str:
    """The ``## The fit`` section: the causal fit against MAIL-MMSG's on one multi-policy log, and the
    default twin's fit at 1M rows with where its time goes (CPU seconds per phase)."""
    lines = [FIT_SECTION, "", f"Numbers from `{source}` (issue 47's fit targets). This machine is shared by several "
             "sessions: wall times are inflated by their load, CPU seconds much less so.", ""]
    cp = res.get("causal_fit")
    if cp:
        lines += causal_fit_lines(cp, source)
    fits = [f for f in res.get("fits", [])] + [f for r in res.get("extra_runs", []) for f in r["fits"]]
    if fits:
        lines += [f"**The default twin's fit** (`{res.get('command', '')}`; twin: {res.get('twin', '')}):", "",
                  "| rows | mode | wall s | CPU s (main / workers) | peak GiB (main / worker / all together) | load before -> after |",
                  "|---:|---|---:|---|---|---|"]
        for f in fits:
            lines.append(f"| {f['rows']:,} | {f['mode']} | {f['seconds']:.0f} | {f['cpu_s_main']:.0f} / {f['cpu_s_workers']:.0f} | "
                         f"{peaks(f)} | {f['load_before']} -> {f['load_after']} |")
        last = fits[-1]
        if last.get("phases"):
            lines += ["", f"Phases of the last fit ({last['rows']:,} rows): CPU seconds of the fitting process, of its pool "
                      "workers, and wall seconds:", "", "| phase | CPU s main | CPU s workers | wall s |", "|---|---:|---:|---:|"]
            lines += [f"| `{k}` | {v['cpu_main']:.1f} | {v['cpu_workers']:.1f} | {v['wall']:.1f} |" for k, v in last["phases"].items()]
        if res.get("note"):
            lines += ["", res["note"]]
        ok = last["rows"] >= 950_000 and last["seconds"] <= 300 and last.get("peak_gib_total_pss", 99) <= 6
        lines += ["", f"Target 1M rows <= 5 min and <= 6 GiB PSS in one run: {'met' if ok else 'MISSED'} in the last run "
                  f"({last['seconds'] / 60:.1f} min, {last.get('peak_gib_total_pss', float('nan')):.2f} GiB)."]
    return "\n".join(lines)


def causal_fit_lines(cp: dict, source: str) -> list[str]:
    """The page's lines for ``--causal-profile``'s run ``cp``: the rounds' CPU seconds and ratios
    (or, for a run without rounds, its profiled fits), the verdict, λ, and the profile's table."""
    c, m = cp["causal"], cp["mail"]
    rounds = cp.get("rounds") or []
    verdict = f"(target <= 1.5x: {'met' if cp['ratio_cpu'] <= 1.5 else 'MISSED'})"
    if rounds:
        each = ", ".join(f"{r['ratio_cpu']:.2f}" for r in rounds)
        flag = " --causal-before" if cp.get("causal_before") else ""
        lines = [f"**The causal fit against MAIL-MMSG's** (`python benchmarks/scale.py --causal-profile "
                 f"{cp['agents']},{cp['days']} --rounds {len(rounds)}{flag} --results {source}`; the causal-twin benchmark's log c1, "
                 f"{cp['rows']:,} rows, {cp['members']} members each, serially, one process; {len(rounds)} rounds of both fits "
                 "without a profiler, alternating which goes first; CPU seconds of the process):", "",
                 "| round | first | causal CPU s | MAIL-MMSG CPU s | causal / MAIL-MMSG | load before -> after |",
                 "|---:|---|---:|---:|---:|---|"]
        lines += [f"| {i} | {'causal' if r['first'] == 'causal' else 'MAIL-MMSG'} | {r['causal']['cpu_s']:.1f} | "
                  f"{r['mail']['cpu_s']:.1f} | {r['ratio_cpu']:.2f} | {r['load_before']} -> {r['load_after']} |"
                  for i, r in enumerate(rounds)]
        lines += ["", f"Causal / MAIL-MMSG CPU: **{cp['ratio_cpu']:.2f}x**, the median of the rounds' ratios "
                  f"({each}; medians of the fits: causal {c['cpu_s']:.1f}, "
                  f"MAIL-MMSG {m['cpu_s']:.1f} CPU-s) {verdict}.", ""]
    else:
        lines = [f"**The causal fit against MAIL-MMSG's** (`python benchmarks/scale.py --causal-profile "
                 f"{cp['agents']},{cp['days']} --results {source}`; the causal-twin benchmark's log c1, {cp['rows']:,} rows, "
                 f"{cp['members']} members each, serially, one process, load {cp['load']}):", "",
                 "| response model | CPU s | wall s |", "|---|---:|---:|",
                 f"| causal | {c['cpu_s']:.0f} | {c['wall_s']:.0f} |", f"| MAIL-MMSG | {m['cpu_s']:.0f} | {m['wall_s']:.0f} |",
                 "", f"Causal / MAIL-MMSG CPU: **{cp['ratio_cpu']:.2f}x** {verdict}.", ""]
    if c.get("invariance_chosen") is not None:
        lines += ["Invariance weight of each member's client model of each scenario (chosen once per scenario, on the "
                  "whole log): " + "; ".join(f"member {i}: {v}" for i, v in enumerate(c["invariance_chosen"])) + ".", ""]
    if cp.get("causal_before") and rounds:
        b = cp["causal_before"]
        same = "the same" if b["invariance_chosen"] == c.get("invariance_chosen") else f"{b['invariance_chosen']}, NOT the same"
        lines += ["The code before the selection's settled-band stop and one-net folds (`SELECTION_SETTLED`, "
                  "`SELECTION_SHARED_FOLDS` off), fitted in the same rounds "
                  "(`--causal-before`; between the other two fits, in the round's order): causal "
                  + ", ".join(f"{r['causal_before']['cpu_s']:.1f}" for r in rounds) + f" CPU-s (median {b['cpu_s']:.1f}), "
                  f"ratio to MAIL-MMSG **{cp['ratio_cpu_before']:.2f}x** (rounds "
                  + ", ".join(f"{r['ratio_cpu_before']:.2f}" for r in rounds) + f"); λ {same}; before / now "
                  f"{b['cpu_s'] / c['cpu_s']:.2f}x.", ""]
    lines += _causal_parts.parts_lines(rounds)
    prof = (f" (one more fit of each after the rounds: causal {c['profiled_cpu_s']:.1f}, MAIL-MMSG {m['profiled_cpu_s']:.1f} "
            f"CPU-s under the profiler, load {cp['load']} after)") if "profiled_cpu_s" in c else ""
    clock = cp.get("profile_clock", "wall")  # (earlier runs profiled the wall clock)
    lines += [f"Where the causal fit's time goes{prof} (cProfile, cumulative {clock} seconds under the profiler):", "",
              "| function | calls | cumulative s |", "|---|---:|---:|"]
    lines += [f"| `{k}` | {v['calls']} | {v['cum_s']:.1f} |" for k, v in sorted(c["functions"].items(), key=lambda kv: -kv[1]["cum_s"])]
    if cp.get("note"):
        lines += ["", cp["note"]]
    if cp.get("history"):
        def earlier(h: dict) -> str:
            each = ", ".join(f"{r['ratio_cpu']:.2f}" for r in h.get("rounds") or []) or "none"
            return (f"{h['ratio_cpu']:.2f}x (rounds {each}; causal {h['causal']['cpu_s']:.1f}, MAIL-MMSG "
                    f"{h['mail']['cpu_s']:.1f} CPU-s; load {h['load']})")
        lines += ["", "Earlier runs of this benchmark (`causal_fit.history` in the JSON, oldest first): "
                  + "; ".join(earlier(h) for h in cp["history"]) + "."]
    lines.append("")
    return lines


def append_run(res: dict, run: dict) -> dict:
    """``res`` (results.json) with ``run``'s fits kept as an extra table (its own command, twin and
    loads), and the 1M verdict over every fit; the rest of ``res`` (its throughput, profile) stays."""
    extra = {k: run[k] for k in ("command", "twin", "agents", "fits", "throughput") if k in run}
    extra["uptime_before"], extra["uptime_after"] = run.get("uptime_before"), run.get("uptime_after")
    res.setdefault("extra_runs", []).append(extra)
    every = res["fits"] + [f for r in res["extra_runs"] for f in r["fits"]]
    res["target_1m"], res["extrapolated_1m_seconds"] = target_1m(every, res["exponent"])
    return res


if __name__ == "__main__":
    main()
