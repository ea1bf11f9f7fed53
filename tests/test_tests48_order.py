"""The default run's file order (tests/conftest.py): the longest files are handed out first."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from conftest import (
    LONG_FILES_FIRST,
    SAME_WORKER,
    file_key,
    long_files_first,
    pytest_configure,
    pytest_xdist_make_scheduler,
)

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


def test_every_same_worker_file_is_a_test_file_that_uses_its_fixture() -> None:
    """A file named in `SAME_WORKER` exists, is named once and asks for its group's fixture (else the
    group keeps on one worker files that gain nothing from it)."""
    names = [name for files in SAME_WORKER.values() for name in files]
    assert len(set(names)) == len(names)
    for fixture, files in SAME_WORKER.items():
        assert len(files) > 1, fixture
        for name in files:
            assert (TESTS / name).is_file(), f"renamed or removed: {name}"
            assert fixture in (TESTS / name).read_text(), (name, fixture)


def test_a_same_worker_group_is_one_work_unit_of_loadfile() -> None:
    """With ``--dist loadfile`` the scheduler puts a group's files in one scope (one worker runs them
    all, in the collection's order) and every other file in its own; other modes are xdist's."""
    pytest.importorskip("xdist")
    fixture, files = next(iter(SAME_WORKER.items()))
    config: Any = SimpleNamespace(getvalue=lambda name: "loadfile", option=SimpleNamespace(loadscopereorder=False),
                                  getoption=lambda *a, **k: None)  # fmt: skip
    sched = pytest_xdist_make_scheduler(config, None)
    scopes = {sched._split_scope(f"tests/{name}::test_x") for name in files}
    assert len(scopes) == 1 and fixture in scopes.pop()
    assert sched._split_scope("tests/test_tests48_order.py::test_x") == "tests/test_tests48_order.py"
    assert sched._split_scope("tests/security/test_federation.py::T::test_y") == "tests/security/test_federation.py"
    other: Any = SimpleNamespace(getvalue=lambda name: "load")
    assert pytest_xdist_make_scheduler(other, None) is None
