"""`edgetwin demo`: the main job on the embedded defaults, end to end on one machine.

emulated cluster -> logs -> validation -> (twin -> policy -> what-if report, as those parts land).
Each stage writes into one output directory and the summary says where everything went. The demo
never needs ``../shared``: the emulated cluster and its defaults ship in the package.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass
class DemoResult:
    """What the demo produced: a path per artifact and a few headline numbers per stage."""

    out_dir: Path
    artifacts: dict[str, Path] = field(default_factory=dict)
    numbers: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    #: CPU seconds per phase (user + system, this process and the pool workers it waited for):
    #: on a shared machine the wall seconds say how busy it was; these say what the demo costs
    cpu_seconds: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "out_dir": str(self.out_dir),
            "artifacts": {k: str(v) for k, v in self.artifacts.items()},
            "numbers": self.numbers,
            "seconds": {k: round(v, 2) for k, v in self.seconds.items()},
            "cpu_seconds": {k: round(v, 2) for k, v in self.cpu_seconds.items()},
        }


def run_demo(
    out_dir: str | Path = "edgetwin-demo",
    seed: int = 0,
    agents: int = 100,
    episodes: int = 3,
    steps: int = 96,
    log: Callable[[str], None] = print,
    sizes: DemoSizes | None = None,
    spare_core: bool | None = None,
) -> DemoResult:
    """Run the pipeline on the emulated cluster and write everything under ``out_dir``.

    Args:
        out_dir: directory for the log, its spec, the quarantine file, the twin, the policy, reports.
        seed: one seed for every stage (same seed, same result).
        agents, episodes, steps: size of the generated log (service groups, days, steps per day).
        log: where progress lines go.
        sizes: how much each learned stage trains (`DemoSizes`; default: about a minute on 2 cores).
        spare_core: use a second process (`_SpareCore`): it fits the twin's second member while
            this one fits the first, runs the logging policy's what-if cells while this one trains
            the policy, and the trained policy's while this one runs the promotion (and then a few
            of the logging policy's), and draws the what-if report's PNGs with this one (`_Drawing`);
            before the twin's members, it makes the recent log and the log's overlap report and
            warms up (`_SpareCore.before_twin`) while this one fits the population model; None: when
            this process may use two cores or more. The results do not depend on it (the worker
            reads the saved twin, seeds everything from its arguments and runs torch with this
            process's thread count).
    """
    sizes = sizes or DemoSizes()
    from edgetwin.contract.logs import write_table
    from edgetwin.contract.spec import spec_path_for
    from edgetwin.contract.validate import validate_log
    from edgetwin.emulator.cluster import ClusterConfig
    from edgetwin.emulator.logs import generate_logs

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    res = DemoResult(out_dir=out)

    if spare_core is None:
        from edgetwin.twin.parallel import available_cores

        spare_core = available_cores() >= 2
    log(sizes.budget_line(agents, episodes, steps, spare_core))
    # started first: it imports torch, the twin and matplotlib on the idle core while this one fits
    spare = _SpareCore() if spare_core else None
    drawing: _Drawing | None = None
    try:
        t0 = _clock()
        log(f"[1] emulated cluster: {agents} service groups x {episodes} episodes x {steps} steps")
        config = ClusterConfig(n_agents=agents, steps=steps)
        df, spec = generate_logs(config, episodes=episodes, policy="random", seed=seed, progress=True)
        log_path = write_table(df, out / "logs.parquet")
        spec.save(spec_path_for(log_path))
        res.artifacts["log"] = log_path
        res.artifacts["spec"] = spec_path_for(log_path)
        res.numbers["log_rows"] = len(df)
        _record(res, "generate", t0)

        t0 = _clock()
        log("[2] validating the log against its spec")
        report = validate_log(log_path, quarantine_path=out / "logs.quarantine.csv")
        res.numbers["usable_rows"] = report.n_usable
        res.numbers["quarantined_rows"] = report.n_quarantined
        _record(res, "validate", t0)
        if not report.usable:
            raise RuntimeError(f"the generated log did not validate: {report.summary()}")

        # the cluster's next days (below), generated on the spare core while the population model is
        # fitted here (it idles until the twin's members start; `_SpareCore.before_twin`)
        later = spare.before_twin(config, seed + 10_000) if spare is not None else None

        t0 = _clock()
        log("[3] learning the twin: GAN-SMMSG population + MAIL-MMSG responses")
        # the second ensemble member is fitted on the spare core (same twin: `Twin.fit`'s ``beside``)
        twin = _fit_twin(log_path, spec, seed, sizes, beside=spare.pool if spare is not None else None)
        twin_dir = twin.save(out / "twin")
        res.artifacts["twin"] = Path(twin_dir)
        _record(res, "twin", t0)

        # replayed and calibrated on traffic the twin was not fitted on (the gate refuses its training
        # log): the cluster's next days, still under the logging policy
        recent, _ = later.result() if later is not None else generate_logs(config, 2, "random", seed + 10_000, False)
        # the logging policy's cells (the gate's, with the log's own actions, then the what-if's) need
        # no trained policy: on the spare core while [4] runs
        gate_ahead = spare.submit(_gate_ahead_task, Path(twin_dir), recent, seed) if spare is not None else None
        ahead = spare.submit(_whatif_ahead_task, Path(twin_dir), recent, seed, sizes.whatif_episodes) if spare is not None else None

        t0 = _clock()
        log(f"[4] training a PPO policy in the twin ({sizes.train_steps:,} steps, action-norm lambda 0.4)")
        from edgetwin.policies.train import train_policy

        trained = train_policy(twin, algo="ppo", steps=sizes.train_steps, seed=seed, out=out / "policy",
                               progress=True)  # fmt: skip
        res.artifacts["policy"] = Path(trained.path)
        _record(res, "train", t0)

        whatif_args = (Path(twin_dir), recent, Path(trained.path), out / "whatif", seed, sizes.whatif_episodes)
        # the trained policy's what-if cells, on the spare core while [5] and [7] run here
        pending = spare.submit(_whatif_trained_task, *whatif_args) if spare is not None else None
        # then the report's PNGs, from the first, while [5] and [7] run here (`_whatif_draw_task`)
        drawing = _Drawing(spare, whatif_args) if spare is not None else None

        t0 = _clock()
        log("[5] scoring on the emulated cluster (which the twin only saw through its logs)")
        res.numbers.update(_score_on_cluster(Path(trained.path), config, seed))
        _record(res, "evaluate", t0)

        log("[6] what-if report: the policy vs the logging policy under burst / failure / degradation"
            + (" (written on the second core while [7] runs)" if pending is not None else ""))  # fmt: skip
        if pending is None:
            t0 = _clock()
            res.artifacts["whatif_report"] = _whatif(twin, *whatif_args[1:])
            _record(res, "whatif", t0)

        t0 = _clock()
        log("[7] promotion through the gate to a signed registry, then serving the cluster from an edge runtime")
        gate_cells = gate_ahead.result()[0] if gate_ahead is not None else ()
        res.numbers.update(_promote_and_serve(twin, recent, Path(trained.path), out, config, seed, log,
                                              res.numbers.get("cluster_change"), gate_cells))  # fmt: skip
        for name, sub in (("registry", "registry"), ("promotion_report", "promotion")):
            if (out / sub).exists():  # not when the cluster's own evidence stopped the promotion
                res.artifacts[name] = out / sub
        _record(res, "promote_and_serve", t0)

        if pending is not None and drawing is not None:
            t0 = _clock()
            # the logging policy's cells of the last scenarios here (`MAIN_WHATIF_SCENARIOS`), then the
            # report from every cell, its PNGs shared with the spare core (`_Drawing`)
            mine, wall_m, cpu_m = _whatif_main_cells(twin, recent, seed, sizes.whatif_episodes)
            path, wall, cpu = drawing.finish(twin, mine)
            _, wall0, cpu0 = ahead.result() if ahead is not None else (None, 0.0, 0.0)
            _, wall1, cpu1 = pending.result()
            res.artifacts["whatif_report"] = Path(path)
            res.seconds["whatif"] = wall0 + wall1 + wall_m + wall
            res.cpu_seconds["whatif"] = cpu0 + cpu1 + cpu_m + cpu
            if gate_ahead is not None:  # the gate's cells, run in the worker for [7]
                res.seconds["gate_ahead"], res.cpu_seconds["gate_ahead"] = gate_ahead.result()[1:]
            res.seconds["whatif_wait"] = _clock()[0] - t0[0]  # how long [7] waited for it after finishing
    finally:
        if drawing is not None:
            drawing.close()
        if spare is not None:
            spare.close()
    if spare is not None:
        res.cpu_seconds["second_core_startup"] = spare.startup_cpu

    (out / "demo-summary.json").write_text(json.dumps(res.to_dict(), indent=2))
    res.artifacts["summary"] = out / "demo-summary.json"
    return res


class _SpareCore:
    """One worker process for the demo's independent work: a twin member, the what-if report.

    After the policy is trained, the what-if report ([6]) and the gate, canary and serving ([7])
    need only the twin, the policy and the recent log, and neither needs the other: on two cores
    they run side by side. Before that the worker would idle, so (issue 48: the demo took 106-111 s
    on a 2-core machine) it fits the twin's second ensemble member beside the first
    (`Twin.fit`'s ``beside``) and, while [4] trains the policy, the gate's and the what-if's cells
    of the logging policy, which need no trained policy (`_gate_ahead_task`, `_whatif_ahead_task`);
    then the trained policy's cells (`_whatif_trained_task`) while this process runs [5] and [7],
    and then the report's PNGs, shared with this process once it has added the logging policy's
    cells of the last scenarios (`MAIN_WHATIF_SCENARIOS`) and finished [7] (`_Drawing`: the worker
    had the longer share of the work, and this process waited for it); the same twin, decision and
    report. The worker is spawned (not forked:
    torch's and OpenMP's thread state) when the demo starts, and warms up (imports torch, the twin,
    the what-if engine, matplotlib) while this process generates the log. Its torch thread count is this process's, so
    what it computes is what the demo would compute in-process."""

    def __init__(self) -> None:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        import torch

        from edgetwin.twin.parallel import _init_worker

        self.pool = ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn"),
                                        initializer=_init_worker, initargs=(torch.get_num_threads(),))  # fmt: skip
        self.warm = self.pool.submit(_warm_up)
        self.startup_cpu = 0.0

    def submit(self, fn: Callable[..., Any], *args: Any) -> Any:
        self.startup_cpu = self.warm.result()
        return self.pool.submit(fn, *args)

    def before_twin(self, config: Any, recent_seed: int) -> Any:
        """While the population model is fitted in the demo's process: the recent log (2 days of
        ``config`` under the logging policy, ``recent_seed``: the future of `generate_logs`'s
        result) and `_warm_twin_fit`."""
        from edgetwin.emulator.logs import generate_logs

        recent = self.pool.submit(generate_logs, config, 2, "random", recent_seed, False)
        self.pool.submit(_warm_twin_fit)
        return recent

    def close(self) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)


def _warm_up() -> float:
    """In the spare worker: import what the what-if report needs; returns the CPU seconds it took."""
    import edgetwin.policies.export  # noqa: F401
    import edgetwin.twin.report  # noqa: F401
    import edgetwin.twin.twin  # noqa: F401
    import edgetwin.twin.whatif  # noqa: F401
    from edgetwin.twin.report import _plt

    _plt()
    return time.process_time()


def _warm_twin_fit() -> float:
    """In the spare worker, idle while this process fits the population model: a tiny twin (10
    service groups x 16 steps, one member, one MAIL round) that nobody uses, so that the member it
    fits next runs warm (issue 48: a member's first fit in a fresh process took 15.9 CPU s where a
    second took 12.7, loading numba's kernels and torch's first calls; after this one 13.8, at load 10).
    Everything a fit samples is seeded from its arguments, so the member is the same. Returns its CPU s."""
    from threadpoolctl import threadpool_limits

    from edgetwin.emulator.cluster import ClusterConfig
    from edgetwin.emulator.logs import generate_logs
    from edgetwin.twin.twin import Twin

    c0 = time.process_time()
    with threadpool_limits(1):
        log, spec = generate_logs(ClusterConfig(n_agents=10, steps=16), episodes=2, seed=0)
        Twin.fit(log, spec, members=1, seed=0, progress=False, population_model="empirical", rounds=1, bc_epochs=1)
    return time.process_time() - c0


#: in the spare worker: the saved twin it loaded and the logging policy's what-if cells it ran ahead
#: (`_whatif_ahead_task`), by the twin's directory; its tasks run one after another, in order
_WORKER: dict[str, Any] = {}


def _worker_twin(twin_dir: Path) -> Any:
    from edgetwin.twin.twin import Twin

    if _WORKER.get("twin_dir") != str(twin_dir):
        _WORKER.clear()
        _WORKER.update(twin_dir=str(twin_dir), twin=Twin.load(twin_dir))
    return _WORKER["twin"]


#: recent-log episodes the promotion gate replays (`_promote_and_serve`)
GATE_EPISODES = 2


def _gate_ahead_task(twin_dir: Path, log_df: Any, seed: int) -> tuple[list[Any], float, float]:
    """In the spare worker, while the policy trains: the gate's cells that need no trained policy
    (`_promote_and_serve`'s `run_gate`: the logging policy and the log's own actions, ``"logged"``,
    under the nominal scenario), for the gate's ``ahead``; the logging one is kept for the what-if.
    Returns (the cells, wall s, CPU s)."""
    from threadpoolctl import threadpool_limits

    from edgetwin.twin.whatif import builtin_policy
    from edgetwin.twin.whatif.run import run_policy_cells

    w0, c0 = time.perf_counter(), time.process_time()
    with threadpool_limits(1):
        twin = _worker_twin(twin_dir)
        cells = [run_policy_cells(twin, builtin_policy(name, twin), episodes=GATE_EPISODES, seeds=1, seed=seed,
                                  log=log_df) for name in ("logging", "logged")]  # fmt: skip
        _WORKER["gate_logging"] = cells[0]
    return cells, time.perf_counter() - w0, time.process_time() - c0


def _whatif_ahead_task(twin_dir: Path, log_df: Any, seed: int, episodes: int) -> tuple[None, float, float]:
    """In the spare worker, while the policy trains: the logging policy's cells of `_whatif`
    (`edgetwin.twin.whatif.run_policy_cells`; the nominal one is the gate's when it replays as many
    episodes), kept for `_Drawing`; returns (None, wall s, CPU s)."""
    from threadpoolctl import threadpool_limits

    w0, c0 = time.perf_counter(), time.process_time()
    with threadpool_limits(1):
        twin = _worker_twin(twin_dir)
        nominal = _WORKER.get("gate_logging") if episodes == GATE_EPISODES else None
        cells = _whatif_cells_ahead(twin, log_df, seed, episodes, include_nominal=nominal is None,
                                    scenarios=_whatif_scenario_split()[0])  # fmt: skip
        _WORKER["ahead"] = cells if nominal is None else nominal.merged(cells)
    return None, time.perf_counter() - w0, time.process_time() - c0


def _whatif_trained_task(
    twin_dir: Path, log_df: Any, policy_dir: Path, out_dir: Path, seed: int, episodes: int
) -> tuple[None, float, float]:
    """In the spare worker, once the policy is trained: the trained policy's cells of `_whatif`
    (every scenario, in `run_whatif`'s serial order for a policy object shared by its episodes),
    kept for `_Drawing`; returns (None, wall s, CPU s)."""
    from threadpoolctl import threadpool_limits

    w0, c0 = time.perf_counter(), time.process_time()
    with threadpool_limits(1):
        _WORKER["trained"] = _whatif_trained_cells(_worker_twin(twin_dir), log_df, policy_dir, seed, episodes)
    return None, time.perf_counter() - w0, time.process_time() - c0


def _whatif_cells_task() -> tuple[Any, Any]:
    """In the spare worker, after `_whatif_trained_task`: the logging policy's and the trained
    policy's cells it ran (`_WORKER`), for the demo's process to write the report from."""
    return _WORKER["ahead"], _WORKER["trained"]


def _claimer(claim_dir: str) -> Callable[[str], bool]:
    """``claim(unit)``: True for the one process that first asks for ``unit`` (a file created
    exclusively in ``claim_dir``, shared by the demo's two processes)."""
    import os

    def claim(unit: str) -> bool:
        try:
            os.close(os.open(Path(claim_dir) / unit.encode().hex(), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
        except FileExistsError:
            return False
        return True

    return claim


def _whatif_draw_task(
    twin_dir: Path, log_df: Any, policy_dir: Path, out_dir: Path, seed: int, episodes: int, claim_dir: str
) -> tuple[dict[str, str], float, float]:
    """In the spare worker, after `_whatif_trained_task`: the what-if report's PNGs it has every
    cell for (the scenarios whose logging-policy cells it ran, and the changes when those are all),
    from the first, each unless the demo's process claimed it (`_claimer`); returns ({unit: PNG
    path}, wall s, CPU s). A PNG depends on its scenario's cells only (`edgetwin.twin.report.plot_some`),
    so the result of `_whatif` on these scenarios draws the same bytes as the full one."""
    from threadpoolctl import threadpool_limits

    from edgetwin.twin.report import plot_some, report_units

    w0, c0 = time.perf_counter(), time.process_time()
    with threadpool_limits(1):
        logging, trained = _WORKER["ahead"], _WORKER["trained"]
        shipped = list(_whatif_scenarios())
        mine = [s for s in shipped if s.name in logging.outcomes and s.name in trained.outcomes]
        result = _whatif_result(_worker_twin(twin_dir), log_df, policy_dir, seed, episodes, [logging, trained],
                                scenarios=mine)  # fmt: skip
        units = report_units(result)
        if len(mine) < len(shipped):  # the changes plot needs every scenario
            units.remove("changes")
        drawn = plot_some(result, out_dir, units, claim=_claimer(claim_dir))
    return {u: str(p) for u, p in drawn.items()}, time.perf_counter() - w0, time.process_time() - c0


class _Drawing:
    """The what-if report's end, shared by the demo's two processes (issue 48: the demo's process
    waited 16 s on a quiet machine while the spare core drew the report's 9 PNGs, 12 CPU s, alone).

    Queued on the spare core behind the trained policy's cells: `_whatif_cells_task` (the cells, for
    this process) and `_whatif_draw_task` (the PNGs it can draw, from the first). `finish`, once [7]
    is done here: the report from every cell, its PNGs claimed from the last (`_claimer`), so each
    is drawn once, by whichever process is free; the HTML once all are written."""

    def __init__(self, spare: _SpareCore, whatif_args: tuple[Any, ...]) -> None:
        import tempfile

        self.args = whatif_args
        self.claim_dir = tempfile.mkdtemp(prefix="edgetwin-demo-claims-")
        self.cells = spare.submit(_whatif_cells_task)
        self.part = spare.submit(_whatif_draw_task, *whatif_args, self.claim_dir)
        #: who drew which PNG, once `finish` returns: ``{unit: "here" | "spare"}``
        self.drawn: dict[str, str] = {}

    def finish(self, twin: Any, mine: Any) -> tuple[str, float, float]:
        """The report (``mine``: this process's logging-policy cells, or None); returns (its HTML
        path, wall s, CPU s of both processes' share)."""
        from threadpoolctl import threadpool_limits

        from edgetwin.twin.report import plot_some, report_units

        _, log_df, policy_dir, out_dir, seed, episodes = self.args
        w0, c0 = time.perf_counter(), time.process_time()
        part: list[tuple[dict[str, str], float, float]] = []

        def draw() -> dict[str, Path]:
            units = report_units(result)[::-1]  # from the last: the spare core draws from the first
            drawn = plot_some(result, out_dir, units, claim=_claimer(self.claim_dir))
            part.append(self.part.result())
            self.drawn = {**{u: "here" for u in drawn}, **{u: "spare" for u in part[0][0]}}
            return {**drawn, **{u: Path(p) for u, p in part[0][0].items()}}

        with threadpool_limits(1):
            logging, trained = self.cells.result()
            if mine is not None:
                logging = logging.merged(mine)
            result = _whatif_result(twin, log_df, policy_dir, seed, episodes, [logging, trained])
            path = _write_whatif(result, out_dir, draw)
        return str(path), time.perf_counter() - w0 + part[0][1], time.process_time() - c0 + part[0][2]

    def close(self) -> None:
        """Remove the claims' directory (the PNGs stay where they were drawn)."""
        import shutil

        shutil.rmtree(self.claim_dir, ignore_errors=True)


def _whatif_main_cells(twin: Any, log_df: Any, seed: int, episodes: int) -> tuple[Any, float, float]:
    """In the demo's process, after the promotion: the logging policy's cells of the last
    `MAIN_WHATIF_SCENARIOS` scenarios (those `_whatif_ahead_task` left), with one BLAS thread as in
    the spare worker; returns (the cells, wall s, CPU s)."""
    from threadpoolctl import threadpool_limits

    w0, c0 = time.perf_counter(), time.process_time()
    mine = _whatif_scenario_split()[1]
    with threadpool_limits(1):
        cells = _whatif_cells_ahead(twin, log_df, seed, episodes, include_nominal=False, scenarios=mine) if mine else None
    return cells, time.perf_counter() - w0, time.process_time() - c0


@dataclass(frozen=True)
class DemoSizes:
    """How much work each learned stage does (the defaults' time on a quiet 2-core machine: `QUIET_SECONDS`)."""

    twin_members: int = 2
    mail_rounds: int = 3
    bc_epochs: int = 10
    #: GAN-SMMSG updates, rows per scenario a step and generated rows per scenario its marginal
    #: calibration is fitted from: on the demo's 300 logged profiles 300 x 128 with 10k calibration
    #: rows cost 8 CPU s instead of 29 (600 x 256, 50k) at the same fidelity against held-out
    #: profiles (C2ST AUC 0.63 vs 0.59, mean marginal KL 0.169 vs 0.172, MMD 0.0033 vs 0.0034)
    population_steps: int = 300
    population_batch: int = 128
    population_calibrate_samples: int = 10_000
    train_steps: int = 30_000
    whatif_episodes: int = 2

    def budget_line(self, agents: int, episodes: int, steps: int, spare_core: bool = True) -> str:
        """The one line the demo prints first: how long it takes, phase by phase, and on what.

        The seconds are measured (`QUIET_SECONDS`), not predicted: the default sizes and log, on a
        quiet 2-core machine, phase by phase as this process's clock saw them (the what-if report is
        written on the second core meanwhile; what remains of it is the last wait). Without a second
        core, or at other sizes, the line says they were not measured.
        """
        total = quiet_total()
        measured = self == DemoSizes() and (agents, episodes, steps) == (100, 3, 96)
        if not measured or not spare_core:
            what = "these sizes" if not measured else "one core"
            return f"time budget: not measured for {what} (the defaults take ~{total} s on a quiet 2-core machine)"
        phases = ", ".join(f"{k} {v} s" for k, v in QUIET_SECONDS.items())
        return f"time budget: ~{total} s on a quiet 2-core machine ({phases}); more when it is shared"

    @classmethod
    def tiny(cls) -> DemoSizes:
        """For tests of the wiring: every stage runs, none learns much."""
        return cls(twin_members=1, mail_rounds=1, bc_epochs=2, population_steps=50, train_steps=1_000,
                   whatif_episodes=1)


def _clock() -> tuple[float, float]:
    """(wall seconds, CPU seconds so far): user + system of this process and of its finished children
    (a pool's workers count once the pool is shut down, as every pool here is before a phase ends)."""
    try:
        import resource
    except ImportError:  # not POSIX: this process only
        return time.perf_counter(), time.process_time()
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.perf_counter(), me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _record(res: DemoResult, phase: str, start: tuple[float, float]) -> None:
    wall, cpu = _clock()
    res.seconds[phase] = wall - start[0]
    res.cpu_seconds[phase] = cpu - start[1]


WHATIF_SCENARIOS = "emulated_cluster.toml"
#: the default demo's phases in wall seconds on a quiet 2-core machine, as this process's clock saw
#: them (`demo-summary.json`'s ``seconds``: start-up is the run's wall time less its phases; "log" is
#: generate + validate, "training" train + evaluate, "promotion" promote_and_serve, and the last the
#: wait for the what-if report, whose cells run on the second core beside the twin fit, the training
#: and the promotion). Read off a quiet run of `benchmarks/demo_run.py` (2026-11-30, load 0.9, 98.2 s
#: wall: over the 60 s the demo aims at, on a machine where a Python loop of 3 million additions takes
#: 0.5 s); tests/test_demo.py checks them against the run the page records (docs/benchmarks/demo/
#: results.json, ``runs[0].phase_seconds``) within a quiet machine's run-to-run spread. Remeasure
#: when the sizes or a phase change.
QUIET_SECONDS = {"start-up": 11, "log": 2, "twin": 29, "training": 12,
                 "promotion (scoring, gate, canary, serving)": 19, "the what-if report's rest": 6}  # fmt: skip
#: `QUIET_SECONDS`'s keys from the summary's phases (each the sum of those phases' wall seconds)
QUIET_PHASES = {"log": ("generate", "validate"), "twin": ("twin",), "training": ("train", "evaluate"),
                "promotion (scoring, gate, canary, serving)": ("promote_and_serve",),
                "the what-if report's rest": ("whatif_wait",)}  # fmt: skip


def quiet_total() -> int:
    """The default demo's wall seconds on a quiet 2-core machine (the sum of `QUIET_SECONDS`)."""
    return sum(QUIET_SECONDS.values())


def _fit_twin(log_path: Path, spec: Any, seed: int, sizes: DemoSizes, beside: Any = None) -> Any:
    from edgetwin.twin.twin import Twin

    return Twin.fit(
        log_path,
        spec,
        seed=seed,
        members=sizes.twin_members,
        progress=True,
        population_hyper={"steps": sizes.population_steps, "batch_per_scenario": sizes.population_batch,
                          "calibrate_samples": sizes.population_calibrate_samples},
        rounds=sizes.mail_rounds,
        bc_epochs=sizes.bc_epochs,
        beside=beside,
    )


def _score_on_cluster(policy_dir: Path, config: Any, seed: int) -> dict[str, Any]:
    """Offload ratio and return of the trained policy and the random logging policy, same episodes."""
    from edgetwin.contract.policy import RandomPolicy
    from edgetwin.emulator.cluster import EdgeCluster
    from edgetwin.policies.evaluate import ArraySystem, evaluate_policy, improvement
    from edgetwin.policies.export import load_policy

    cluster = EdgeCluster(config)
    system = ArraySystem(cluster, cluster.spec)
    kpis = _cluster_kpis()
    eval_seed = seed + 10_000  # episodes the twin never saw
    trained = evaluate_policy(load_policy(policy_dir), system, episodes=3, seed=eval_seed, kpis=kpis, name="trained")
    random = evaluate_policy(RandomPolicy(cluster.spec, seed=seed), system, episodes=3, seed=eval_seed, kpis=kpis,
                             name="random")
    return {
        "cluster_return_trained": trained.mean["return"],
        "cluster_return_random": random.mean["return"],
        "cluster_offload_trained": trained.mean["offload_ratio"],
        "cluster_offload_random": random.mean["offload_ratio"],
        "offload_improvement_over_random": improvement(trained, random, "offload_ratio"),
        "cluster_change": cluster_change(trained, random, cluster.spec),
    }


#: which of `edgetwin.policies.evaluate`'s KPIs measures each of the cluster spec's guarded columns
#: (the demo knows the emulated cluster; nothing below layer 5 does)
_EVAL_KEY = {"response.offload_ratio": "offload_ratio", "kpi.revenue": "revenue", "kpi.task_time_ms": "completion_time_mean",
             "kpi.slo_violation": "slo_violation_rate", "kpi.energy_j": "energy_j", "kpi.carbon_g": "carbon_g"}  # fmt: skip


def cluster_change(trained: Any, random: Any, spec: Any, level: float = 0.90) -> dict[str, dict[str, Any]]:
    """Per KPI the spec gives a direction: the trained policy's relative change against the logging
    policy on the same unseen cluster episodes, with its ``level`` interval (paired over episodes,
    Student's t: 3 episodes are no normal sample), and whether it regressed beyond the spec's margin
    with its whole interval (``regressed``) or may have (``may_regress``: the interval reaches past it)."""
    import numpy as np
    from scipy import stats

    from edgetwin.policies.gate import DEFAULT_MARGIN

    out: dict[str, dict[str, Any]] = {}
    for f in spec.features:
        key = _EVAL_KEY.get(f.name)
        better = f.better or ("higher" if spec.reward_weights.get(f.name, 0.0) > 0 else None)
        if better is None or key is None or key not in trained.per_episode:
            continue
        a, b = np.asarray(trained.per_episode[key], float), np.asarray(random.per_episode[key], float)
        base = abs(float(b.mean()))
        if base == 0:
            continue
        d = (a - b) / base
        half = float(stats.t.ppf(0.5 + level / 2, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else np.inf
        rel = float(d.mean())
        margin = DEFAULT_MARGIN if f.margin is None else float(f.margin)
        sign = -1.0 if better == "higher" else 1.0  # positive = worse
        worse = sorted((sign * (rel - half), sign * (rel + half)))
        out[f.name] = {"change": rel, "interval": [rel - half, rel + half], "better": better, "margin": margin,
                       "regressed": worse[0] > margin, "may_regress": worse[1] > margin}  # fmt: skip
    return out


def trade_off_line(change: dict[str, dict[str, Any]]) -> str:
    """One line: what the policy gained and what it gave, by the spec's directions, on the cluster."""
    gained: list[str] = []
    gave: list[str] = []
    for kpi, c in change.items():
        text = f"{kpi} {100 * c['change']:+.1f} %"
        good = (c["change"] > 0) == (c["better"] == "higher")
        (gained if good else gave).append(text + (" (beyond its margin)" if c["regressed"] else ""))
    return f"gained {', '.join(gained) or 'nothing'}; gave {', '.join(gave) or 'nothing'}"


def _cluster_kpis() -> Any:
    from edgetwin.emulator.cluster import cluster_kpi_columns

    return cluster_kpi_columns()


def _whatif_scenarios() -> Any:
    from importlib.resources import files

    from edgetwin.twin.whatif import load_scenarios

    return load_scenarios(Path(str(files("edgetwin") / "data" / "whatif" / WHATIF_SCENARIOS)))


#: how many of the what-if scenarios (the last of `WHATIF_SCENARIOS`) have their logging-policy
#: cells run in the demo's process after the promotion rather than on the spare core while the policy
#: trains: the spare core also runs the trained policy's cells, and was the last to finish (issue 48:
#: the demo's process waited 10-13 s for it on a quiet machine). Since the two processes share the
#: report's PNGs (`_Drawing`), whichever is free, the split only moves a cell between them: on the
#: recorded CPU seconds (a run at load 10: this process 45.7 CPU s from the twin to the promotion's
#: end, the spare core 45.6 for the gate's and every what-if cell) one cell each way is about even
MAIN_WHATIF_SCENARIOS = 1


def _whatif_scenario_split() -> tuple[list[Any], list[Any]]:
    """`_whatif_scenarios` in two: those the spare core runs ahead, and the last
    `MAIN_WHATIF_SCENARIOS` (the logging policy's cells; any split gives the same cells: each
    cell's episodes are seeded by the replicate, not by the scenario's place)."""
    scenarios = list(_whatif_scenarios())
    cut = max(0, len(scenarios) - MAIN_WHATIF_SCENARIOS)
    return scenarios[:cut], scenarios[cut:]


def _whatif_cells_ahead(
    twin: Any, log_df: Any, seed: int, episodes: int, include_nominal: bool = True, scenarios: Any = None
) -> Any:
    """The logging policy's cells of `_whatif` (same episodes, seed and log; its scenarios, or
    ``scenarios`` of them), run before the trained policy exists: `edgetwin.twin.whatif.run.run_policy_cells`."""
    from edgetwin.twin.whatif import builtin_policy
    from edgetwin.twin.whatif.run import run_policy_cells

    scenarios = _whatif_scenarios() if scenarios is None else scenarios
    return run_policy_cells(twin, builtin_policy("logging", twin), scenarios, episodes=episodes, seeds=1,
                            seed=seed, log=log_df, include_nominal=include_nominal)  # fmt: skip


def _whatif_trained_cells(twin: Any, log_df: Any, policy_dir: Path, seed: int, episodes: int) -> Any:
    """The trained policy's cells of `_whatif` (the nominal scenario, then the shipped ones: the serial
    order `run_whatif` runs a `fixed_policy`'s cells in, one task): `run_policy_cells`."""
    from edgetwin.policies.export import load_policy
    from edgetwin.twin.whatif import fixed_policy
    from edgetwin.twin.whatif.run import run_policy_cells

    return run_policy_cells(twin, fixed_policy("trained", load_policy(policy_dir)), _whatif_scenarios(),
                            episodes=episodes, seeds=1, seed=seed, log=log_df)  # fmt: skip


def _whatif(
    twin: Any, log_df: Any, policy_dir: Path, out_dir: Path, seed: int, episodes: int, progress: bool = True,
    ahead: Any = (),
) -> Path:
    """Counterfactual replay of the log's last episodes under the shipped what-if scenarios
    (``ahead``: `_whatif_cells_ahead`'s cells, not run again: the same report)."""
    return _write_whatif(_whatif_result(twin, log_df, policy_dir, seed, episodes, ahead, progress=progress), out_dir)


def _whatif_result(
    twin: Any, log_df: Any, policy_dir: Path, seed: int, episodes: int, ahead: Any = (), progress: bool = False,
    scenarios: Any = None,
) -> Any:
    """`_whatif`'s `WhatIfResult` (on ``scenarios`` of the shipped ones: the nominal and those)."""
    from edgetwin.policies.export import load_policy
    from edgetwin.twin.whatif import builtin_policy, fixed_policy, run_whatif

    policies = [builtin_policy("logging", twin), fixed_policy("trained", load_policy(policy_dir))]
    scenarios = _whatif_scenarios() if scenarios is None else scenarios
    return run_whatif(twin, policies, scenarios, baseline="logging", episodes=episodes, seeds=1, seed=seed,
                      log=log_df, progress=progress, ahead=ahead)  # fmt: skip


def _write_whatif(result: Any, out_dir: Path, images: Callable[[], dict[str, Path]] | None = None) -> Path:
    """`_whatif`'s report of ``result`` (``images``: `edgetwin.twin.report.write_report`'s); its HTML page."""
    from edgetwin.twin.report import write_report

    paths = write_report(result, out_dir, title="edgetwin demo: trained policy vs the logging policy", images=images)
    return Path(paths["html"])


def cluster_objection(change: dict[str, dict[str, Any]]) -> tuple[str, str] | None:
    """Why the cluster's own evidence (`cluster_change`) forbids a promotion, or None.

    ``("refuse", reason)`` when some guarded KPI regressed beyond its margin with its whole interval
    on the unseen cluster episodes; ``("undecided", reason)`` when some interval reaches past its
    margin (those episodes cannot rule a regression out); None when every guarded KPI holds."""

    def text(kpi: str, c: dict[str, Any]) -> str:
        lo, hi = c["interval"]
        return (f"{kpi} {100 * c['change']:+.1f} % [{100 * lo:+.1f}, {100 * hi:+.1f}] ({c['better']} is better, "
                f"margin {100 * c['margin']:g} %)")  # fmt: skip

    regressed = [text(k, c) for k, c in change.items() if c["regressed"]]
    if regressed:
        return "refuse", "on unseen cluster episodes " + "; ".join(regressed) + " regressed beyond the margin"
    may = [text(k, c) for k, c in change.items() if c["may_regress"]]
    if may:
        return "undecided", "on unseen cluster episodes the interval of " + "; ".join(may) + " reaches past the margin"
    return None


def _promote_and_serve(
    twin: Any, log_df: Any, policy_dir: Path, out: Path, config: Any, seed: int, log: Callable[[str], None],
    cluster_evidence: dict[str, dict[str, Any]] | None = None, gate_cells: Any = (),
) -> dict[str, Any]:
    """Gate + signed promotion into a file registry, then an in-process edge runtime serves the cluster.

    With ``cluster_evidence`` (`cluster_change` on unseen cluster episodes), a policy that regresses a guarded
    KPI beyond its margin there, or whose interval there reaches past one, is never promoted
    (`cluster_objection`): the twin's gate still decides, without publishing, and its verdict is
    recorded beside the cluster's reason, so a twin that would have promoted it shows."""
    from types import SimpleNamespace

    import numpy as np

    from edgetwin.contract.errors import GateRefused
    from edgetwin.edge.registry import FileRegistry, metadata_from_policy_dir
    from edgetwin.edge.runtime import EdgeRuntime
    from edgetwin.edge.signing import Signer, TrustStore
    from edgetwin.emulator.cluster import EdgeCluster
    from edgetwin.loop.rounds import promote_after_canary
    from edgetwin.policies.gate import GateAbstained, promote, resolve_policy, run_gate

    numbers: dict[str, Any] = {}
    objection = cluster_objection(cluster_evidence) if cluster_evidence else None
    if objection is not None:
        # the twin's gate and, where it abstains, the canary still run and are recorded: they are
        # what an operator without the emulator would have; nothing is published
        decision = run_gate(twin, resolve_policy(policy_dir, twin, name="trained"),
                            resolve_policy("logging", twin, name="logging"), log=log_df, episodes=GATE_EPISODES,
                            seed=seed, ahead=gate_cells)  # fmt: skip
        numbers["twin_gate"] = {"verdict": decision.verdict, "reason": decision.reason()}
        log(f"    the twin's gate says {decision.verdict}: {decision.reason()}")
        if decision.verdict == "abstain":
            numbers["gate_abstained"] = decision.reason()
            _canary(twin, policy_dir, config, seed, out, numbers, log, SimpleNamespace(decision=decision), log_df)
        numbers["promoted_version"] = None
        numbers["cluster_" + ("refused" if objection[0] == "refuse" else "undecided")] = objection[1]
        log(f"    not promoted ({objection[0]} on the cluster's own evidence): {objection[1]}")
        return numbers
    registry = FileRegistry(out / "registry")
    signer = Signer.generate()  # a demo key: real deployments keep theirs (edgetwin registry keygen)
    trust = TrustStore([signer.public_key])
    try:
        result = promote(
            policy_dir, registry, twin=twin, log=log_df, signer=signer, trust=trust, scope="global",
            against="auto", episodes=GATE_EPISODES, seed=seed, out_dir=out / "promotion",
            metadata=metadata_from_policy_dir(policy_dir),
        )
        numbers["promoted_version"] = result.version
        log(f"    promoted {result.version}: no guarded KPI regressed beyond its margin")
    except GateRefused as refused:
        numbers["promoted_version"] = None
        numbers["gate_refused"] = str(refused)
        log(f"    the gate refused the policy: {refused}")
        return numbers
    except GateAbstained as abstained:  # exit 3 on the CLI: the twin cannot vouch for the policy
        numbers["promoted_version"] = None
        numbers["gate_abstained"] = str(abstained)
        log(f"    the gate abstained (the twin cannot tell): {abstained}")
        log("    asking the edge: a canary on <= 10% of the service groups for <= 1 simulated day")
        verdict = _canary(twin, policy_dir, config, seed, out, numbers, log, getattr(abstained, "result", None), log_df)
        if verdict is None:
            return numbers
        version = promote_after_canary(registry, policy_dir, verdict, signer, scope="global", expected=None,
                                       metadata=metadata_from_policy_dir(policy_dir))  # fmt: skip
        numbers["promoted_version"] = version
        log(f"    promoted {version} on the canary's evidence (signed, published, global pointer moved)")

    cluster = EdgeCluster(config)
    obs = cluster.reset(seed + 20_000)
    served = 0
    rewards = []
    with EdgeRuntime("demo-site", registry, trust, kpi_guard=None, poll_interval=0.5).running_in_thread() as rt:
        done = False
        while not done:
            actions = rt.decide(obs)
            obs, reward, done, _info = cluster.step(actions)
            served += len(actions)
            rewards.append(float(np.mean(reward)))
    numbers["served_decisions"] = served
    numbers["served_mean_reward"] = float(np.mean(rewards))
    log(f"    the edge runtime served {served:,} decisions to the emulated cluster")
    return numbers


def _canary(
    twin: Any, policy_dir: Path, config: Any, seed: int, out: Path, numbers: dict[str, Any],
    log: Callable[[str], None], promotion: Any = None, recent: Any = None,
) -> Any:
    """The gate abstained: one canary round (<= 10 % of the service groups, <= 1 simulated day)
    on the emulated cluster through an edge runtime, judged by prediction-powered inference.

    ``recent``: the fleet's recent days on the current policy (the gate's held-out log): the
    twin's replay of them gives the day-to-day variance of the change, so that the verdict is
    about the change averaged over the days the decision lives with, not the canary's day
    (`edgetwin.loop.verdict.day_to_day_variance`; None: about the canary's day, and it says so).

    Returns the `LoopResult` when its verdict is promote; else records the refusal or abstention
    (with its reason) in ``numbers`` and returns None. The fleet is a day the twin never saw
    (``seed + 30_000``), run by the logging policy (random) as the current policy. The plan starts
    from the gate's own abstention (``promotion``: the `PromotionResult` the abstention carries)."""
    from edgetwin.contract.errors import InputError
    from edgetwin.emulator.logs import generate_logs, make_policy
    from edgetwin.loop.plan import PlanBudget
    from edgetwin.loop.rounds import canary_loop
    from edgetwin.loop.twin_series import shared_replays
    from edgetwin.policies.gate import resolve_policy

    fleet_seed = seed + 30_000
    fleet_log, spec = generate_logs(config, 1, "random", seed=fleet_seed)
    candidate_spec = resolve_policy(policy_dir, twin, name="trained")
    baseline_spec = resolve_policy("logging", twin, name="current")
    try:
        # the plan's and the verdict's replays of the full switch are the same replays: run once
        # (`shared_replays`; `_replays_reusable` checks why that gives the same numbers)
        with shared_replays(*_replays_reusable(policy_dir, candidate_spec, baseline_spec)):
            result = canary_loop(
                twin, fleet_log, policy_dir, make_policy("random", spec, seed=seed), config,
                candidate_spec=candidate_spec, baseline_spec=baseline_spec,
                budget=PlanBudget(max_share=0.10, hours=24.0), max_rounds=1, seed=seed, fleet_seed=fleet_seed,
                decision=getattr(promotion, "decision", None), log=log,
                other_days=[recent] if recent is not None else None,
            )  # fmt: skip
    except InputError as e:  # e.g. 10 % of a small fleet is fewer than the 4 groups a canary needs
        numbers["canary"] = {"verdict": "abstain", "reason": f"no canary: {e}"}
        log(f"    no canary possible ({e}); nothing promoted, nothing served")
        return None
    (out / "canary.json").write_text(json.dumps(result.to_dict(), indent=1, default=float))
    numbers["canary"] = {
        "verdict": result.verdict, "reason": result.reason, "rounds": len(result.rounds),
        "share": result.rounds[0].plan["share"] if result.rounds else 0.0,
        "hours": result.rounds[0].plan["hours"] if result.rounds else 0.0,
        "candidate_agent_steps": result.agent_steps,
    }  # fmt: skip
    if result.verdict == "promote":
        return result
    if result.verdict == "refuse":
        numbers["gate_refused"] = result.reason
        log(f"    refused on the canary's evidence: {result.reason}")
    else:
        log(f"    the canary could not tell either (nothing promoted, nothing served): {result.reason}")
    return None


#: SB3 algorithms whose exported policy acts deterministically with no memory between calls
#: (`edgetwin.policies.export.LoadedPolicy.act`; ``recurrent_ppo`` keeps a state)
_MEMORYLESS = ("ppo", "a2c", "sac", "td3", "ddpg", "dqn", "maskable_ppo")


def _replays_reusable(policy_dir: Path, candidate: Any, baseline: Any) -> list[Any]:
    """Those of the canary's two policy specs whose twin replay depends on nothing but (twin, episode,
    world seed, member), so that `edgetwin.loop.twin_series.shared_replays` may run it once: the
    logging policy's (its factory builds a fresh clone per replay, seeded from the replay's seed:
    ``shared`` False), and the trained policy's when its export says it acts without memory (the one
    object `fixed_policy` hands every replay then answers a replay as it did the last time: its
    actions are deterministic and its ``reset()`` forgets a shield's history)."""
    doc = json.loads((Path(policy_dir) / "policy.json").read_text())
    memoryless = doc.get("kind") == "sb3" and doc.get("algorithm") in _MEMORYLESS
    return [s for s in (candidate, baseline) if s.factory is None or not s.shared or (s is candidate and memoryless)]
