"""The main job, `edgetwin demo`, as a user runs it: wall and CPU time, what it printed, how it ended.

The README quotes the demo's outcome on the defaults (the gate's supported level, the canary plan's
widths, the verdict's intervals, the trade-off on the cluster, the further days it names) and its time
on a quiet machine. Those sentences are claims about the code; this script records, from real runs of
the installed command, what the demo printed (stdout, line by line) and its summary, so that
`tests/test_readme_demo.py` can tie every number of the README's demo paragraph to one run's output.

The timing is the command's own wall clock and its children's CPU seconds (``resource``), with the
load average before and after, since a shared machine's wall time measures mostly the load.

    python benchmarks/demo_run.py                # one run: docs/benchmarks/demo/{README.md,results.json}
    python benchmarks/demo_run.py --repeat 2     # several runs (the output of the first is kept; every
                                                 # run's times are recorded, and their outputs compared)
    python benchmarks/demo_run.py --repeat 2 --baseline fe80514
                                                 # and the demo of that commit (a git worktree of it),
                                                 # alternating with this code's runs: the time ratio in
                                                 # the same conditions (a shared machine's speed drifts)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import _docs  # noqa: E402

RESULTS = ROOT / "docs" / "benchmarks" / "demo" / "results.json"
SECTION = "## The main job: edgetwin demo"
#: progress bars (tqdm's and rich's), redrawn with carriage returns on stderr
_PROGRESS = re.compile(r"it/s|s/it|\d+%\||━")


def printed_lines(stdout: str, stderr: str, workdir: str) -> list[str]:
    """What a person reads: the phase lines (stderr) then the result lines (stdout), without progress
    bars or the lines that name this run's paths (under ``workdir``)."""
    lines = []
    for text in (stderr, stdout):
        for ln in re.split(r"[\r\n]", re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "\n", text)):
            if ln.strip() and not _PROGRESS.search(ln) and workdir not in ln:
                lines.append(ln.rstrip())
    return lines


def _commit() -> str:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
        return out.stdout.strip() + ("+changes" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


#: a canary run's id: its canary id and a random suffix (`edgetwin.loop.fleet._start_command`). Unique
#: by design — the same order run twice is two runs: two spools, and bus message ids JetStream's
#: de-duplication must not confuse — so it is the one printed thing two runs of one seed do not share.
RUN_ID = re.compile(r"\b(c[0-9a-f]+)-[0-9a-f]{8}\b")


def same_output(lines: list[str], first: list[str]) -> bool:
    """Two runs printed the same, line 0 (the time budget) and canary runs' random ids aside."""
    return [RUN_ID.sub(r"\1-<run>", x) for x in lines[1:]] == [RUN_ID.sub(r"\1-<run>", x) for x in first[1:]]


def run_once(seed: int, code: Path = ROOT) -> dict:
    """One `python -m edgetwin.cli demo` of the code under ``code`` in a fresh directory: its printed
    lines (without progress bars and the lines that name paths), summary numbers, wall seconds and
    the CPU seconds of it and its children."""
    with tempfile.TemporaryDirectory(prefix="edgetwin-demo-") as tmp:
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        load0 = os.getloadavg()[0]
        t0 = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "edgetwin.cli", "demo", "--out", str(Path(tmp) / "demo"),
                               "--seed", str(seed)], capture_output=True, text=True, cwd=code,
                              env={**os.environ, "PYTHONPATH": str(code)})  # fmt: skip
        wall = time.perf_counter() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        if proc.returncode != 0:
            raise SystemExit(f"edgetwin demo exited {proc.returncode}: {proc.stdout[-2000:]}{proc.stderr[-2000:]}")
        summary = json.loads((Path(tmp) / "demo" / "demo-summary.json").read_text())
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    lines = printed_lines(proc.stdout, proc.stderr, tmp)
    return {"wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "load_before": round(load0, 2),
            "load_after": round(os.getloadavg()[0], 2), "stdout": lines,
            "numbers": summary.get("numbers", summary),
            # the demo's own phase clocks (`edgetwin.demo.QUIET_SECONDS` is read off a quiet run's)
            "phase_seconds": summary.get("seconds", {}), "phase_cpu_seconds": summary.get("cpu_seconds", {})}  # fmt: skip


