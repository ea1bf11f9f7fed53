"""docs/benchmarks/README.md's at-a-glance table: every line names a benchmark script that exists and a
JSON file and field that exist, and the number it prints is the one in that field."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "docs" / "benchmarks" / "README.md"
#: `<number> <unit>`: the unit ``%`` prints a JSON fraction times 100; the others print the value itself
NUMBER = re.compile(r"^([-+]?[\d,]*\.?\d+)\s*(%|x|ms|s|/s)?$")


def table_rows() -> list[dict[str, str]]:
    lines = README.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| capability |"))
    head = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        rows.append(dict(zip(head, cells, strict=True)))
    return rows


def field(doc: Any, path: str) -> Any:
    for key in path.split("."):
        doc = doc[int(key)] if isinstance(doc, list) else doc[key]
    return doc


def test_the_table_has_a_line_per_capability() -> None:
    rows = table_rows()
    assert len(rows) >= 8
    assert {r["met?"] for r in rows} <= {"met", "missed"}


@pytest.mark.parametrize("row", table_rows(), ids=lambda r: re.sub(r"\W+", "-", r["capability"])[:60])
def test_each_line_names_a_script_and_a_json_field_that_give_its_number(row: dict[str, str]) -> None:
    command = re.fullmatch(r"`(python (benchmarks/\w+\.py)(?: [^`]*)?)`", row["command"])
    assert command, row["command"]
    assert (ROOT / command.group(2)).is_file(), command.group(2)
    source = re.fullmatch(r"`([^`]+\.json)` · `([^`]+)`", row["JSON file · field"])
    assert source, row["JSON file · field"]
    path = ROOT / source.group(1)
    assert path.is_file(), path
    value = float(field(json.loads(path.read_text()), source.group(2)))
    printed = NUMBER.match(row["edgetwin"])
    assert printed, row["edgetwin"]
    number, unit = printed.group(1).replace(",", ""), printed.group(2)
    shown = 100 * value if unit == "%" else value
    decimals = len(number.split(".")[1]) if "." in number else 0
    assert abs(shown - float(number)) <= 0.5 * 10**-decimals + 1e-12, (row["capability"], shown, number)
    # the verdict follows from the target's direction and the number
    target = re.match(r"^(≥|≤)\s*([\d,.]+)", row["target"])
    if target:
        bound = float(target.group(2).replace(",", ""))
        met = float(number) >= bound if target.group(1) == "≥" else float(number) <= bound
        assert row["met?"] == ("met" if met else "missed"), row["capability"]


def test_every_benchmark_page_is_linked_from_the_table_page() -> None:
    text = README.read_text()
    pages = sorted(p.parent.name for p in README.parent.glob("*/README.md"))
    assert pages and all(f"({name}/README.md)" in text for name in pages)


def test_a_script_writing_docs_benchmarks_md_writes_its_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import _docs
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    monkeypatch.setattr(_docs, "DOC", tmp_path / "benchmarks.md")
    monkeypatch.setattr(_docs, "PAGES_DIR", tmp_path / "benchmarks")
    monkeypatch.setitem(_docs.PAGES, "## Thing", "thing")
    _docs.write_section("## Thing", "## Thing\n\n![plot](benchmarks/thing/plot.png) [doc](bus.md#x)\n", tmp_path / "benchmarks.md")
    page = tmp_path / "benchmarks" / "thing" / "README.md"
    assert not (tmp_path / "benchmarks.md").exists()
    assert page.read_text() == _docs.PAGE_HEAD + "## Thing\n\n![plot](plot.png) [doc](../../bus.md#x)\n\n"


def test_the_pages_relative_links_resolve() -> None:
    broken = []
    for page in [README, *README.parent.glob("*/README.md"), *(ROOT / "docs").glob("*.md")]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"^[a-z]+:|^#", target):
                continue
            if not (page.parent / target.split("#")[0]).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken
