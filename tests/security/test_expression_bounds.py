"""Constant folding is bounded in the grammar (issue 45, item 4).

``10 ** 10 ** 10`` passed the grammar and numexpr folded it with Python integers: every reader of
that spec hung. The grammar now folds constant parts itself in float arithmetic and refuses one
beyond `MAX_CONSTANT`, before numexpr sees the text; the check runs in a child process with a
deadline so that a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from edgetwin.contract.errors import InputError
from edgetwin.contract.expressions import MAX_CONSTANT, parse_expression

BOMBS = ["10 ** 10 ** 10", "state.load * (9 ** 9 ** 9)", "(2 ** 64) ** 64", "where(state.load > 1, 7 ** 99999999, 0)",
         "sum(state.load ** (10 ** 100))", "(-8) ** 0.5"]  # fmt: skip


@pytest.mark.parametrize("text", BOMBS)
def test_a_constant_that_folds_beyond_the_bound_is_refused_by_the_grammar(text: str) -> None:
    code = (
        "from edgetwin.contract.expressions import parse_expression\n"
        "from edgetwin.contract.errors import InputError\n"
        f"try:\n    parse_expression({text!r}, '[[dynamics]] entry 1', 'next')\n"
        "except InputError as e:\n    print('refused:', e)\nelse:\n    print('accepted')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith("refused:") and "folds to a number beyond" in res.stdout, res.stdout


def test_ordinary_constants_and_columns_still_pass() -> None:
    for text in ("state.load ** 2", "2 ** 62", "state.load * 1e300", "0.5 ** 3 + 3 % 2", "state.load ** (1 / 3)"):
        parse_expression(text, "[[dynamics]] entry 1", "next")
    assert MAX_CONSTANT == 2.0**63
    with pytest.raises(InputError, match="entry 1"):
        parse_expression("1e308 * 10", "[[dynamics]] entry 1", "next")
