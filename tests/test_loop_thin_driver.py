"""`canary_on_cluster` is a thin driver over the operator's steps (issue 43): a signed start on
the durable command subject, the emulated cluster asking for decisions on the JSON wire and
reporting outcomes, the site's own guard, the run's durable log collected from the bus. Its log
is the same as the Python path's (`run_emulated_canary`: `decide_for` + `canary_report` in
process) on the same seed, and no canary log of the loop names a policy ``"candidate"``."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pandas as pd
import pytest
import torch
from test_canary_loop import world  # noqa: F401 - the same small world (twin, fleet log)

from edgetwin.contract.errors import InputError
from edgetwin.contract.margins import KPIMargin
from edgetwin.edge.canary import CanaryConfig
from edgetwin.edge.canary_slice import CanarySlice
from edgetwin.edge.registry import FileRegistry, metadata_from_policy_dir
from edgetwin.edge.runtime import EdgeRuntime
from edgetwin.edge.signing import Signer, TrustStore
from edgetwin.emulator.cluster import ClusterConfig, EdgeCluster
from edgetwin.emulator.logs import make_policy
from edgetwin.loop.fleet import _loader, _stub_dir, canary_on_cluster, run_emulated_canary
from edgetwin.loop.plan import PlanBudget
from edgetwin.loop.rounds import canary_loop
from edgetwin.policies.candidates import ConstantPolicy
from edgetwin.policies.gate import Guard, resolve_policy
from edgetwin.twin.whatif import fixed_policy

torch.set_num_threads(1)
CLUSTER = ClusterConfig(n_agents=40, steps=24)
GUARDED = (KPIMargin("kpi.slo_violation", 0.05, 0.0, False), KPIMargin("kpi.task_time_ms", 0.05, 0.0, False))


def _python_path(current, candidate, config: CanaryConfig, seed: int):  # type: ignore[no-untyped-def]
    """The canary run in process: `decide_for` and `canary_report` called from Python."""
    spec = EdgeCluster(CLUSTER).spec
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        signer = Signer.generate()
        reg = FileRegistry(root / "registry")
        objects = {"current": current, config.candidate: candidate}
        for name in objects:
            d = _stub_dir(root / "stubs", name, spec)
            reg.publish(d, {**metadata_from_policy_dir(d), "name": name, "version": name}, signer)
        reg.set_current("site/edge", "current", expected=None)
        rt = EdgeRuntime("edge", reg, TrustStore([signer.public_key]), bus=None, kpi_guard=None, poll_interval=3600.0,
                         cache_dir=root / "runtime", loader=_loader(objects), spec=spec)  # fmt: skip
        with rt.running_in_thread():
            return run_emulated_canary(rt, config, CLUSTER, seed=seed, episode="day")


@pytest.mark.parametrize("action", [[0.5, 0.5, 0.5], [1.0, 0.05, 0.0]])
def test_the_driver_over_the_bus_gives_the_python_path_s_canary(action: list[float]) -> None:
    spec = EdgeCluster(CLUSTER).spec
    current, cand = make_policy("random", spec, seed=1), ConstantPolicy(spec, action)
    config = CanaryConfig("edge-heavy-v2", CanarySlice(sites=("edge-ams", "edge-fra"), seed=3), 4.0,
                          GUARDED, batch=2, min_reports=4)  # fmt: skip
    import copy

    bus = canary_on_cluster(CLUSTER, copy.deepcopy(current), cand, config, seed=7, episode="day")
    py = _python_path(copy.deepcopy(current), cand, config, seed=7)
    assert (bus.stop_reason, bus.ticks) == (py.stop_reason, py.ticks)
    a = bus.log.reset_index(drop=True)
    b = py.log.reset_index(drop=True)
    assert list(a.columns) == list(b.columns)
    pd.testing.assert_frame_equal(a, b, check_dtype=False)
    assert set(bus.log["policy"].astype(str)) <= {"current", "edge-heavy-v2"}
    # the rest of the fleet over the same ticks, from the system's own log
    assert bus.fleet_log is not None and len(bus.fleet_log)
    assert not set(bus.fleet_log["agent"]) & set(bus.log["agent"])
    assert int(bus.fleet_log["t"].max()) < bus.ticks


def test_no_collected_canary_log_of_the_loop_names_policy_candidate(world) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    cand = ConstantPolicy(world["spec"], [1.0, 0.3, 0.2])
    logs: list[pd.DataFrame] = []
    res = canary_loop(
        world["twin"], world["fleet"], cand, make_policy("random", world["spec"], seed=1), CLUSTER,
        candidate_spec=fixed_policy("always edge", cand),
        baseline_spec=resolve_policy("logging", world["twin"], name="current"),
        budget=PlanBudget(max_share=0.25), guards=[Guard("response.offload_ratio", 0.05), Guard("kpi.slo_violation", 0.05)],
        max_rounds=1, seed=0, fleet_seed=5, log=lambda s: None, on_canary=lambda r, plan, c: logs.append(c.log),
    )  # fmt: skip
    assert res.rounds and logs
    for lg in logs:
        versions = set(lg["policy"].astype(str))
        assert "candidate" not in versions
        assert versions == {"current", "always-edge"}  # the registry versions the site served
    assert res.rounds[0].candidate_agent_steps > 0  # the loop found the candidate's rows by its version


def test_the_loop_s_canary_run_needs_its_slice_in_the_cluster() -> None:
    spec = EdgeCluster(CLUSTER).spec
    config = CanaryConfig("v2", CanarySlice(sites=("nowhere",), seed=0), 2.0, GUARDED)
    with pytest.raises(InputError, match="no service group of the cluster is in the canary's slice"):
        canary_on_cluster(CLUSTER, make_policy("random", spec, seed=1), ConstantPolicy(spec, [1, 0, 0]), config, seed=0)
