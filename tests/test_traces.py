"""Trace adapters: each real format -> TraceSample, and clear errors on malformed files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import FIXTURES, shared_data

from edgetwin.contract.errors import InputError
from edgetwin.emulator.cluster import ClusterConfig, EdgeCluster
from edgetwin.emulator.traces import (
    TraceSample,
    detect_format,
    read_alibaba_batch_task,
    read_azure_llm,
    read_cloudsimpy_jobs,
    read_google_task_events,
    read_opendc,
    read_trace,
)

AZURE = FIXTURES / "azure_llm_code_head300.csv"
GOOGLE = FIXTURES / "google_task_events_sample.csv"


# ------------------------------------------------------------------------------------ fixtures (no ../shared needed)
def test_azure_fixture() -> None:
    tr = read_azure_llm(AZURE)
    assert len(tr.arrivals_s) == 300 and tr.arrivals_s[0] == 0.0
    assert np.all(np.diff(tr.arrivals_s) >= 0)
    assert tr.cpu is None and tr.memory is None
    first = pd.read_csv(AZURE, nrows=1)
    expected = first["ContextTokens"][0] / 4000.0 + first["GeneratedTokens"][0] / 40.0
    assert expected in tr.durations_s


def test_google_fixture() -> None:
    tr = read_google_task_events(GOOGLE)
    assert len(tr.arrivals_s) == 10  # SUBMIT events in the 32-event sample
    assert len(tr.durations_s) == 9 and (tr.durations_s > 0).all()  # SCHEDULE -> FINISH pairs
    assert tr.cpu.max() <= 1.0 and tr.cpu_unit == "normalised"


def test_detect_format() -> None:
    assert detect_format(AZURE) == "azure-llm"
    assert detect_format(GOOGLE) == "google-task-events"
    assert isinstance(read_trace(GOOGLE), TraceSample)


def test_arrival_profile_is_a_mean_one_curve() -> None:
    # Two days of arrivals, busy from 18:00 to 22:00.
    rng = np.random.default_rng(0)
    day = rng.uniform(0, 86400, 20000)
    busy = rng.uniform(18 * 3600, 22 * 3600, 20000)
    arr = np.sort(np.concatenate([day, busy, day + 86400, busy + 86400]))
    tr = TraceSample("synthetic", None, None, None, arr)
    prof = tr.arrival_profile(24)
    assert prof.shape == (24,)
    np.testing.assert_allclose(prof.mean(), 1.0)
    assert prof[19:21].mean() > 3 * prof[2:6].mean()
    # A handful of arrivals says little: nearly flat.
    few = TraceSample("few", None, None, None, np.array([0.0, 10.0, 50.0]))
    assert np.ptp(few.arrival_profile(24)) < 0.5


# ------------------------------------------------------------------------------------ malformed files
def test_malformed_azure_names_row_and_column(tmp_path: Path) -> None:
    bad = tmp_path / "azure.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:17:03,10,2\n2023-11-16 18:17:04,ten,2\n")
    with pytest.raises(InputError, match=r"azure.csv:3:ContextTokens"):
        read_azure_llm(bad)
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,10,2\n")
    with pytest.raises(InputError, match=r"azure.csv:2:TIMESTAMP"):
        read_azure_llm(bad)
    bad.write_text("TIMESTAMP,Tokens\n2023-11-16 18:17:03,10\n")
    with pytest.raises(InputError, match="missing columns"):
        read_azure_llm(bad)


def test_malformed_google_names_row_and_column(tmp_path: Path) -> None:
    lines = GOOGLE.read_text().splitlines()
    fields = lines[5].split(",")
    fields[5] = "X"
    bad = tmp_path / "events.csv"
    bad.write_text("\n".join([*lines[:5], ",".join(fields), *lines[6:]]) + "\n")
    with pytest.raises(InputError, match=r"events.csv:6:event_type"):
        read_google_task_events(bad)
    bad.write_text("1,2,3\n")
    with pytest.raises(InputError, match="13 columns"):
        read_google_task_events(bad)


def test_malformed_alibaba_names_row_and_column(tmp_path: Path) -> None:
    header = ("task_create_time, task_end_time, job_id, task_id,number_of_instances, status, "
              "number_of_cpus_requested_per_instance_in_the_task,normalized_memory_requested_per_instance_in_the_task\n")
    bad = tmp_path / "batch_task.csv"
    bad.write_text(header + "6459,6524,3,4,15740,Terminated,50,0.0079\n6036,soon,4,7,393,Waiting,,\n")
    with pytest.raises(InputError, match=r"batch_task.csv:3:task_end_time"):
        read_alibaba_batch_task(bad)
    bad.write_text(header + "6459,6524,3,4,15740,Terminated,-50,0.0079\n")
    with pytest.raises(InputError, match=r"batch_task.csv:2:number_of_cpus"):
        read_alibaba_batch_task(bad)
    # Missing cpu/memory on a Waiting task is normal, not malformed; headerless files are accepted.
    ok = tmp_path / "headerless.csv"
    ok.write_text("6459,6524,3,4,15740,Terminated,50,0.0079\n6036,6046,4,7,393,Waiting,,\n")
    tr = read_alibaba_batch_task(ok)
    assert tr.durations_s.tolist() == [65.0] and tr.cpu.tolist() == [0.5]


def test_malformed_opendc_names_column(tmp_path: Path) -> None:
    folder = tmp_path / "trace"
    folder.mkdir()
    tasks = pd.DataFrame(
        {"id": [1, 2], "submission_time": [0, 1000], "duration": [5000, -1], "cpu_count": [1, 2],
         "cpu_capacity": [2600.0, 5200.0], "mem_capacity": [1048576, 2097152]}
    )
    tasks.to_parquet(folder / "tasks.parquet")
    with pytest.raises(InputError, match=r"tasks.parquet:2:duration"):
        read_opendc(folder)
    tasks["duration"] = ["5000", "x"]
    tasks.to_parquet(folder / "tasks.parquet")
    with pytest.raises(InputError, match=r"tasks.parquet:2:duration"):
        read_opendc(folder)
    tasks["duration"] = [5000, 7000]
    tasks.to_parquet(folder / "tasks.parquet")
    pd.DataFrame({"id": [1, 1, 2], "duration": [300000, 300000, 300000], "cpu_usage": [1300.0, 1300.0, 5200.0]}).to_parquet(
        folder / "fragments.parquet"
    )
    tr = read_opendc(folder)
    np.testing.assert_allclose(tr.cpu, [0.5, 2.0])  # mean MHz used / MHz per core
    np.testing.assert_allclose(tr.memory, [1.0, 2.0])  # KB -> GB
    np.testing.assert_allclose(tr.durations_s, [5.0, 7.0])


def test_unknown_format_and_missing_file(tmp_path: Path) -> None:
    odd = tmp_path / "odd.csv"
    odd.write_text("a,b\n1,2\n")
    with pytest.raises(InputError, match="trace format"):
        read_trace(odd)
    with pytest.raises(InputError, match="not found"):
        read_trace(tmp_path / "nope.csv")
    with pytest.raises(InputError, match="unknown trace format"):
        read_trace(AZURE, fmt="swf")


# ------------------------------------------------------------------------------------ real files in ../shared/data
def test_alibaba_v2017_batch_task() -> None:
    tr = read_trace(shared_data("Workload-Prediction-of-Alibaba-Cluster-Dataset/batch_task.csv"))
    assert tr.meta["rows"] == 80553  # MANIFEST: 80,553 tasks
    assert 60000 < len(tr.durations_s) <= 67013  # Terminated with end > create
    assert set(np.unique(tr.cpu)) <= {0.5, 1.0, 1.5, 2.0} | set(np.unique(tr.cpu))
    assert np.quantile(tr.durations_s, 0.99) > 20 * np.median(tr.durations_s)  # heavy tail
    prof = tr.arrival_profile(24)
    np.testing.assert_allclose(prof.mean(), 1.0)


def test_opendc_bitbrains_and_surf() -> None:
    bb = read_opendc(shared_data("opendc-traces/workload/traces/v4/bitbrains-small"))
    assert len(bb.durations_s) == 50 and bb.meta["fragments"] and bb.meta["tasks_with_fragments"] == 50
    surf = read_opendc(shared_data("opendc-traces/workload/traces/v4/surf_week/tasks.parquet"))
    assert len(surf.arrivals_s) == 6295
    assert 6 * 86400 < surf.span_s < 8 * 86400


def test_google_2011_and_azure_llm_real() -> None:
    g = read_trace(shared_data("cloudsimplus-examples/src/main/resources/workload/google-traces/task-events-sample-1.csv"))
    assert len(g.arrivals_s) == 10
    conv = read_trace(shared_data("AzurePublicDataset/data/AzureLLMInferenceTrace_conv.csv"))
    assert len(conv.arrivals_s) == 19366 and 3000 < conv.span_s < 3700  # ~1 hour


def test_cloudsimpy_jobs() -> None:
    tr = read_cloudsimpy_jobs(shared_data("CloudSimPy/playground/Non_DAG/jobs_files/jobs.csv"))
    assert len(tr.arrivals_s) == 31756


def test_cluster_runs_on_a_real_trace() -> None:
    path = shared_data("Workload-Prediction-of-Alibaba-Cluster-Dataset/batch_task.csv")
    builtin = EdgeCluster(ClusterConfig(n_agents=300, steps=4))
    traced = EdgeCluster(ClusterConfig(n_agents=300, steps=4, trace=path))
    builtin.reset(seed=0)
    traced.reset(seed=0)
    # Same copula draws, different task-time marginal: the trace's much heavier tail shows.
    np.testing.assert_array_equal(traced.component, builtin.component)
    m = (traced.scenario == 0) & (traced.component == 0)  # mbb video groups
    spread = lambda x: np.quantile(x, 0.9) / np.median(x)  # noqa: E731
    assert spread(traced.profiles[m, 0]) > 3 * spread(builtin.profiles[m, 0])
    obs, reward, _, info = traced.step(np.tile([0.5, 1.0, 0.3], (300, 1)))
    assert np.isfinite(obs).all() and np.isfinite(reward).all()
