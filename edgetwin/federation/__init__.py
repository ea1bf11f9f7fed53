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

from importlib import import_module
from typing import Any

#: each public name -> the module that defines it, imported on first use (so that importing
#: one light module of this package does not import all of it)
_WHERE = {
    "FederationConfig": "edgetwin.federation.runner",
    "FederationResult": "edgetwin.federation.runner",
    "make_federation_config": "edgetwin.federation.runner",
    "run_federation": "edgetwin.federation.runner",
    "train_independent": "edgetwin.federation.runner",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(import_module(_WHERE[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
