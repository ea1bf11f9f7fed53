"""Throughput of log validation: `validate_log` and `load_valid_log` against just reading the table.

No source paper has a table for this (validation is edgetwin's own contract), so the "paper"
column is empty; the requirement is "a million rows in seconds". The log is a synthetic toy
system (7 features + reward, 100 agents per step) with 0.1 % of its cells corrupted, written as
Parquet and CSV. Each timing is the median of ``--repeat`` runs; the ratio is against reading the
same file with `edgetwin.contract.logs.read_table` in the same run.

    python benchmarks/bench_validate.py            # 100k and 1M rows, writes docs/benchmarks/validate/README.md
    python benchmarks/bench_validate.py --rows 100000 --no-write
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm import tqdm

from edgetwin.contract.logs import read_table, write_table
from edgetwin.contract.spec import Feature, TwinSpec, spec_path_for
from edgetwin.contract.validate import QuarantineWarning, load_valid_log, validate_log

SECTION = "## Log validation"
DOC = Path(__file__).resolve().parents[1] / "docs" / "benchmarks" / "validate" / "README.md"
RESULTS = DOC.parent / "results.json"  # the page's numbers, for the at-a-glance table


def toy_spec() -> TwinSpec:
    return TwinSpec(
        features=(
            Feature("profile.arrival_rate", "heavy_tailed", low=0.0),
            Feature("profile.tier", "discrete", values=(1.0, 2.0, 3.0)),
            Feature("state.queue_len", low=0.0, high=100.0),
            Feature("action.cpu_share", low=0.0, high=1.0),
            Feature("action.admit", "binary"),
            Feature("response.offload", low=0.0, high=1.0),
            Feature("kpi.latency_ms", low=0.0),
        ),
        name="bench-queue",
    )


def synthetic_log(n_rows: int, seed: int = 0, n_agents: int = 100, n_t: int = 100) -> pd.DataFrame:
    """``n_rows`` rows of (episode, t, agent), 0.1 % of cells corrupted (out of bounds or NaN)."""
    rng = np.random.default_rng(seed)
    i = np.arange(n_rows)
    ep, t, ag = i // (n_agents * n_t), (i // n_agents) % n_t, i % n_agents
    df = pd.DataFrame(
        {
            "episode": pd.Series(ep).astype(str).radd("day"),
            "t": t.astype(np.int64),
            "agent": pd.Series(ag).astype(str).radd("sg"),
            "scenario": np.where(ag % 2 == 0, "web", "batch"),
            "site": np.where(ep % 2 == 0, "north", "south"),
            "profile.arrival_rate": rng.exponential(size=n_rows),
            "profile.tier": rng.integers(1, 4, n_rows).astype(np.float64),
            "state.queue_len": rng.uniform(0, 100, n_rows),
            "action.cpu_share": rng.uniform(size=n_rows),
            "action.admit": rng.integers(0, 2, n_rows).astype(np.float64),
            "response.offload": rng.uniform(size=n_rows),
            "kpi.latency_ms": rng.uniform(1, 50, n_rows),
            "reward": rng.normal(size=n_rows),
        }
    )
    bad = rng.choice(n_rows, max(1, n_rows // 1000), replace=False)
    half = len(bad) // 2
    df.loc[bad[:half], "state.queue_len"] = 150.0
    df.loc[bad[half:], "action.cpu_share"] = np.nan
    return df


@dataclass
class Timing:
    """Median seconds of one log size and format."""

    rows: int
    format: str
    quarantined: int
    read_s: float
    validate_s: float
    load_s: float


def median_seconds(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def run(sizes: list[int], repeat: int) -> list[Timing]:
    rows: list[Timing] = []
    jobs = [(n, fmt) for n in sizes for fmt in ("parquet", "csv")]
    with tempfile.TemporaryDirectory() as tmp:
        for n, fmt in tqdm(jobs, desc="validate benchmark"):
            path = write_table(synthetic_log(n), Path(tmp) / f"log{n}.{fmt}")
            toy_spec().save(spec_path_for(path))
            q = Path(tmp) / "q.csv"
            read_s = median_seconds(lambda p=path: read_table(p), repeat)
            val_s = median_seconds(lambda p=path, q=q: validate_log(p, quarantine_path=q), repeat)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", QuarantineWarning)
                load_s = median_seconds(lambda p=path: load_valid_log(p), repeat)
            report = validate_log(path, quarantine_path=q)
            rows.append(Timing(n, fmt, report.n_quarantined, read_s, val_s, load_s))
    return rows


def markdown(results: list[Timing], command: str, repeat: int) -> str:
    lines = [
        SECTION,
        "",
        f"Command: `{command}` (median of {repeat} runs). Machine: {os.cpu_count()} CPU cores, "
        f"{platform.machine()}, Python {platform.python_version()}, pandas {pd.__version__}; "
        "other jobs were sharing the cores, so absolute times are upper bounds.",
        "",
        "No source paper measures this; the requirement is that a million rows validate in seconds. "
        "`validate` = read + every check + write the quarantine CSV; `load` = `load_valid_log` "
        "(validate + typed, sorted table). Ratios are against reading the same file in the same run.",
        "",
        "| rows | format | quarantined | paper | read (s) | validate (s) | validate / read | "
        "validate rows/s | load (s) | load / read |",
        "|---:|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        lines.append(
            f"| {r.rows:,} | {r.format} | {r.quarantined:,} | — | {r.read_s:.2f} | {r.validate_s:.2f} | "
            f"{r.validate_s / r.read_s:.1f}× | {r.rows / r.validate_s:,.0f} | {r.load_s:.2f} | "
            f"{r.load_s / r.read_s:.1f}× |"
        )
    return "\n".join(lines) + "\n"


def write_section(text: str, doc: Path = DOC) -> None:
    """Replace this script's section of its page, docs/benchmarks/validate/README.md, in one write."""
    import _docs

    _docs.write_section(SECTION, text, doc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-write", action="store_true", help="print only; leave docs/benchmarks/validate/README.md alone")
    args = parser.parse_args()
    command = "python benchmarks/bench_validate.py"
    if args.rows != [100_000, 1_000_000]:
        command += " --rows " + " ".join(map(str, args.rows))
    if args.repeat != 3:
        command += f" --repeat {args.repeat}"
    results = run(args.rows, args.repeat)
    text = markdown(results, command, args.repeat)
    print(text)
    if not args.no_write:
        write_section(text)
        numbers = {
            "command": command, "repeat": args.repeat,
            "machine": f"{os.cpu_count()} CPU cores, {platform.machine()}, Python {platform.python_version()}, "
                       f"pandas {pd.__version__}",
            "rows": [{**asdict(r), "validate_rows_per_s": r.rows / r.validate_s} for r in results],
        }
        RESULTS.write_text(json.dumps(numbers, indent=1) + "\n")
        print(f"wrote section {SECTION!r} of {DOC} and {RESULTS}")


if __name__ == "__main__":
    main()
