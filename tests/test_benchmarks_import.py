"""Every benchmark script imports cleanly and has a `main` (catches broken shared helpers early)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
SCRIPTS = sorted(p.stem for p in BENCH.glob("*.py") if not p.stem.startswith("_"))


@pytest.fixture(scope="module", autouse=True)
def _bench_on_path() -> Iterator[None]:
    sys.path.insert(0, str(BENCH))
    yield
    sys.path.remove(str(BENCH))


@pytest.mark.parametrize("name", SCRIPTS)
def test_benchmark_imports_and_has_main(name: str) -> None:
    module = importlib.import_module(name)
    assert callable(getattr(module, "main", None)), f"benchmarks/{name}.py has no main()"


def test_write_section_replaces_one_section_and_keeps_named_subsections(tmp_path: Path) -> None:
    import _docs

    doc = tmp_path / "benchmarks.md"
    doc.write_text(
        "# Benchmarks\n\n## A\n\nold A\n\n### Kept analysis\n\nby hand\n\n### Dropped\n\nstale\n\n## B\n\nB stays\n"
    )
    _docs.write_section("## A", "## A\n\nnew A\n", doc, keep=("### Kept analysis",))
    assert doc.read_text() == "# Benchmarks\n\n## A\n\nnew A\n\n### Kept analysis\n\nby hand\n\n## B\n\nB stays\n"
    _docs.write_section("## C", "## C\n\nC\n", doc)
    assert doc.read_text().endswith("## B\n\nB stays\n\n## C\n\nC\n\n")