def warm_up(code: Path) -> None:
    """A tiny `edgetwin demo` of the code under ``code`` (untimed): its first run compiles the numba
    kernels into that tree's cache (``cache=True``), which later runs load."""
    with tempfile.TemporaryDirectory(prefix="edgetwin-warm-") as tmp:
        subprocess.run([sys.executable, "-m", "edgetwin.cli", "demo", "--out", str(Path(tmp) / "demo"), "--agents", "10",
                        "--episodes", "2", "--steps", "8"], capture_output=True, text=True, cwd=code,
                       env={**os.environ, "PYTHONPATH": str(code)}, check=False)  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=1, help="runs of the demo (times of each are recorded)")
    ap.add_argument("--baseline", default=None, help="a git commit whose demo runs alternately with this code's")
    ap.add_argument("--warm", action="store_true",
                    help="first run a tiny demo of each code tree (untimed): numba compiles its kernels into a "
                         "fresh tree's cache on the first run, which would count against the baseline's worktree only")
    ap.add_argument("--out", type=Path, default=None,
                    help="write results.json into this directory instead (and not the docs page): a comparison "
                         "on a busy machine, not the record")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    runs, base_runs = [], []
    with tempfile.TemporaryDirectory(prefix="edgetwin-baseline-") as tmp:
        base = None
        if args.baseline:
            base = Path(tmp) / "code"
            subprocess.run(["git", "worktree", "add", "--detach", "-q", str(base), args.baseline], cwd=ROOT, check=True)
        try:
            if args.warm:
                for code in (ROOT, *([base] if base is not None else [])):
                    print(f"warming {code} (a tiny demo: numba's cache) ...", flush=True)
                    warm_up(code)
            for i in range(args.repeat):
                print(f"demo run {i + 1} of {args.repeat} ...", flush=True)
                runs.append(run_once(args.seed))
                print(f"  {runs[-1]['wall_s']:.1f} s wall, {runs[-1]['cpu_s']:.1f} CPU s, load {runs[-1]['load_before']:.1f}",
                      flush=True)  # fmt: skip
                if base is not None:
                    base_runs.append(run_once(args.seed, base))
                    print(f"  baseline {args.baseline}: {base_runs[-1]['wall_s']:.1f} s wall", flush=True)
        finally:
            if base is not None:
                subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, check=False)
    first = runs[0]
    same = all(same_output(r["stdout"], first["stdout"]) for r in runs[1:])
    n = first["numbers"]
    res = {
        "commit": _commit(), "seed": args.seed, "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "machine": f"{os.cpu_count()} CPUs", "runs": [{k: r[k] for k in ("wall_s", "cpu_s", "load_before", "load_after", "phase_seconds",
                                                                  "phase_cpu_seconds")} for r in runs],
        "outputs_identical_across_runs": same, "stdout": first["stdout"], "numbers": n,
        "verdict": (n.get("canary") or {}).get("verdict"), "promoted_version": n.get("promoted_version"),
    }  # fmt: skip
    if base_runs:
        res["baseline"] = {"commit": args.baseline, "runs": [{k: r[k] for k in ("wall_s", "cpu_s", "load_before", "load_after",
                                                                        "phase_seconds", "phase_cpu_seconds")}
                                                            for r in base_runs]}  # fmt: skip
        res["wall_ratio_to_baseline"] = round(sum(r["wall_s"] for r in runs) / sum(r["wall_s"] for r in base_runs), 3)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
        print(f"wrote {args.out / 'results.json'}" + (f" (wall ratio to {args.baseline}: {res['wall_ratio_to_baseline']:.3f})"
                                                     if base_runs else ""))  # fmt: skip
        return
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(res, indent=1) + "\n")
    times = ", ".join(f"{r['wall_s']:.1f} s wall / {r['cpu_s']:.1f} CPU s at load {r['load_before']:.1f}" for r in runs)
    if base_runs:
        times += (f"; the demo of {args.baseline}, run alternately in the same conditions: "
                  + ", ".join(f"{r['wall_s']:.1f} s wall" for r in base_runs)
                  + f" (this code's wall time {res['wall_ratio_to_baseline']:.2f}x the baseline's)")
    ending = res["promoted_version"] and f"promoted {res['promoted_version']}" or f"not promoted (canary: {res['verdict']})"
    text = f"""{SECTION}

`python benchmarks/demo_run.py{f' --repeat {args.repeat}' if args.repeat > 1 else ''}{f' --baseline {args.baseline}' if args.baseline else ''}` at {res['commit']} on
{res['date']} ({res['machine']}), seed {args.seed}: {times}. The same output in every run:
{'yes' if same else 'NO'}. How it ended: {ending}. What it printed (progress bars and paths left out):

```text
""" + "\n".join(first["stdout"]) + "\n```\n"
    _docs.write_section(SECTION, text)
    print(f"wrote {RESULTS.relative_to(ROOT)} and {_docs.page(SECTION).relative_to(ROOT)}")


if __name__ == "__main__":
    main()
