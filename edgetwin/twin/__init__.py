"""The log contract, the `Twin` artifact and its environments, fidelity metrics and what-ifs."""

from edgetwin.contract.logs import read_table, resolve_spec, write_table
from edgetwin.contract.spec import Feature, TwinSpec

__all__ = ["Feature", "TwinSpec", "read_table", "resolve_spec", "write_table"]
