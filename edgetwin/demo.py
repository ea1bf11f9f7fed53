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

    def to_dict(self) -> dict[str, Any]:
        return {
            "out_dir": str(self.out_dir),
            "artifacts": {k: str(v) for k, v in self.artifacts.items()},
            "numbers": self.numbers,
            "seconds": {k: round(v, 2) for k, v in self.seconds.items()},
        }


def run_demo(
    out_dir: str | Path = "edgetwin-demo",
    seed: int = 0,
    agents: int = 200,
    episodes: int = 4,
    steps: int = 96,
    log: Callable[[str], None] = print,
) -> DemoResult:
    """Run the pipeline on the emulated cluster and write everything under ``out_dir``.

    Args:
        out_dir: directory for the log, its spec, the quarantine file, the twin, the policy, reports.
        seed: one seed for every stage (same seed, same result).
        agents, episodes, steps: size of the generated log (service groups, days, steps per day).
        log: where progress lines go.
    """
    from edgetwin.edge.cluster import ClusterConfig, generate_logs
    from edgetwin.twin.logs import write_table
    from edgetwin.twin.spec import spec_path_for
    from edgetwin.twin.validate import validate_log

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    res = DemoResult(out_dir=out)

    t0 = time.perf_counter()
    log(f"[1] emulated cluster: {agents} service groups x {episodes} episodes x {steps} steps")
    config = ClusterConfig(n_agents=agents, steps=steps)
    df, spec = generate_logs(config, episodes=episodes, policy="random", seed=seed, progress=True)
    log_path = write_table(df, out / "logs.parquet")
    spec.save(spec_path_for(log_path))
    res.artifacts["log"] = log_path
    res.artifacts["spec"] = spec_path_for(log_path)
    res.numbers["log_rows"] = len(df)
    res.seconds["generate"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    log("[2] validating the log against its spec")
    report = validate_log(log_path, quarantine_path=out / "logs.quarantine.csv")
    res.numbers["usable_rows"] = report.n_usable
    res.numbers["quarantined_rows"] = report.n_quarantined
    res.seconds["validate"] = time.perf_counter() - t0
    if not report.usable:
        raise RuntimeError(f"the generated log did not validate: {report.summary()}")

    (out / "demo-summary.json").write_text(json.dumps(res.to_dict(), indent=2))
    res.artifacts["summary"] = out / "demo-summary.json"
    return res
