"""The contract: what every part of edgetwin shares, and the bottom layer of the package.

* `edgetwin.contract.spec`: the twin spec (`TwinSpec`, `Feature`), read from TOML beside a log.
* `edgetwin.contract.logs`: reading and writing logs (Parquet / CSV) and finding their spec.
* `edgetwin.contract.validate`: every problem of a log at once, and the quarantine of unusable rows.
* `edgetwin.contract.policy`: the `PlatformPolicy` protocol (``act(obs) -> actions``) and the
  generic logging policies over a spec's action box (random, noisy, regimes).
* `edgetwin.contract.metrics`: the fidelity yardstick (KL, MMD, C2ST, correlation distance) that
  the population models, the response models and the twin are all judged with.
* `edgetwin.contract.manifest`: artifact manifests, the one integrity mechanism of twins and
  policies (sha256 of every file, metadata included; `verify_manifest` refuses anything else).
* `edgetwin.contract.errors`: `InputError` (exit 2), `GateRefused` (exit 1) and `GateAbstained`
  (exit 3), which the CLI turns into one line and an exit code.

Nothing here imports another edgetwin subpackage, and nothing here assumes a system's column names.
"""

from __future__ import annotations

from edgetwin import lazy_exports

#: each public name -> the module that defines it, imported on first use (`lazy_exports`)
_WHERE = {
    "Feature": "edgetwin.contract.spec",
    "FunctionPolicy": "edgetwin.contract.policy",
    "ArtifactTampered": "edgetwin.contract.manifest",
    "GateAbstained": "edgetwin.contract.errors",
    "GateRefused": "edgetwin.contract.errors",
    "InputError": "edgetwin.contract.errors",
    "NoisyPolicy": "edgetwin.contract.policy",
    "PlatformPolicy": "edgetwin.contract.policy",
    "REWARD_COLUMN": "edgetwin.contract.spec",
    "RandomPolicy": "edgetwin.contract.policy",
    "RegimePolicy": "edgetwin.contract.policy",
    "TwinSpec": "edgetwin.contract.spec",
    "ValidationReport": "edgetwin.contract.validate",
    "load_valid_log": "edgetwin.contract.validate",
    "read_table": "edgetwin.contract.logs",
    "resolve_spec": "edgetwin.contract.logs",
    "resolve_function_ref": "edgetwin.contract.spec",
    "spec_path_for": "edgetwin.contract.spec",
    "verify_manifest": "edgetwin.contract.manifest",
    "validate_log": "edgetwin.contract.validate",
    "write_manifest": "edgetwin.contract.manifest",
    "write_table": "edgetwin.contract.logs",
}
__all__ = sorted(_WHERE)
__getattr__, __dir__ = lazy_exports(__name__, _WHERE)
