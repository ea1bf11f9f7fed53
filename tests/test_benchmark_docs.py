"""docs/benchmarks/README.md's at-a-glance table says only what the benchmarks' JSON files say.

Each line of the table names a command (a script in benchmarks/ and its flags) and a JSON file + field;
the number printed as edgetwin's must be that field's value at the printed precision. The line format
is described in a comment above the table. Static checks only (no benchmark runs): fast.
"""

from __future__ import annotations

import ast
import functools
import json
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BENCH_DOCS = ROOT / "docs" / "benchmarks"
README = BENCH_DOCS / "README.md"
HEADER = "| capability | paper | target | edgetwin | verdict | command | source |"
NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")


def table_lines() -> list[list[str]]:
    """The at-a-glance table's rows, as lists of 7 stripped cells (header and rule excluded)."""
    lines = README.read_text().splitlines()
    start = lines.index(HEADER)
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip().strip("|").split("|")])
    return rows


def code(cell: str) -> str:
    """The text between the cell's first pair of backticks."""
    m = re.search(r"`([^`]+)`", cell)
    assert m, f"no `...` in {cell!r}"
    return m.group(1)


def script_flags(script: Path, seen: set[Path] | None = None) -> set[str]:
    """Every ``--flag`` the script's argparse declares, including helper modules it imports
    from benchmarks/ (``import _x`` / ``from _x import ...``)."""
    seen = set() if seen is None else seen
    seen.add(script)
    tree = ast.parse(script.read_text())
    flags: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            flags |= {a.value for a in node.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")}
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module]
        for name in names:
            helper = script.parent / f"{name}.py"
            if helper.is_file() and helper not in seen:
                flags |= script_flags(helper, seen)
    return flags


@functools.cache
def flags_of(script: Path) -> frozenset[str]:
    """`script_flags`, once per script and test process: ~100 rows name a dozen scripts, and each
    reading parses the script and every helper it imports (98 % of the rows' test time before)."""
    return frozenset(script_flags(script))


def field(data: object, path: str) -> object:
    """``data`` at a dotted path with ``[i]`` list indices, e.g. ``extra_runs[6].fits[0].seconds``."""
    for part in path.split("."):
        m = re.fullmatch(r"(.*?)((?:\[\d+\])*)", part)
        assert m
        key, idx = m.group(1), m.group(2)
        if key:
            assert isinstance(data, dict) and key in data, f"no key {key!r} in {path!r}"
            data = data[key]
        for i in re.findall(r"\[(\d+)\]", idx):
            assert isinstance(data, list) and int(i) < len(data), f"no item [{i}] in {path!r}"
            data = data[int(i)]
    return data


@functools.cache
def load(path: Path) -> object:
    """A JSON file, read once per test session (several lines read the same file)."""
    return json.loads(path.read_text())


def source_value(source: str) -> float:
    """The value a source cell names: ``file:field[ / field][ × F | ÷ F]`` (file under docs/benchmarks/)."""
    scale = 1.0
    m = re.fullmatch(r"(.*?)\s*([×÷])\s*([\d.]+)", source)
    if m:
        source, op, f = m.group(1), m.group(2), float(m.group(3))
        scale = f if op == "×" else 1 / f
    file, _, expr = source.partition(":")
    path = BENCH_DOCS / file
    assert path.is_file(), f"no JSON file {path}"
    data = load(path)
    parts = [p.strip() for p in expr.split(" / ")]
    values = [field(data, p) for p in parts]
    assert all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values), (source, values)
    value = float(values[0]) / float(values[1]) if len(values) == 2 else float(values[0])
    return value * scale


ROWS = table_lines()


def test_table_has_lines_of_seven_cells() -> None:
    assert len(ROWS) >= 10
    for row in ROWS:
        assert len(row) == 7, row


@pytest.mark.parametrize("row", ROWS, ids=[r[0][:50] for r in ROWS])
def test_line_is_regenerated_by_its_command_and_json(row: list[str]) -> None:
    _, _, _, edgetwin, verdict, command, source = row
    assert re.match(r"(met|missed|unverified: )", verdict), f"verdict must start met / missed / unverified: {verdict!r}"
    argv = shlex.split(code(command))
    assert argv[0] == "python" and argv[1].startswith("benchmarks/"), argv
    script = ROOT / argv[1]
    assert script.is_file(), f"no script {script}"
    unknown = {a for a in argv[2:] if a.startswith("--")} - flags_of(script)
    assert not unknown, f"{argv[1]} has no flag(s) {sorted(unknown)}"
    printed = NUMBER.search(edgetwin)
    assert printed, f"no number in {edgetwin!r}"
    text = printed.group(0).replace(",", "").lstrip("+")
    decimals = len(text.split(".")[1]) if "." in text else 0
    value = source_value(code(source))
    assert f"{value:.{decimals}f}" == f"{float(text):.{decimals}f}", (
        f"{row[0]}: printed {printed.group(0)}, JSON says {value!r}")


def test_links_of_the_benchmark_pages_resolve() -> None:
    pages = [README, BENCH_DOCS / "CHANGELOG.md", ROOT / "docs" / "benchmarks.md", *sorted(BENCH_DOCS.glob("*/README.md"))]
    for page in pages:
        for target in re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            assert (page.parent / target).exists(), f"{page.relative_to(ROOT)} links to missing {target}"


def test_every_benchmark_page_is_linked_from_the_index() -> None:
    """A page nobody links to is a page nobody reruns: its numbers go stale unseen (an older copy of
    the closed-loop page lived on that way)."""
    index = README.read_text()
    for page in sorted(BENCH_DOCS.glob("*/README.md")):
        name = page.parent.name
        assert f"({name}/README.md)" in index or f"({name}/)" in index, f"{page.relative_to(ROOT)} is not linked from {README.relative_to(ROOT)}"


def test_every_page_a_script_writes_exists() -> None:
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import _docs
    finally:
        sys.path.pop(0)
    for heading, name in _docs.PAGES.items():
        page = BENCH_DOCS / name / "README.md"
        assert page.is_file(), f"no page for {heading!r}"
        assert re.search(rf"^{re.escape(heading)}$", page.read_text(), re.M), f"{page} lacks {heading!r}"


def test_a_script_writes_its_section_into_its_page_with_links_relative_to_the_page(tmp_path: Path) -> None:
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import _docs
    finally:
        sys.path.pop(0)
    page = tmp_path / "scale" / "README.md"
    text = "## Scale\n\n![fit](benchmarks/scale/fit.png) ![other](benchmarks/erlfc/erlfc.png) [log](log-format.md)\n"
    _docs.write_section("## Scale", text, page)
    _docs.write_section("## Scale", text, page)  # a rerun replaces, it does not append
    out = page.read_text()
    assert out.startswith("# Scale\n\n[All benchmarks](../README.md)\n")
    assert out.count("## Scale") == 1
    # relative to docs/benchmarks/<name>/ as the real page would be
    assert _docs.relink("![fit](benchmarks/scale/fit.png)", _docs.page("## Scale")) == "![fit](./fit.png)"
    assert _docs.relink("[l](log-format.md#x)", _docs.page("## Scale")) == "[l](../../log-format.md#x)"
    assert _docs.relink("[a](../README.md) [w](https://x.org/a)", _docs.page("## Scale")) == (
        "[a](../README.md) [w](https://x.org/a)")
    # a benchmark without a PAGES entry gets a page named after its heading
    assert _docs.page("## Causal twin: do() vs the cluster") == _docs.BENCH_DOCS / "causal_twin_do_vs_the_cluster" / "README.md"
