"""`benchmarks/scale.py`'s tick phases (issue 47): the fastest of several passes is kept whole, and the
page says how many passes of how many ticks the table is."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from edgetwin.twin.twin import Twin

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import scale  # noqa: E402
from test_fused_tick import twin  # noqa: E402, F401 - its module fixture: the tiny twin

torch.set_num_threads(1)


def test_the_fastest_pass_is_kept_whole(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    tiny: Twin = request.getfixturevalue("twin")  # the fused tick's tiny twin (tests/test_fused_tick.py)
    monkeypatch.setattr(Twin, "load", staticmethod(lambda _path: tiny))
    clock = {"t": 0.0, "steps": 0}
    ticks, passes = 4, 3
    fast_pass = 1  # the first and the last pass cost 10x a tick: the middle one must be kept

    def fake_clock() -> float:
        return clock["t"]

    step = tiny.simulation(n_agents=8, seed=0).__class__.step

    def counted(self, *a, **k):  # type: ignore[no-untyped-def]
        out = step(self, *a, **k)
        k_pass = (clock["steps"] - 10) // ticks if clock["steps"] >= 10 else -1
        clock["t"] += 1.0 if k_pass in (-1, fast_pass) else 10.0
        clock["steps"] += 1
        return out

    monkeypatch.setattr(scale.time, "process_time", fake_clock)
    monkeypatch.setattr("edgetwin.twin.simulation.Simulation.step", counted)
    ph = scale.tick_phases(Path("unused"), 8, ticks=ticks, passes=passes)
    assert (ph["passes"], ph["ticks"]) == (passes, ticks)
    assert ph["tick_ms"] == pytest.approx(1e3)  # a fast pass: 1 s a tick on the fake clock
    top = [v for k, v in ph["phases_ms"].items() if not k.startswith("  ")]
    assert sum(top) == pytest.approx(ph["tick_ms"])
    assert np.isfinite(top).all()


def test_the_page_says_how_many_passes_of_how_many_ticks() -> None:
    res = {"throughput": [{"agents": 1000, "ticks": 200, "twin": 1.0, "emulator": 1.0, "ratio": 1.0, "load": "1"}],
           "tick_phases": [{"agents": 1000, "tick_ms": 1.0, "phases_ms": {"network": 0.5, "other": 0.5},
                            "load": "1", "ticks": 200, "passes": 3}]}
    lines = scale.section({**_fit_part(), **res}).splitlines()
    assert any("the fastest of 3 passes of 200 ticks, in one process" in ln for ln in lines)


def _fit_part() -> dict:
    """The fields of part 1 that `scale.section` needs, empty."""
    return {"machine": "m", "command": "c", "twin": "t", "agents": 1, "fits": [], "exponent": {}, "target_1m": "-"}
