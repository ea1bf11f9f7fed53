"""The second system (`edgetwin.emulator.admission`): its logs are the contract, its logging controller
is confounded with a load the logs do not show, its truth is computable, and a twin fits on it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from edgetwin.contract.errors import InputError
from edgetwin.contract.logs import write_table
from edgetwin.contract.spec import TwinSpec, spec_path_for
from edgetwin.contract.validate import validate_log
from edgetwin.emulator.admission import (
    AdmissionConfig,
    AdmissionSystem,
    ForecastAdmission,
    admission_spec,
    benchmark_regimes,
    evaluate,
    generate_admission_logs,
    reference_policies,
)
from edgetwin.emulator.cluster import cluster_spec
from edgetwin.imitation.overlap import overlap_report

SMALL = AdmissionConfig(n_tenants=24, n_sites=3, steps=12)


def test_its_logs_are_the_contract_and_validate(tmp_path: Path) -> None:
    log, spec = generate_admission_logs(SMALL, regimes=benchmark_regimes("c1", 2, trial_share=0.3), seed=1)
    assert len(log) == 3 * 12 * 24
    assert set(log["policy"]) == {"controller+noise0.1", "arm-random", "arm-regimes"}
    assert np.isfinite(log["propensity"]).all() and (log["propensity"] > 0).all()
    # not the cluster's columns: other actions and responses, two names in common (a clock, a latency)
    cluster_cols = {f.name for f in cluster_spec().features}
    assert cluster_cols & {f.name for f in spec.features} == {"state.day_fraction", "state.latency_ms"}
    assert not set(cluster_spec().action_columns) & set(spec.action_columns)
    out = tmp_path / "admission.parquet"
    write_table(log, out)
    spec.save(spec_path_for(out))
    report = validate_log(out)
    assert report.usable and report.n_quarantined == 0, report.summary(markup=False)
    assert TwinSpec.load(spec_path_for(out)).hash() == admission_spec(SMALL).hash()
    # the same seed gives the same log
    again, _ = generate_admission_logs(SMALL, regimes=benchmark_regimes("c1", 2, trial_share=0.3), seed=1)
    pd.testing.assert_frame_equal(log, again)


def test_the_logging_controller_is_confounded_with_the_hidden_load() -> None:
    system = AdmissionSystem(AdmissionConfig(n_tenants=40, n_sites=4, steps=48))
    spec = system.spec
    ctrl = ForecastAdmission(spec, system)
    hidden, admit = [], []
    obs = system.reset(seed=3)
    for _ in range(48):
        a = ctrl.act(obs)
        hidden.append(system.hidden[system.site])
        admit.append(a[:, 0])
        _, obs, _, _, _ = system.step(a)
    # it admits less when the unlogged load is high ...
    assert np.corrcoef(np.concatenate(hidden), np.concatenate(admit))[0, 1] < -0.8
    # ... which is no column of the log, and the logs still say something about the effect of actions
    log, _ = generate_admission_logs(SMALL, episodes=3, seed=2)
    assert not any("hidden" in c or "forecast" in c for c in log.columns)
    ov = overlap_report(log, spec)
    assert ov.verdict in ("some", "weak"), ov.summary()
    assert 0.05 < ov.unexplained["action.admit"] < 0.95  # partly a function of the logged context, not wholly


def test_the_truth_is_computable_and_policies_differ() -> None:
    spec = admission_spec(SMALL)
    pols = reference_policies(spec)
    assert len(pols) == 10
    real = evaluate(pols, SMALL, days=2, seed=7)
    again = evaluate(pols, SMALL, days=2, seed=7)
    values = np.array([real[k]["reward"].mean() for k in pols])
    assert np.array_equal(values, [again[k]["reward"].mean() for k in pols])  # deterministic
    assert values.max() - values.min() > 0.1  # the policies are told apart by the system
    # admitting less with nothing else changed rejects requests: lower goodput on the same days
    assert real["admit all"]["kpi.goodput"].mean() > real["admit 0.6"]["kpi.goodput"].mean()


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(InputError, match="n_tenants"):
        AdmissionConfig(n_tenants=2, n_sites=4)
    with pytest.raises(InputError, match="unknown logs"):
        benchmark_regimes("d", 3)
    with pytest.raises(InputError, match="unknown policy"):
        generate_admission_logs(SMALL, episodes=1, policy="heuristic")
    system = AdmissionSystem(SMALL)
    system.reset(seed=0)
    with pytest.raises(InputError, match="shape"):
        system.step(np.zeros((3, 2)))


# ~13 s on an idle machine (validation, overlap report, the causal model's fit, empirical population)
def test_a_twin_fits_on_it_and_answers_about_its_policies() -> None:
    from edgetwin.twin.twin import Twin

    log, spec = generate_admission_logs(SMALL, regimes=benchmark_regimes("b", 3), seed=0)
    twin = Twin.fit(log, spec, seed=0, members=1, progress=False, response_model="causal",
                    population_model="empirical", use_time=True)
    pol = reference_policies(spec)["admit 0.8"]
    out = twin.rollout(pol, episodes=1, seed=1, n_agents=SMALL.n_tenants, steps=SMALL.steps)
    assert twin.meta["overlap"]["verdict"] in ("some", "weak")
    assert set(twin.meta["overlap"]["policies"]) == {"controller+noise0.1", "reactive+noise0.1"}
    assert len(out) == SMALL.n_tenants * SMALL.steps
    np.testing.assert_allclose(out["action.admit"], 0.8)
    assert out["reward"].between(-4.5, 1.0).all() and out["kpi.goodput"].between(0.0, 1.0).all()
