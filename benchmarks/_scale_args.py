"""``--workers`` and ``--ray`` for the benchmarks: where their independent tasks run.

A benchmark passes `scale_kwargs` to `Twin.fit` (ensemble members), `run_whatif` / `calibrate`
(what-if cells) or `evaluate_on_twin` (members x episodes): the numbers do not depend on where the
tasks run (DESIGN.md, "Scale"), only the wall time does. Without ``--ray`` nothing imports Ray.
"""

from __future__ import annotations

import argparse
from typing import Any


def add_scale_args(ap: argparse.ArgumentParser) -> None:
    """Add ``--workers N`` (local process pool; 0 = one per core) and ``--ray ADDRESS``."""
    ap.add_argument("--workers", type=int, default=1,
                    help="run independent tasks (ensemble members, what-if cells) on a local process pool of this "
                         "many processes (0: one per core; default 1: serially)")  # fmt: skip
    ap.add_argument("--ray", default=None, metavar="ADDRESS",
                    help="run them on this Ray cluster instead ('auto', 'local' or ray://host:port; pip install "
                         "-e '.[ray]')")  # fmt: skip


def scale_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """``{"workers": ..., "ray_address": ...}`` from the parsed ``--workers`` / ``--ray``."""
    return {"workers": args.workers, "ray_address": args.ray}
