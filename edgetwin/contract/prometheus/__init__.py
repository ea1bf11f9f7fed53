"""Logs from where operators keep them: import a log in the contract from Prometheus.

* `edgetwin.contract.prometheus.mapping`: the import mapping (TOML): a PromQL query per contract
  column and the labels that give ``agent``, ``site``, ``scenario``, ``policy`` and the episode.
* `edgetwin.contract.prometheus.grid`: the time grid ``[start, end)`` at a step, and its chunks.
* `edgetwin.contract.prometheus.http`: ``/api/v1/query_range`` over plain HTTP, retried and chunked.
* `edgetwin.contract.prometheus.dump`: the same queries (plain selectors) over an OpenMetrics or
  text-exposition file, offline.
* `edgetwin.contract.prometheus.importer`: `import_prometheus`: series -> the log, its spec
  skeleton beside it, validated (``edgetwin logs import prometheus``).
* `edgetwin.contract.prometheus.exposition`: the inverse: a log as OpenMetrics, and the mapping that
  reads it back (`write_openmetrics`, `mapping_for`).
"""

from __future__ import annotations

from edgetwin import lazy_exports

_WHERE = {
    "Grid": "edgetwin.contract.prometheus.grid",
    "Mapping": "edgetwin.contract.prometheus.mapping",
    "MetricsDump": "edgetwin.contract.prometheus.dump",
    "PrometheusHTTP": "edgetwin.contract.prometheus.http",
    "PrometheusImport": "edgetwin.contract.prometheus.importer",
    "import_prometheus": "edgetwin.contract.prometheus.importer",
    "mapping_for": "edgetwin.contract.prometheus.exposition",
    "metric_name": "edgetwin.contract.prometheus.exposition",
    "write_openmetrics": "edgetwin.contract.prometheus.exposition",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
