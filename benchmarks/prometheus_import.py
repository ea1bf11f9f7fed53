"""Throughput of ``edgetwin logs import prometheus`` against reading the same rows from Parquet.

A day of the emulated cluster (``--agents`` service groups, ``--steps`` ticks of ``--step-seconds``;
default 1,000 x 1,440 x 60 s: a day at 1-minute steps, every column of its spec + reward) is written
as OpenMetrics, backfilled into a real Prometheus (Debian's ``prometheus``/``promtool``, started here
on a loopback port with a temporary TSDB, stopped at the end), and imported back over
``/api/v1/query_range`` with the mapping the emulator writes. The import is timed end to end (HTTP,
JSON, assembly, Parquet write, spec skeleton, validation), and checked: the same rows and values as
the emulator's log, no row quarantined. The baseline is reading the same rows from Parquet
(`read_table`) and validating them (`validate_log`), in the same run.

    python benchmarks/prometheus_import.py                     # the full day (writes docs)
    python benchmarks/prometheus_import.py --agents 100 --no-write

Optional ``--offline`` also times ``--from-file`` (prometheus-client's pure-Python parser) on the
same dump. Writes ``docs/benchmarks/prometheus_import/results.json`` and the "Prometheus import"
section of docs/benchmarks/prometheus_import/README.md (its page).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np
import pandas as pd

from edgetwin.contract.logs import read_table, write_table
from edgetwin.contract.prometheus.http import PrometheusHTTP
from edgetwin.contract.prometheus.importer import import_prometheus
from edgetwin.contract.prometheus.mapping import Mapping
from edgetwin.contract.validate import validate_log
from edgetwin.emulator.cluster import ClusterConfig
from edgetwin.emulator.logs import generate_logs, write_openmetrics_logs

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "docs" / "benchmarks" / "prometheus_import" / "results.json"
DOC = ROOT / "docs" / "benchmarks.md"
SECTION = "## Prometheus import"
DAY0 = 1767225600  # 2026-01-01T00:00:00Z


class Prometheus:
    """The ``prometheus`` binary on a free loopback port over ``data_dir`` (no scrape jobs)."""

    def __init__(self, workdir: Path, data_dir: Path) -> None:
        self.exe = shutil.which("prometheus")
        if self.exe is None:
            sys.exit("prometheus is not on PATH (Debian: apt-get install -y prometheus)")
        self.workdir, self.data_dir = workdir, data_dir
        (workdir / "prometheus.yml").write_text('{"global": {}, "scrape_configs": []}')
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""

    def __enter__(self) -> Prometheus:
        for _ in range(5):
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            self.url = f"http://127.0.0.1:{port}"
            self.proc = subprocess.Popen(
                [self.exe, f"--config.file={self.workdir / 'prometheus.yml'}", f"--storage.tsdb.path={self.data_dir}",
                 f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=100y", "--log.level=warn",
                 "--query.max-samples=200000000"],
                stdout=subprocess.DEVNULL, stderr=(self.workdir / "prometheus.log").open("ab"),
            )  # fmt: skip
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    with urllib.request.urlopen(self.url + "/api/v1/status/flags", timeout=2) as r:
                        if json.loads(r.read())["data"].get("storage.tsdb.path") == str(self.data_dir):
                            with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r2:
                                if r2.status == 200:
                                    return self
                except OSError:
                    pass
                time.sleep(0.2)
            self.__exit__()
        sys.exit(f"prometheus did not start; see {self.workdir / 'prometheus.log'}")

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None


def timed(fn, repeat: int = 1):  # type: ignore[no-untyped-def]
    """(median seconds, last result) of ``repeat`` calls."""
    times, out = [], None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--agents", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=1440)
    ap.add_argument("--step-seconds", type=float, default=60.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=1, help="runs of each timing (median)")
    ap.add_argument("--offline", action="store_true", help="also time --from-file on the same dump")
    ap.add_argument("--no-write", action="store_true", help="print, do not write the docs")
    args = ap.parse_args()
    cmd = "python benchmarks/prometheus_import.py" + "".join(
        f" --{k.replace('_', '-')} {v}" for k, v in (("agents", args.agents), ("steps", args.steps),
                                                    ("step_seconds", args.step_seconds), ("repeat", args.repeat))
        if v != ap.get_default(k)
    ) + (" --offline" if args.offline else "")  # fmt: skip
    load_before = os.getloadavg()
    tmp = Path(tempfile.mkdtemp(prefix="edgetwin-prom-bench-"))
    try:
        t_emul, (log, spec) = timed(lambda: generate_logs(
            ClusterConfig(n_agents=args.agents, steps=args.steps, step_seconds=args.step_seconds), episodes=1, seed=args.seed))
        t_om, (dump, mapping) = timed(lambda: write_openmetrics_logs(log, spec, tmp / "day.om", start=DAY0))
        value_cols = Mapping.load(mapping).column_names  # every feature, reward, propensity: one query each
        rows, n_cols = len(log), len(value_cols)
        print(f"emulated {rows:,} rows x {n_cols} value columns (+ the policy label) in {t_emul:.1f}s", flush=True)
        dump_mb = dump.stat().st_size / 1e6
        print(f"OpenMetrics: {dump_mb:,.0f} MB in {t_om:.1f}s", flush=True)
        t_fill, _ = timed(lambda: subprocess.run(
            [shutil.which("promtool") or "promtool", "tsdb", "create-blocks-from", "openmetrics", str(dump), str(tmp / "tsdb")],
            check=True, capture_output=True))  # fmt: skip
        print(f"promtool backfill: {t_fill:.1f}s", flush=True)
        parquet = write_table(log, tmp / "same.parquet")
        spec.save(tmp / "same.spec.toml")
        t_read, _ = timed(lambda: read_table(parquet), args.repeat)
        t_read_val, _ = timed(lambda: validate_log(parquet, write_quarantine=False), args.repeat)
        print(f"parquet: read {t_read:.2f}s, read + validate {t_read_val:.2f}s", flush=True)
        end = DAY0 + args.steps * args.step_seconds
        with Prometheus(tmp, tmp / "tsdb") as prom:
            clients: list[PrometheusHTTP] = []

            def run_import(i: list[int] = [0]):  # type: ignore[no-untyped-def]  # noqa: B006
                i[0] += 1
                client = PrometheusHTTP(prom.url, timeout=600)
                clients.append(client)
                return import_prometheus(mapping, tmp / f"imported{i[0]}.parquet", start=DAY0, end=end,
                                         step=args.step_seconds, client=client)  # fmt: skip

            timed(run_import)  # warm-up: the server's first read of the blocks (page cache, postings)
            t_import, res = timed(run_import, args.repeat)
        print(f"import: {t_import:.1f}s ({clients[-1].requests} requests)", flush=True)
        t_offline = None
        if args.offline:
            t_offline, _ = timed(lambda: import_prometheus(mapping, tmp / "offline.parquet", start=DAY0, end=end,
                                                           step=args.step_seconds, from_file=dump))  # fmt: skip
            print(f"offline import: {t_offline:.1f}s", flush=True)
        got = res.table.sort_values(["t", "agent"]).reset_index(drop=True)
        want = log.sort_values(["t", "agent"]).reset_index(drop=True)
        cols = value_cols
        same_rows = len(got) == len(want) and (got["agent"].to_numpy() == want["agent"].to_numpy()).all()
        same_rows = same_rows and (got["policy"].to_numpy() == want["policy"].to_numpy()).all()
        diff = np.abs(got[cols].to_numpy(float) - want[cols].to_numpy(float))
        same_nan = (np.isnan(got[cols].to_numpy(float)) == np.isnan(want[cols].to_numpy(float))).all()
        max_diff = float(np.nanmax(diff)) if same_rows and same_nan else float("nan")
        assert same_rows and max_diff == 0.0 and res.report.n_quarantined == 0, (len(got), len(want), max_diff)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    load_after = os.getloadavg()
    machine = (
        f"{os.cpu_count()} CPU cores shared with other sessions, {platform.machine()}, Python {platform.python_version()}, "
        f"pandas {pd.__version__}, Prometheus {_prom_version()}"
    )
    result = {
        "command": cmd,
        "machine": machine,
        "load_before": [round(x, 1) for x in load_before],
        "load_after": [round(x, 1) for x in load_after],
        "agents": args.agents, "steps": args.steps, "step_seconds": args.step_seconds,
        "rows": rows, "value_columns": n_cols, "samples": rows * n_cols,
        "openmetrics_mb": round(dump_mb, 1),
        "seconds": {"emulate": t_emul, "write_openmetrics": t_om, "promtool_backfill": t_fill,
                    "parquet_read": t_read, "parquet_read_validate": t_read_val, "import_http": t_import,
                    "import_offline": t_offline},
        "rows_per_s": {"import_http": rows / t_import, "parquet_read": rows / t_read,
                       "parquet_read_validate": rows / t_read_val,
                       "import_offline": None if t_offline is None else rows / t_offline},
        "import_vs_parquet_read": t_import / t_read,
        "import_vs_parquet_read_validate": t_import / t_read_val,
        "http_requests": clients[-1].requests,
        "identical": True,
    }  # fmt: skip
    print(json.dumps(result, indent=1))
    if args.no_write:
        return
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=1) + "\n")
    import _docs

    r, s = result["rows_per_s"], result["seconds"]
    size_note = "" if (args.agents, args.steps, args.step_seconds) == (1000, 1440, 60.0) else (
        f" **Smaller than the target size** (a day of 1,000 service groups at 1-minute steps): {args.agents:,} x "
        f"{args.steps:,} x {args.step_seconds:g} s, because the full size did not fit the shared machine's budget."
    )
    offline_row = "" if t_offline is None else (
        f"| import from an OpenMetrics file (`--from-file`) | {s['import_offline']:.1f} | {r['import_offline']:,.0f} | "
        f"{s['import_offline'] / t_read:,.0f}× |\n"
    )
    text = f"""{SECTION}

