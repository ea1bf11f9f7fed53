"""README's sentence on the loop's extension over canary days says where it runs: `canary_loop` extends when it is
given each day's fleet (``days``) and ``max_days``; `edgetwin promote --canary-config` runs its ``rounds`` on one day's
fleet and does not extend (its config has no day count, and the CLI passes neither)."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_extension_sentence_names_where_it_runs() -> None:
    from edgetwin.cli import policy as cli_policy
    from edgetwin.loop.fleet import EmulatedCanaryConfig
    from edgetwin.loop.rounds import canary_loop

    readme = " ".join((ROOT / "README.md").read_text().split())
    assert ("The benchmark's loop (`edgetwin.loop.rounds.canary_loop` given each day's fleet, `days`, and `max_days=16`; "
            "`edgetwin promote --canary-config` runs its `rounds` on one day's fleet and does not extend) extends a "
            "candidate that is not hurting for up to 16 canary days") in readme  # fmt: skip
    params = inspect.signature(canary_loop).parameters
    assert {"days", "max_days"} <= set(params) and params["max_days"].default == 1  # one day unless told
    assert not any("day" in f.name for f in dataclasses.fields(EmulatedCanaryConfig))  # no day count to set
    src = inspect.getsource(cli_policy)
    call = src[src.index("result = canary_loop("):]
    call = call[: call.index(")  # fmt: skip")]
    assert "max_rounds=canary.rounds" in call and "days=" not in call and "max_days" not in call
