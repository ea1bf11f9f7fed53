"""The emulated edge-cloud system that plays "the real system" in the demo, the tests and the benchmarks.

edgetwin learns twins of whatever writes the log contract; this package is one such system, so that
every claim about a twin can be checked against the truth. Nothing below layer 5 imports it.

* `edgetwin.emulator.cluster`: `EdgeCluster` (service groups on edge and cloud sites, vectorised in
  NumPy), its config and spec.
* `edgetwin.emulator.logs`: logging it (`generate_logs`) under named policies, regimes one after the
  other and randomized trials; `log_system` logs any `LoggedSystem` the same way.
* `edgetwin.emulator.admission`: a second, different system (tenants behind an admission controller,
  gateways with a hidden background load its logging controller reacts to), for checking twins on
  code they were not tuned on.
* `edgetwin.emulator.envs`: the Gymnasium env over it; its SB3 `EdgeClusterVecEnv` is built on
  first use (it needs torch), so import it from `edgetwin.emulator.envs`.
* `edgetwin.emulator.population`: who the service groups are (scenarios `mbb`, `iot`, `iov`) and
  how the population drifts over days.
* `edgetwin.emulator.sites`: the topology (edge clusters and cloud regions) and its nodes.
* `edgetwin.emulator.energy`: node power (SPECpower curves), cooling and grid carbon intensity.
* `edgetwin.emulator.traces`: adapters from real workload traces (Alibaba, Google, Azure, ...).
* `edgetwin.emulator.vm_scheduling`: seed 000's VM task-scheduling MDP (PFRL-DM's environment).
* `edgetwin.emulator.dag`: seed 002's DAG jobs, data-centre federation, HEFT and ERLFC env.
"""

from edgetwin.emulator.cluster import ClusterConfig, EdgeCluster, cluster_kpi_columns, cluster_spec
from edgetwin.emulator.dag import ErlfcConfig, ErlfcEnv, Federation, generate_dag_logs, heft
from edgetwin.emulator.energy import CarbonSeries, Cooling, PowerModel, carbon_series_for
from edgetwin.emulator.envs import EdgeClusterEnv
from edgetwin.emulator.logs import SLOAwarePolicy, generate_logs, plot_overview
from edgetwin.emulator.population import SCENARIOS, Drift, sample_profiles
from edgetwin.emulator.sites import Site, default_sites
from edgetwin.emulator.traces import TraceSample, read_trace
from edgetwin.emulator.vm_scheduling import VMSchedulingConfig, VMSchedulingEnv

__all__ = [
    "SCENARIOS",
    "CarbonSeries",
    "ClusterConfig",
    "Cooling",
    "Drift",
    "EdgeCluster",
    "EdgeClusterEnv",
    "ErlfcConfig",
    "ErlfcEnv",
    "Federation",
    "PowerModel",
    "SLOAwarePolicy",
    "Site",
    "TraceSample",
    "VMSchedulingConfig",
    "VMSchedulingEnv",
    "carbon_series_for",
    "cluster_kpi_columns",
    "cluster_spec",
    "default_sites",
    "generate_dag_logs",
    "generate_logs",
    "heft",
    "plot_overview",
    "read_trace",
    "sample_profiles",
]
