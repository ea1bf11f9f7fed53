"""`benchmarks/demo_run.py` calls two runs of one seed identical when they printed the same, a canary
run's random id aside (unique by design: `edgetwin.loop.fleet._start_command`); anything else differing
is a difference."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import demo_run  # noqa: E402


def test_only_the_canary_run_id_and_the_time_budget_may_differ() -> None:
    first = ["time budget: ~56 s", "warning: edge: canary c4910ebdddfa2-ec4d798e stopped by its guard", "-31.9%"]
    assert demo_run.same_output(["time budget: ~57 s", first[1].replace("ec4d798e", "0a1b2c3d"), "-31.9%"], first)
    assert not demo_run.same_output([first[0], first[1].replace("c4910ebdddfa2", "c4910ebdddfa3"), "-31.9%"], first)
    assert not demo_run.same_output([*first[:2], "-31.8%"], first)