Command: `{cmd}`. Machine: {machine}; load average {result['load_before'][0]} before, {result['load_after'][0]} after (other jobs shared the cores: times are upper bounds).

No source paper measures this. A day of the emulated cluster — {args.agents:,} service groups x {args.steps:,} steps of {args.step_seconds:g} s = {rows:,} rows x {n_cols} value columns ({rows * n_cols:,} samples; each series also labelled with its `policy`) — written as OpenMetrics, backfilled with `promtool tsdb create-blocks-from openmetrics` into a real Prometheus on a loopback port, and imported back with `edgetwin logs import prometheus`'s library call over `/api/v1/query_range` ({result['http_requests']} requests: {result['http_requests'] // n_cols} per column, at most 11,000 points per series each). The import is end to end: HTTP + JSON, the table, Parquet write, spec skeleton, validation; its result is checked equal to the emulator's log (same rows, values identical, nothing quarantined). Ratios are against reading the same rows from Parquet in the same run.{size_note}

| what | seconds | rows/s | vs Parquet read |
|---|---:|---:|---:|
| read the same rows from Parquet (`read_table`) | {s['parquet_read']:.2f} | {r['parquet_read']:,.0f} | 1× |
| read + validate from Parquet (`validate_log`) | {s['parquet_read_validate']:.2f} | {r['parquet_read_validate']:,.0f} | {s['parquet_read_validate'] / t_read:,.1f}× |
| import from Prometheus (HTTP, whole pipeline) | {s['import_http']:.1f} | {r['import_http']:,.0f} | {s['import_http'] / t_read:,.0f}× |
{offline_row}
Preparing the server (not part of the import): emulating the day {s['emulate']:.1f} s, writing OpenMetrics ({dump_mb:,.0f} MB) {s['write_openmetrics']:.1f} s, `promtool` backfill {s['promtool_backfill']:.1f} s.
"""
    _docs.write_section(SECTION, text, DOC)
    print(f"wrote {RESULTS} and the {SECTION!r} section of {DOC}")


def _prom_version() -> str:
    exe = shutil.which("prometheus")
    if exe is None:
        return "?"
    out = subprocess.run([exe, "--version"], capture_output=True, text=True).stdout or ""
    return out.split()[2] if len(out.split()) > 2 else "?"


if __name__ == "__main__":
    main()
