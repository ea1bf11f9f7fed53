"""The contract: what every part of edgetwin shares, and the bottom layer of the package.

* `edgetwin.contract.spec`: the twin spec (`TwinSpec`, `Feature`), read from TOML beside a log.
* `edgetwin.contract.logs`: reading and writing logs (Parquet / CSV) and finding their spec.
* `edgetwin.contract.validate`: every problem of a log at once, and the quarantine of unusable rows.
* `edgetwin.contract.policy`: the `PlatformPolicy` protocol (``act(obs) -> actions``) and the
  generic logging policies over a spec's action box (random, noisy, regimes).
* `edgetwin.contract.metrics`: the fidelity yardstick (KL, MMD, C2ST, correlation distance) that
  the population models, the response models and the twin are all judged with.
* `edgetwin.contract.errors`: `InputError` (exit 2) and `GateRefused` (exit 1), which the CLI turns
  into one line and an exit code.

Nothing here imports another edgetwin package, and nothing here assumes a system's column names.
"""

from edgetwin.contract.errors import GateRefused, InputError
from edgetwin.contract.logs import read_table, resolve_spec, write_table
from edgetwin.contract.policy import FunctionPolicy, NoisyPolicy, PlatformPolicy, RandomPolicy, RegimePolicy
from edgetwin.contract.spec import REWARD_COLUMN, Feature, TwinSpec, spec_path_for
from edgetwin.contract.validate import ValidationReport, load_valid_log, validate_log

__all__ = [
    "REWARD_COLUMN",
    "Feature",
    "FunctionPolicy",
    "GateRefused",
    "InputError",
    "NoisyPolicy",
    "PlatformPolicy",
    "RandomPolicy",
    "RegimePolicy",
    "TwinSpec",
    "ValidationReport",
    "load_valid_log",
    "read_table",
    "resolve_spec",
    "spec_path_for",
    "validate_log",
    "write_table",
]
