"""The default run's file order (tests/conftest.py): the longest files are handed out first."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import LONG_FILES_FIRST, file_key, long_files_first, pytest_configure

TESTS = Path(__file__).resolve().parent


def test_every_long_file_named_is_a_test_file_once() -> None:
    assert LONG_FILES_FIRST, "the list is what orders the run"
    assert len(set(LONG_FILES_FIRST)) == len(LONG_FILES_FIRST)
    missing = [name for name in LONG_FILES_FIRST if not (TESTS / name).is_file()]
    assert not missing, f"renamed or removed: {missing}"


def test_named_files_come_first_in_their_order_and_each_files_tests_keep_theirs() -> None:
    first, second = LONG_FILES_FIRST[0], LONG_FILES_FIRST[1]

    def item(name: str, test: str) -> Any:
        return SimpleNamespace(path=TESTS / name, name=test)

    items = [item("test_a.py", "1"), item(second, "1"), item("test_b.py", "1"), item(first, "1"),
             item(second, "2"), item("test_a.py", "2"), item(first, "2")]  # fmt: skip
    long_files_first(items)
    got = [(i.path.name, i.name) for i in items]
    assert got == [(first, "1"), (first, "2"), (second, "1"), (second, "2"),
                   ("test_a.py", "1"), ("test_b.py", "1"), ("test_a.py", "2")]  # fmt: skip


def test_xdist_keeps_the_collections_order() -> None:
    config: Any = SimpleNamespace(option=SimpleNamespace(loadscopereorder=True))
    pytest_configure(config)
    assert config.option.loadscopereorder is False
    without_xdist: Any = SimpleNamespace(option=SimpleNamespace())
    pytest_configure(without_xdist)  # no such option: nothing to do
    assert not hasattr(without_xdist.option, "loadscopereorder")


def test_the_run_uses_the_order(request: pytest.FixtureRequest) -> None:
    """This session's own items went through the hook: the long files named precede every other."""
    names = [file_key(item) for item in request.session.items]
    assert all(n.endswith(".py") and not n.startswith(("tests/", "/")) for n in names), names  # paths under tests/
    ranks = [LONG_FILES_FIRST.index(n) if n in LONG_FILES_FIRST else len(LONG_FILES_FIRST) for n in names]
    assert ranks == sorted(ranks)
