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

from edgetwin.federation.runner import (
    FederationConfig,
    FederationResult,
    make_federation_config,
    run_federation,
    train_independent,
)

__all__ = [
    "FederationConfig",
    "FederationResult",
    "make_federation_config",
    "run_federation",
    "train_independent",
]
