"""Seed 002 (ERLFC) as it is: DAG jobs to data centres by actor-critic, HEFT inside, energy and carbon per site.

* `edgetwin.emulator.dag.jobs`: DAG jobs with the shapes of Alibaba's v2017 batch workload.
* `edgetwin.emulator.dag.heft`: HEFT (Topcuoglu et al. 2002) as a scheduler of its own.
* `edgetwin.emulator.dag.datacentres`: the federated cloud: servers, cooling, energy type, carbon.
* `edgetwin.emulator.dag.env`: `ErlfcEnv`, the data-centre choice per arriving job (Gymnasium).
* `edgetwin.emulator.dag.baselines`: round-robin, random, greedy lowest-carbon, HEFT-everywhere.
* `edgetwin.emulator.dag.logs`: its logs in the contract (and spec), so a twin can be learned.
"""

from edgetwin.emulator.dag.baselines import BASELINES, baseline, run_episode, sb3_policy
from edgetwin.emulator.dag.datacentres import DataCentre, Federation, default_centres
from edgetwin.emulator.dag.env import WORKLOADS, ErlfcConfig, ErlfcEnv, Workload
from edgetwin.emulator.dag.heft import HeftSchedule, heft, upward_ranks
from edgetwin.emulator.dag.jobs import DagJob, JobConfig, generate_jobs
from edgetwin.emulator.dag.logs import TwinScorePolicy, centre_rows, erlfc_spec, generate_dag_logs

__all__ = [
    "BASELINES",
    "WORKLOADS",
    "DagJob",
    "DataCentre",
    "ErlfcConfig",
    "ErlfcEnv",
    "Federation",
    "HeftSchedule",
    "JobConfig",
    "TwinScorePolicy",
    "Workload",
    "baseline",
    "centre_rows",
    "default_centres",
    "erlfc_spec",
    "generate_dag_logs",
    "generate_jobs",
    "heft",
    "run_episode",
    "sb3_policy",
    "upward_ranks",
]
