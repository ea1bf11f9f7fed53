"""Seed 002's ERLFC system: DAG jobs, the federation, the env (check_env, determinism, SB3), its logs."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from edgetwin.contract.errors import InputError
from edgetwin.contract.validate import load_valid_log
from edgetwin.emulator.dag import (
    WORKLOADS,
    ErlfcConfig,
    ErlfcEnv,
    Federation,
    JobConfig,
    TwinScorePolicy,
    Workload,
    baseline,
    centre_rows,
    erlfc_spec,
    generate_dag_logs,
    generate_jobs,
    run_episode,
)
from edgetwin.emulator.dag.jobs import TASK_COUNT_PMF, critical_path_s, fit_from_batch_task

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
BATCH_TASK = SHARED / "Workload-Prediction-of-Alibaba-Cluster-Dataset" / "batch_task.csv"

SMALL = ErlfcConfig(workload=Workload("tiny", 24, 0.35))


def test_jobs_are_dags_and_deterministic() -> None:
    a = generate_jobs(40, 0.05, seed=3)
    b = generate_jobs(40, 0.05, seed=3)
    assert [j.n_tasks for j in a] == [j.n_tasks for j in b]
    assert all(np.array_equal(x.work_s, y.work_s) and x.succ == y.succ for x, y in zip(a, b, strict=True))
    for j in a:
        # numbered level by level: every edge goes forward, so the numbering is a topological order
        assert all(k > i for i, ks in enumerate(j.succ) for k in ks)
        assert j.deadline_s >= j.arrival_s + critical_path_s(j.work_s, j.succ) * 2.0 - 1e-6
    assert np.all(np.diff([j.arrival_s for j in a]) > 0)


def test_task_counts_follow_the_fitted_distribution() -> None:
    jobs = generate_jobs(4000, 1.0, seed=0)
    counts = np.array([j.n_tasks for j in jobs])
    assert abs(np.mean(counts == 1) - TASK_COUNT_PMF[0] / sum(TASK_COUNT_PMF) * (1 - 0.00834)) < 0.03
    assert counts.max() <= 156


@pytest.mark.skipif(not BATCH_TASK.is_file(), reason="../shared/data (Alibaba v2017 batch_task) is not present")
def test_shipped_parameters_match_the_trace() -> None:
    fit = fit_from_batch_task(BATCH_TASK)
    np.testing.assert_allclose(fit["task_count_pmf"], TASK_COUNT_PMF, atol=1e-3)
    assert fit["log_mean"] == pytest.approx(3.58, abs=0.01)
    assert fit["log_task_std"] == pytest.approx(1.22, abs=0.01)
    assert np.sqrt(fit["log_total_std"] ** 2 - 1.22**2) == pytest.approx(1.35, abs=0.01)


def test_env_passes_check_env() -> None:
    check_env(ErlfcEnv(SMALL), skip_render_check=True)


def test_same_seed_same_episode_and_bad_action_refused() -> None:
    def play(seed: int) -> tuple[list[float], dict[str, float]]:
        env = ErlfcEnv(SMALL)
        obs, _ = env.reset(seed=seed)
        rewards, done = [], False
        while not done:
            obs, r, done, _, info = env.step(int(np.argmax(obs[:6])))
            rewards.append(r)
        return rewards, info["episode_metrics"]

    assert play(7) == play(7)
    assert play(7)[0] != play(8)[0]
    env = ErlfcEnv(SMALL)
    env.reset(seed=0)
    with pytest.raises(InputError):
        env.step(99)


def test_baselines_run_and_greedy_carbon_pays_in_deadlines() -> None:
    env = ErlfcEnv(replace(SMALL, workload=WORKLOADS["light"]))
    res = {b: run_episode(env, baseline(b, seed=0), seed=5) for b in ("round-robin", "greedy-carbon", "heft-everywhere")}
    # the cleanest grid has the fewest emissions but queues everything on one small site
    assert res["greedy-carbon"]["carbon_kg"] < res["round-robin"]["carbon_kg"]
    assert res["greedy-carbon"]["makespan_h"] > res["round-robin"]["makespan_h"]
    # HEFT over all servers moves data between centres; a per-centre placement never does
    assert res["heft-everywhere"]["wan_gb"] > 0 and res["round-robin"]["wan_gb"] == 0


def test_energy_counts_cooling_and_idle() -> None:
    fed = Federation()
    job = generate_jobs(1, 1.0, seed=1, cfg=JobConfig())[0]
    p = fed.place(job, 3, commit=False)  # the Nordic site, air cooling ratio 0.12, fixed
    c = fed.centres[3]
    busy_j = float(sum(job.work_s / c.speed[0])) * c.p_peak[0]
    assert p.energy_j >= busy_j * 1.12 - 1e-6


def test_logs_validate_against_their_spec() -> None:
    log, spec = generate_dag_logs(SMALL, episodes=2, seed=0)
    assert spec == erlfc_spec()
    table, _, report = load_valid_log(log, spec)
    assert report.usable and report.n_quarantined == 0 and len(table) == len(log) == 2 * 24 * 6
    # exactly one centre gets each job, and only it pays
    per_tick = log.groupby(["episode", "t"])["action.assign"].sum()
    assert (per_tick == 1).all()
    assert (log.loc[log["action.assign"] == 0, "response.energy_kwh"] == 0).all()
    # the per-centre reward summed over a tick = the env's reward + a term no action changes
    assert np.isfinite(log["reward"]).all()


def test_twin_score_policy_sees_the_logged_rows() -> None:
    env = ErlfcEnv(SMALL)
    env.reset(seed=0)
    rows = centre_rows(env)
    assert rows.shape == (6, len(erlfc_spec().observation_columns))
    pick_fastest = TwinScorePolicy(lambda x: x[:, 1])  # profile.mean_speed
    assert pick_fastest(env, np.zeros(1)) == int(np.argmax(rows[:, 1]))


def test_a2c_learns_on_the_env() -> None:
    from stable_baselines3 import A2C

    env = ErlfcEnv(SMALL)
    model = A2C("MlpPolicy", env, n_steps=8, seed=0, device="cpu")
    before = [p.detach().clone() for p in model.policy.parameters()]
    model.learn(64)
    after = list(model.policy.parameters())
    assert any(not np.allclose(a.detach().numpy(), b.numpy()) for a, b in zip(after, before, strict=True))
    obs, _ = env.reset(seed=0)
    assert env.action_space.contains(int(model.predict(obs, deterministic=True)[0]))
