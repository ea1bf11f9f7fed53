"""MA-FL: federated learning across edge sites without moving raw data (seeds 003 and 000).

* `edgetwin.federation.agents`: the ESA / COA / GCA agents that train, exchange intents and
  aggregate over the bus.
* `edgetwin.federation.learners`: what an ESA trains between rounds (forecaster, dual-critic PPO,
  the VM scheduler), on the sites of `edgetwin.federation.sites`.
* `edgetwin.federation.intents`: ESA intents and their congestion-priced resolution at the COA.
* `edgetwin.federation.attacks`: a Byzantine client's tampering, for robustness runs.
* `edgetwin.federation.aggregation`: the aggregation rules (FedAvg, robust, personalised, DP,
  secure aggregation, quorum).
* `edgetwin.federation.hierarchy`: site -> cluster -> region -> global trees of those rules.
* `edgetwin.federation.compression`: the uplink codec (top-k + int8, error feedback) and the
  model-update envelope.
* `edgetwin.federation.runner`: running a whole federation in one process or as processes.
"""

from __future__ import annotations

from edgetwin import lazy_exports

#: each public name -> the module that defines it, imported on first use (`lazy_exports`)
_WHERE = {
    "AggregatorAgent": "edgetwin.federation.agents",
    "Attack": "edgetwin.federation.attacks",
    "ClusterOrchestratorAgent": "edgetwin.federation.agents",
    "DampedErrorFeedbackCodec": "edgetwin.federation.compression",
    "EdgeServiceAgent": "edgetwin.federation.agents",
    "FederationConfig": "edgetwin.federation.runner",
    "FederationResult": "edgetwin.federation.runner",
    "ForecastLearner": "edgetwin.federation.learners",
    "GlobalCoordinationAgent": "edgetwin.federation.agents",
    "HierarchyNode": "edgetwin.federation.hierarchy",
    "IntentResolution": "edgetwin.federation.intents",
    "Learner": "edgetwin.federation.learners",
    "PPOLearner": "edgetwin.federation.learners",
    "RoundRecord": "edgetwin.federation.agents",
    "SchedulerLearner": "edgetwin.federation.learners",
    "SiteSpec": "edgetwin.federation.sites",
    "SiteTelemetry": "edgetwin.federation.sites",
    "UpdateCodec": "edgetwin.federation.compression",
    "build_hierarchy": "edgetwin.federation.hierarchy",
    "heterogeneous_sites": "edgetwin.federation.sites",
    "load_hierarchy": "edgetwin.federation.hierarchy",
    "make_federation_config": "edgetwin.federation.runner",
    "make_learner": "edgetwin.federation.learners",
    "resolve_intents": "edgetwin.federation.intents",
    "run_agent": "edgetwin.federation.runner",
    "run_federation": "edgetwin.federation.runner",
    "train_independent": "edgetwin.federation.runner",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
