"""``--trust KEYS`` for the commands that load a twin: refuse one that is not signed by a trusted key.

A twin is what users pass around ("here is last month's twin, try your policy in it"), and its
manifest proves it intact, not who made it. With ``--trust`` (public key files or directories),
``train``, ``whatif``, ``evaluate --on twin``, ``fidelity`` and ``promote --twin`` first check the
twin directory's ``SIGNATURE.json`` (`edgetwin.edge.signed_dirs.verify_directory`) and exit 2 with
one line when it is unsigned, signed by another key, or re-sealed after it was signed.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

__all__ = ["TwinTrustOpt", "check_twin_trust"]

TwinTrustOpt = Annotated[
    list[Path] | None,
    typer.Option(
        "--trust",
        help="Public key file or directory (repeatable): refuse the twin unless it is signed by one of these keys "
        "(its SIGNATURE.json, from `edgetwin registry sign` / `fit --key` / `registry fetch`).",
    ),
]


def check_twin_trust(twin_dir: Path, trust: list[Path] | Any | None) -> None:
    """Verify ``twin_dir``'s signature against ``trust`` (paths, or a `TrustStore`); no-op without it.

    Raises:
        ArtifactRejected, ArtifactTampered, InputError: exit 2 (unsigned, untrusted, tampered, no keys).
    """
    if trust is None:
        return
    from edgetwin.edge.signed_dirs import verify_directory
    from edgetwin.edge.signing import TrustStore

    store = trust if isinstance(trust, TrustStore) else TrustStore.from_paths(trust)
    verify_directory(twin_dir, "twin", store)
