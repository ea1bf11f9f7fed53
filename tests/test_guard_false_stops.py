"""The canary guard's false-stop benchmark (docs/benchmarks/canary_guard/, issue 48).

The page's numbers are its JSON's; a recorded stop and a recorded non-stop of the benchmark are
reproduced by its core (`run_canary` on the same day and slice).
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "benchmarks" / "canary_guard"


def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("guard_false_stops", ROOT / "benchmarks" / "guard_false_stops.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["guard_false_stops"] = mod
    spec.loader.exec_module(mod)
    return mod


def results() -> dict:  # type: ignore[type-arg]
    return json.loads((PAGE / "results.json").read_text())


def test_the_page_prints_the_json_s_numbers() -> None:
    res, page = results(), (PAGE / "README.md").read_text()
    rows = 0
    for g, cands in res["guards"].items():
        for c, s in cands.items():
            lo, hi = (f"{100 * v:.1f} %" for v in s["ci"])
            line = f"| {g} | {c} | {s['canaries']} | {s['stops']} | {100 * s['rate']:.1f} % | [{lo}, {hi}] |"
            assert line in page, line
            rows += 1
            assert s["stops"] == sum(v["stops"] for v in s["by_kpi"].values())
            assert s["stops"] == len(s["runs"])
    assert rows == len(re.findall(r"^\| as shipped \| \w+ \| \d+ \| \d+ \| [\d.]+ % \|", page, flags=re.M))
    for line in (f"- {c}: {s['stops']} false stops in {s['canaries']} canaries ({100 * s['rate']:.1f} %, 95 % CP upper "
                 f"{100 * s['ci'][1]:.1f} %): within alpha {res['alpha']:g}." for c, s in res["guards"]["as shipped"].items()
                 if c in ("aa", "at_margin")):  # fmt: skip
        assert line in page, line
    # >= 200 canaries per candidate, as the page says
    assert min(s["canaries"] for cands in res["guards"].values() for s in cands.values()) >= 200


def test_the_benchmark_core_reproduces_a_recorded_stop_and_a_non_stop(tmp_path: Path) -> None:
    g, res = bench(), results()
    shipped = res["guards"]["as shipped"]
    stopped = [(c, d, k, kpi) for c in ("aa", "at_margin", "regressing") for d, k, kpi in shipped[c]["runs"]]
    assert stopped, "the run recorded no stop of the row-level candidates"
    c, d, k, kpi = stopped[0]
    day = g.fleet_day(d)
    sl = g.draw_slice(sorted(set(day["agent"].astype(str))), d, k)
    out = g.run_canary(day, sl, g.CANDIDATES[c], tmp_path / "a")
    assert out["stopped"] and out["kpi"] == kpi
    # a canary the run did not stop (the same day, the first slice not stopped)
    free = next(j for j in range(res["slices_per_day"]) if [d, j] not in [r[:2] for r in shipped["aa"]["runs"]])
    sl = g.draw_slice(sorted(set(day["agent"].astype(str))), d, free)
    assert not g.run_canary(day, sl, 0.0, tmp_path / "c")["stopped"]


def test_the_readme_guard_rates_are_the_benchmarks() -> None:
    """The README's false-stop and power sentence is docs/benchmarks/canary_guard/results.json's."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    readme = " ".join((root / "README.md").read_text().split())
    g = json.loads((root / "docs/benchmarks/canary_guard/results.json").read_text())["guards"]["as shipped"]
    aa, reg = g["aa"], g["regressing"]
    lo, hi = (100 * x for x in aa["ci"])
    assert (f"it stops {100 * aa['rate']:.1f} % of A/A canaries on the emulated cluster ({aa['stops']} of "
            f"{aa['canaries']}, Clopper-Pearson 95 % [{lo:.1f} %, {hi:.1f} %]) but only {100 * reg['rate']:.1f} % of "
            "candidates 3x beyond every margin") in readme
    # the demo paragraph weighs a guard stop against these rates only when the recorded demo's guard stopped it
    stopped = "the site's guard stops it after" in readme
    said = f"it stopped {aa['stops']} of {aa['canaries']} A/A canaries on the emulated cluster" in readme
    assert said == stopped, "the demo paragraph's guard-stop sentence must follow the recorded demo"
    if stopped:
        pol = g["policy"]
        assert pol["stops"] == 0, "the README's demo paragraph says the demo's policy was stopped in none of its canaries"
        assert (f"it stopped {aa['stops']} of {aa['canaries']} A/A canaries on the emulated cluster, and none of "
                f"{pol['canaries']} canaries of this policy") in readme
