"""MA-FL: federated learning across edge sites without moving raw data (seeds 003 and 000).

* `edgetwin.federation.agents`: the ESA / COA / GCA agents that train, exchange intents and
  aggregate over the bus.
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
    "FederationConfig": "edgetwin.federation.runner",
    "FederationResult": "edgetwin.federation.runner",
    "make_federation_config": "edgetwin.federation.runner",
    "run_federation": "edgetwin.federation.runner",
    "train_independent": "edgetwin.federation.runner",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
