"""The ``edgetwin`` command: one module per command group, each only argument handling and printing
over the layers below (the work itself is in the subpackages).

* `edgetwin.cli.common`: the root `app`, consoles, shared options, JSON output, early path checks.
* `edgetwin.cli.logs`: ``logs generate``, ``logs validate``.
* `edgetwin.cli.twin`: ``fit``, ``fit-federated``, ``update`` (the old ``fit --federated`` /
  ``fit --update TWIN`` spellings are rewritten to them by `edgetwin.cli.common`), ``fidelity``,
  ``population fit/report``.
* `edgetwin.cli.policy`: ``train``, ``evaluate``, ``whatif``, ``promote``.
* `edgetwin.cli.registry`: ``registry keygen/publish/list/show``.
* `edgetwin.cli.edge`: ``serve``.
* `edgetwin.cli.federation`: ``federate``, ``agent``.
* `edgetwin.cli.demo`: ``demo``, the main job.
* `edgetwin.cli.entry`: the entry point, `exit_code_of` and `describe_error`.

Every command has ``--help`` and ``--seed`` where it samples; ``--json`` where a script reads the
result. Exit codes: 0 ok, 1 failed, 2 bad input (a tampered, unsealed or untrusted artifact too),
3 the gate abstained.
"""

from __future__ import annotations

from edgetwin import lazy_exports

#: each public name -> the module that defines it, imported on first use (`lazy_exports`)
_WHERE = {
    "app": "edgetwin.cli.entry",
    "cluster_kpi_columns": "edgetwin.cli.policy",
    "describe_error": "edgetwin.cli.entry",
    "exit_code_of": "edgetwin.cli.entry",
    "main": "edgetwin.cli.entry",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
