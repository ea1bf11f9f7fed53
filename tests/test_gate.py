"""The promotion gate: a better policy is promoted, a bad one refused (exit 1), the pointer moves only on success."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from edgetwin.cli import main
from edgetwin.contract.errors import GateRefused, InputError
from edgetwin.contract.logs import write_table
from edgetwin.contract.spec import spec_path_for
from edgetwin.edge.registry import CASConflict, FileRegistry
from edgetwin.edge.signing import Signer, TrustStore, save_private_key
from edgetwin.emulator.cluster import ClusterConfig
from edgetwin.emulator.logs import generate_logs
from edgetwin.policies.export import export_policy
from edgetwin.policies.gate import Guard, parse_guards, promote, resolve_policy, run_gate
from edgetwin.policies.heuristics import LeastLoaded, SchedulingView, Target
from edgetwin.twin.twin import Twin
from edgetwin.twin.whatif import scenario_from_dict

torch.set_num_threads(1)

CONFIG = ClusterConfig(n_agents=48, steps=16)
GATE = {"episodes": 2, "seeds": 1, "steps": 10}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("gate")
    log, spec = generate_logs(CONFIG, episodes=4, policy="random", seed=1)
    twin = Twin.fit(
        log, spec, members=1, seed=0, progress=False, population_model="empirical", response_model="bc", bc_epochs=10
    )
    twin.save(d / "twin")
    recent, _ = generate_logs(CONFIG, episodes=2, policy="random", seed=2)  # "recent traffic", not trained on
    write_table(recent, d / "recent.parquet")
    spec.save(spec_path_for(d / "recent.parquet"))
    # better than the random logging policy: least-loaded placement, generous capacity, low price
    good = SchedulingView(
        "action.edge_share", (Target(1.0, "state.site_util"), Target(0.0, "state.cloud_util")),
        defaults={"action.capacity": 1.2, "action.price": 0.1},
    )  # fmt: skip
    # deliberately bad: nothing at the edge, no capacity, full price
    bad = SchedulingView("action.edge_share", (Target(0.0, 0.5),), defaults={"action.capacity": 0.0, "action.price": 1.0})
    export_policy(LeastLoaded(spec, good), d / "good", spec)
    export_policy(LeastLoaded(spec, bad), d / "bad", spec)
    signer = Signer.generate()
    save_private_key(signer.private_key, d / "key.pem")
    return {"dir": d, "twin": twin, "recent": recent, "signer": signer, "trust": TrustStore([signer.public_key])}


def test_guards_parse_and_validate() -> None:
    assert parse_guards(["return=0.05", "kpi.slo_violation=10%", "task_time_p95=0.1:25"]) == [
        Guard("return", 0.05), Guard("kpi.slo_violation", 0.10), Guard("task_time_p95", 0.1, 25.0)
    ]  # fmt: skip
    assert Guard("x", 0.1, 2.0).allowed(-50.0) == pytest.approx(7.0)
    for bad in ("return", "return=", "return=abc", "=0.1", "return=-0.1"):
        with pytest.raises(InputError, match="--max-regression"):
            parse_guards([bad])
    with pytest.raises(InputError, match="given twice"):
        parse_guards(["return=0.1", "return=0.2"])


def test_gate_decides_direction_aware(world: dict[str, Any]) -> None:
    twin, recent = world["twin"], world["recent"]
    good = resolve_policy(world["dir"] / "good", twin)
    bad = resolve_policy(world["dir"] / "bad", twin)
    burst = scenario_from_dict(
        {"name": "burst", "perturbation": [{"kind": "burst", "column": "response.demand", "factor": 2, "start": 2, "end": 6}]},
        "t.toml", "burst",
    )  # fmt: skip
    d = run_gate(twin, bad, good, log=recent, scenarios=[burst], **GATE)
    assert not d.passed and {c.scenario for c in d.failures} == {"nominal", "burst"}
    by = {(c.scenario, c.kpi): c for c in d.checks}
    off = by[("nominal", "response.offload_ratio")]
    assert off.better == "higher" and off.candidate < off.baseline and off.breached and off.change < -0.05
    slo = by[("nominal", "kpi.slo_violation")]
    assert slo.better == "lower" and (slo.candidate > slo.baseline) == slo.breached
    assert "response.offload_ratio fell" in d.reason() and "margin 5%" in d.reason()
    # the same comparison the other way round passes, and a huge margin lets anything through
    assert run_gate(twin, good, bad, log=recent, **GATE).passed
    assert run_gate(twin, bad, good, log=recent, guards=[Guard("return", 50.0)], **GATE).passed
    with pytest.raises(InputError, match="has no direction"):
        run_gate(twin, bad, good, log=recent, guards=[Guard("kpi.energy_j", 0.1)], **GATE)


def test_promote_better_refuse_bad_pointer_moves_only_on_success(world: dict[str, Any], tmp_path: Path) -> None:
    twin, recent, signer, trust = world["twin"], world["recent"], world["signer"], world["trust"]
    reg = FileRegistry(tmp_path / "reg")
    kw = {"twin": twin, "log": recent, "signer": signer, "trust": trust, **GATE}
    # first promotion: nothing is current, so the gate compares with the twin's clone of the logging policy
    first = promote(world["dir"] / "good", reg, out_dir=tmp_path / "r1", **kw)
    assert first.promoted and not first.forced and first.version == "v1" and first.previous is None
    assert reg.current("global") == "v1" and first.against.startswith("logging")
    md = reg.manifest("v1").metadata
    assert md["gate"]["passed"] and md["metrics"]["response.offload_ratio"] > 0.5 and "kpi.slo_violation" in md["metrics"]
    assert (tmp_path / "r1" / "report.html").is_file()
    # the bad policy against the current one: refused, nothing published, pointer unchanged
    with pytest.raises(GateRefused, match=r"response\.offload_ratio fell -\d+\.\d%") as e:
        promote(world["dir"] / "bad", reg, out_dir=tmp_path / "r2", **kw)
    assert e.value.result.promoted is False  # type: ignore[attr-defined]
    assert reg.current("global") == "v1" and reg.list_versions() == ["v1"]
    report = json.loads((tmp_path / "r2" / "whatif.json").read_text())
    assert report["gate"]["passed"] is False and report["against"] == "v1"
    assert "REFUSED" in (tmp_path / "r2" / "whatif.md").read_text()
    # a promotion racing with another one loses the compare-and-swap instead of overwriting it
    other = reg.publish(world["dir"] / "good", {"name": "other"}, signer)

    class Racing:
        def __init__(self, inner: FileRegistry) -> None:
            self.inner = inner

        def __getattr__(self, name: str) -> Any:
            return getattr(self.inner, name)

        def publish(self, *a: Any, **k: Any) -> str:
            self.inner.set_current("global", other, expected="v1", reason="someone else")
            return self.inner.publish(*a, **k)

    with pytest.raises(CASConflict):
        promote(world["dir"] / "good", Racing(reg), out_dir=tmp_path / "r3", name="good2", **kw)
    assert reg.current("global") == other


def test_cli_promote_exit_codes_and_force(world: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = world["dir"]
    reg = tmp_path / "reg"
    base = ["--registry", str(reg), "--log", str(d / "recent.parquet"), "--twin", str(d / "twin"), "--key", str(d / "key.pem"),
            "--episodes", "2", "--steps", "10", "--scope", "site/edge-ams"]  # fmt: skip

    def run(*args: str) -> int:
        with pytest.raises(SystemExit) as e:
            main(["promote", *args, *base])
        return int(e.value.code)

    assert run(str(d / "good"), "--out", str(tmp_path / "o1")) == 0
    pointer = FileRegistry(reg).current("site/edge-ams")
    assert pointer == "v1"
    capsys.readouterr()
    code = run(str(d / "bad"), "--out", str(tmp_path / "o2"), "--max-regression", "return=0.05")
    err = " ".join(capsys.readouterr().err.split())
    assert code == 1 and "refused:" in err and "return fell" in err and "margin 5%" in err
    assert FileRegistry(reg).current("site/edge-ams") == "v1" and FileRegistry(reg).list_versions() == ["v1"]
    # bad input is exit 2 before any replay
    assert run(str(d / "bad"), "--out", str(tmp_path / "o3"), "--max-regression", "nope=0.1") == 2
    # --force overrides the gate (the e2e test injects a bad policy this way); it is recorded
    assert run(str(d / "bad"), "--out", str(tmp_path / "o4"), "--force", "--json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["promoted"] and doc["forced"] and doc["previous"] == "v1" and doc["version"] == "v2"
    r = FileRegistry(reg)
    assert r.current("site/edge-ams") == "v2" and r.previous("site/edge-ams") == "v1"
    gate = r.manifest("v2").metadata["gate"]
    assert gate["forced"] is True and gate["passed"] is False and gate["failures"]
    assert "overridden" in r.history("site/edge-ams")[-1].reason
