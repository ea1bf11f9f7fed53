"""docs/federation.md's benchmark numbers are docs/benchmarks/federated_twin/results.json's, and its phase table is the plan's.

The page quoted part 1 of results.json as the 2026-11-27 run after the JSON had been overwritten by
the 2026-11-29 rerun under the multi-objective reward (ρ 0.07 / 1034 %, not 0.88 / 15.3 %); it now
says which is which, and this reads both sentences and "What the options cost in fidelity" (part 4)
against the file, number by number.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOC = " ".join((ROOT / "docs" / "federation.md").read_text().split())
RES = json.loads((ROOT / "docs" / "benchmarks" / "federated_twin" / "results.json").read_text())


def _said(pattern: str) -> re.Match[str]:
    m = re.search(pattern, DOC)
    assert m, f"docs/federation.md no longer says: {pattern}"
    return m


def _pair(score: dict[str, Any]) -> str:
    """"ρ / error" as the page writes it: ``0.07 / 1034 %``."""
    rho = f"{score['spearman']:.2f}".replace("-0.00", "0.00")
    err = 100 * score["mean_rel_error"]
    return f"{rho} / {err:.0f} %" if err >= 100 else f"{rho} / {err:.1f} %"


def test_part_1_in_the_json_is_the_rerun_the_page_names() -> None:
    part1, sc = RES["part1"], RES["part1"]["scores"]
    m = _said(r"results\.json`'s part 1 now holds the seed (\d+) rerun of (\d{4}-\d\d-\d\d) under the operator's "
              r"multi-objective reward: federated (.+?), (.+?) in replay \(centralised (.+?), in replay (.+?)\), "
              r"the light family (.+?): the (\d+) policies' true returns lie between ([-\d.]+) and \+([\d.]+) "
              r"\((\d+) of them within ±0\.1\)")  # fmt: skip
    seed, _, fed, fed_r, cen, cen_r, light, n, lo, hi, near = m.groups()
    assert int(seed) == part1["seed"] == RES["args"]["seed"] and str(RES["args"]["parts"]) == "1"
    assert (fed, fed_r) == (_pair(sc["federated"]), _pair(sc["federated (replay)"]))
    assert (cen, cen_r) == (_pair(sc["centralised"]), _pair(sc["centralised (replay)"]))
    assert light == _pair(sc["federated, light family (BC + GMM)"])
    real = [p["real"] for p in part1["policies"]]
    assert int(n) == len(real) and (f"{min(real):.2f}", f"{max(real):.2f}") == (lo, hi)
    assert sum(abs(r) <= 0.1 for r in real) == int(near)
    before = _said(r"The benchmark page's part 4 and the seed 1 and 2 rows of its part 1 are from before the setting "
                   r"\((\d{4}-\d\d-\d\d) morning\)").group(1)  # fmt: skip
    for s in (1, 2):
        assert RES[f"seed{s}_part1"]["when"].startswith(before), RES[f"seed{s}_part1"]["when"]


def test_the_options_costs_are_part_4() -> None:
    """"What the options cost in fidelity": dense, int8, top-k, secure, FedAvgM and DP from part 4."""
    p4 = {k: v["scores"] for k, v in RES["part4"].items()}
    bytes_ = {k: v["bytes_up_per_site"] for k, v in RES["part4"].items()}
    dense, int8, topk = p4["dense (FedAvg)"], p4["int8"], p4["top-k 10 % + int8"]
    m = _said(r"against dense FedAvg \(generated populations (.+?), replay (.+?), ρ / mean relative error\)")
    assert m.groups() == (_pair(dense["generated"]), _pair(dense["replay"]))
    m = _said(r"int8 sends a quarter of the bytes for at most ([\d.]+) points more error; top-k 10 % \+ int8 a "
              r"fifteenth for \+([\d.]+) \(replay ([\d.]+) points better\); secure aggregation scores as dense .*? "
              r"at twice the bytes")  # fmt: skip
    assert round(bytes_["dense (FedAvg)"] / bytes_["int8"]) == 4 and round(bytes_["dense (FedAvg)"] / bytes_["top-k 10 % + int8"]) == 15
    worst = max(100 * (int8[k]["mean_rel_error"] - dense[k]["mean_rel_error"]) for k in ("generated", "replay"))
    assert f"{worst:.1f}" == m.group(1)
    assert f"{100 * (topk['generated']['mean_rel_error'] - dense['generated']['mean_rel_error']):.1f}" == m.group(2)
    assert f"{100 * (dense['replay']['mean_rel_error'] - topk['replay']['mean_rel_error']):.1f}" == m.group(3)
    assert all(_pair(p4["secure aggregation"][k]) == _pair(dense[k]) for k in dense) and round(bytes_["secure aggregation"] / bytes_["dense (FedAvg)"]) == 2
    fedavgm = p4["FedAvgM"]
    m = _said(r"FedAvgM at its defaults keeps the response model \(replay ([\d.]+) %\) but overshoots in the "
              r"population's 10 rounds \(generated (.+?)\)")  # fmt: skip
    assert f"{100 * fedavgm['replay']['mean_rel_error']:.1f}" == m.group(1)
    assert m.group(2) == f"{fedavgm['generated']['spearman']:.2f} / {100 * fedavgm['generated']['mean_rel_error']:.0f} %"
    dp = RES["part4"]["DP (noise multiplier 1, clip 1)"]
    m = _said(r"\(generated ρ ([-\d.]+), replay error (\d+) %\) and still spends ε (\d+) at δ = 1e-5")
    assert m.groups() == (f"{dp['scores']['generated']['spearman']:.2f}", f"{100 * dp['scores']['replay']['mean_rel_error']:.0f}",
                          f"{dp['privacy']['epsilon']:.0f}")  # fmt: skip
    m = _said(r"For the benchmark's 4 sites it is (\d+) \(behaviour cloning\), (\d+) \(adversarial\) and (\d+) \(population\)")
    nts = dp["privacy"]["noise_to_signal"]
    assert m.groups() == tuple(f"{nts[k]:.0f}" for k in ("weights", "adversarial", "population"))
    assert dp["privacy"]["delta"] == 1e-5 and len(RES["sites"]) == 4


def test_the_phase_table_names_the_plans_phases() -> None:
    """"What each site computes on its own rows, and what travels": the table's phases are the ones
    `TwinFitPlan.shapes` sizes (read from its source: every ``phase == "..."`` / ``phase in (...)``),
    and the order sentence names each of them."""
    import ast
    import inspect

    from edgetwin.federation.twin.plan import TwinFitPlan

    tree = ast.parse(inspect.getsource(TwinFitPlan.shapes).strip().replace("\n    ", "\n"))
    sized = {
        c.value
        for node in ast.walk(tree) if isinstance(node, ast.Compare) and getattr(node.left, "id", None) == "phase"
        for cmp in node.comparators for c in ([cmp] if isinstance(cmp, ast.Constant) else getattr(cmp, "elts", []))
        if isinstance(c, ast.Constant)
    }  # fmt: skip
    table = DOC[DOC.index("| phase | a site sends | the coordinator |"):DOC.index("The order is")]
    rows = set(re.findall(r"\| `(\w+)`(?:, `(\w+)`)?(?: × [A-Z])? \|", table))
    listed = {n for pair in rows for n in pair if n}
    assert len(sized) >= 10 and listed == sized, sorted(listed ^ sized)
    order = _said(r"The order is (.*?) per member\.").group(1)
    assert set(re.findall(r"[a-z_]+\d?", order)) - {"per", "member"} >= sized - {"causal_sums", "causal_grad"}
