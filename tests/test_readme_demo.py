"""The README's account of `edgetwin demo` on the defaults is one run's output: every number of its
paragraph is in what `python benchmarks/demo_run.py` recorded the demo printing
(docs/benchmarks/demo/results.json), and the ending it names is that run's. The slow test
`tests/test_demo.py::test_default_demo_follows_the_canarys_statistics` ties the ending to a live run."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = json.loads((ROOT / "docs" / "benchmarks" / "demo" / "results.json").read_text())
PRINTED = "\n".join(RESULTS["stdout"])
README = (ROOT / "README.md").read_text()
START, END = "On the embedded\ndefaults (seed 0) it ends", "It prints\nits time budget first"


def _paragraph() -> str:
    return " ".join(README[README.index(START) : README.index(END)].split())


#: the README's names of the demo's KPIs, and their log columns
COLUMNS = {"task time": "kpi.task_time_ms", "energy": "kpi.energy_j", "carbon": "kpi.carbon_g", "revenue": "kpi.revenue",
           "SLO violations": "kpi.slo_violation", "reward": "reward", "return": "return", "offload": "response.offload_ratio"}


def _names(text: str) -> list[str]:
    """"task time, energy or carbon" -> ["task time", "energy", "carbon"]."""
    return [x.strip() for x in re.split(r",| or | and ", text) if x.strip()]


def _printed(number: str) -> bool:
    """``number`` (sign and decimals as written) is printed as a number, not inside another."""
    return re.search(rf"(?<![\d.]){re.escape(number)}(?![\d])", PRINTED) is not None


def test_every_decimal_of_the_demo_paragraph_is_what_the_demo_printed() -> None:
    decimals = re.findall(r"[-+]?\d+\.\d+", _paragraph())
    assert len(decimals) >= 15, decimals  # the intervals, widths and trade-off are quoted
    assert [d for d in decimals if not _printed(d)] == []


def test_the_demo_paragraphs_counts_are_what_the_demo_printed() -> None:
    para = _paragraph()
    pairs = [  # (the README's phrase, the demo's own words), each with the number they share
        (r"support a (\d+) % claim", r"support at most (\d+)% and 90% was asked"),
        (r"naming the (\d+) days that would", r"(\d+) are needed \("),
        (r"puts (\d+ of the \d+) service groups", r"on (\d+ of \d+) service groups"),
        (r"for (\d+) h;", r"for (\d+) h\n"),
        (r"\((\d+) candidate agent-steps\)", r"\((\d+) candidate agent-steps;"),
    ]
    named = re.search(r"one day leaves (\w+(?: \w+)?)'s fleet level uncertain", para)
    assert named, "the paragraph names the KPI whose level one day leaves uncertain"
    col = COLUMNS[named.group(1)]
    pairs.append((r"its relative change is unbounded \(([-+]?\d+\.\d) % \[-inf, \+inf\]",
                  rf"{re.escape(col)}: ([-+]?\d+\.\d)% \[-inf%, \+inf%\]"))
    for readme, printed in pairs:
        said, did = re.search(readme, para), re.search(printed, PRINTED)
        assert said and did, (readme, printed)
        assert said.group(1).replace("of the ", "of ") == did.group(1), (said.group(0), did.group(0))


def test_the_ending_the_readme_names_is_the_recorded_runs() -> None:
    para = _paragraph()
    named = re.search(r"one day leaves (\w+(?: \w+)?)'s fleet level uncertain by more than the level itself", para)
    assert named, "the paragraph names the KPI the demo's reason names"
    assert f"undecided: {COLUMNS[named.group(1)]}'s interval is unbounded towards its margin" in PRINTED
    if "the other KPIs' are unbounded" in para:  # every KPI but offload, and the reason names the bound's KPIs
        assert re.search(r"response.offload_ratio: [-+]\d+\.\d% \[[-+]\d+\.\d%, [-+]\d+\.\d%\]", PRINTED)
        for kpi in ("kpi.task_time_ms", "kpi.slo_violation", "kpi.energy_j", "kpi.carbon_g", "kpi.revenue", "reward"):
            assert re.search(rf"{re.escape(kpi)}: [-+]\d+\.\d% \[-inf%, \+inf%\]", PRINTED), kpi
    if "names the KPIs that carry the bound" in para:
        assert "carry a bound on how much the change may move from day to day" in PRINTED
    undecided = para.startswith("On the embedded defaults (seed 0) it ends **undecided**")
    assert undecided == (RESULTS["verdict"] == "abstain")
    if "nothing is promoted or served" in para:
        assert RESULTS["promoted_version"] is None and not RESULTS["numbers"].get("served_decisions")
    assert RESULTS["outputs_identical_across_runs"]


def test_the_readme_demo_times_are_the_recorded_runs() -> None:
    """The README's demo times and their ratio to the older code are the recorded run's (same conditions)."""
    readme = " ".join(README.split())
    walls = " and ".join(f"{r['wall_s']:.1f} s" for r in RESULTS["runs"])
    base = RESULTS["baseline"]
    base_walls = " and ".join(f"{r['wall_s']:.1f} s" for r in base["runs"])
    assert f"--baseline {base['commit']}`" in readme
    assert f"took {walls} against the older code's {base_walls}: {RESULTS['wall_ratio_to_baseline']:.2f}x its time" in readme


def test_the_kpis_the_readme_says_no_canary_days_decide_are_the_plans() -> None:
    """README: "the plan says that no number of canary days of that size is expected to decide A, B or C (D and E: about
    N days)": exactly those KPIs' plan lines say so in the recorded run, and the others' their days; the KPIs it says the
    plan expects unbounded are exactly those whose expected interval is [-inf%, +inf%]."""
    para = _paragraph()
    m = re.search(r"no number of canary days of that size is expected to decide ([\w ,]+?) \(([\w ,]+?): about (\d+) "
                  r"days\)", para)  # fmt: skip
    assert m is not None
    lines = [x.strip() for x in RESULTS["stdout"] if "expected after" in x]
    undecidable = {x.split(":", 1)[0] for x in lines if "no number of such canary days is expected to" in x}
    assert undecidable == {COLUMNS[n] for n in _names(m.group(1))}, undecidable
    counted = [COLUMNS[n] for n in _names(m.group(2))]
    assert counted and len(counted) + len(undecidable) == len(lines)
    for col in counted:
        (line,) = [x for x in lines if x.startswith(col + ":")]
        assert f"(may not decide: about {m.group(3)} day(s) of such canaries would)" in line
    u = re.search(r"its expected intervals are the verdict's own, which divide by the baseline level's interval too, and "
                  r"leave ([\w ,]+?) unbounded", para)  # fmt: skip
    assert u is not None
    unbounded = {x.split(":", 1)[0] for x in lines if "expected after [-inf%, +inf%] (unbounded" in x}
    assert unbounded == {COLUMNS[n] for n in _names(u.group(1))}, unbounded


def test_the_readme_demo_phase_times_are_the_recorded_runs() -> None:
    """The README's promotion and what-if-wait seconds, new against the older code, are the recorded runs' phases."""
    readme = " ".join(README.split())

    def phase(runs: list[dict], key: str) -> str:
        return " and ".join(f"{r['phase_seconds'][key]:.1f} s" for r in runs)

    new, old = RESULTS["runs"], RESULTS["baseline"]["runs"]
    assert f"the promotion {phase(new, 'promote_and_serve')} against {phase(old, 'promote_and_serve')})" in readme
    wait = f"({phase(new, 'whatif_wait')} against {phase(old, 'whatif_wait')};"
    shorter = sum(r["phase_seconds"]["whatif_wait"] for r in new) < sum(r["phase_seconds"]["whatif_wait"] for r in old)
    assert f"the wait for the what-if report's rest got {'shorter' if shorter else 'longer'} {wait}" in readme
