"""docs/log-format.md's "What stops the import" messages are what `edgetwin logs import prometheus` prints.

The table gives, per problem, the one line a user sees (exit 2). The cases that need no server are run
here as the page writes them, on the page's own mapping (`queue.mapping.toml`): a column outside the
contract, a step that does not divide the range (from `--step`, and from the mapping), and a server
that cannot be reached (a closed loopback port stands for `http://prometheus:9090`; the retries'
pauses are skipped). Each printed line must start with the page's example up to its `...`.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import free_port

from edgetwin.cli import main

DOC = (Path(__file__).resolve().parents[1] / "docs" / "log-format.md").read_text()
RANGE = ["--start", "2026-03-01T00:00:00Z", "--end", "2026-03-02T00:00:00Z"]


def _example(problem: str) -> str:
    """The example message of the table row whose problem starts with ``problem``."""
    table = DOC[DOC.index("What stops the import"):]
    row = next(ln for ln in table.splitlines() if ln.startswith(f"| {problem}"))
    return re.findall(r"`([^`]+)`", row.split(" | ")[-1])[0]


def _mapping() -> str:
    start = DOC.index("# queue.mapping.toml")
    return DOC[start:DOC.index("```", start)]


def _prefix(example: str) -> str:
    return example.split("...")[0].rstrip(" ,")


def _import(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as done:
        main(["logs", "import", "prometheus", *args])
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert done.value.code == 2 and len(lines) == 1 and "Traceback" not in out + err, (done.value.code, err)
    return lines[0].removeprefix("error: ")


def test_the_pages_import_errors_are_printed_as_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import edgetwin.contract.prometheus.http as http

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(http.time, "sleep", lambda s: None)
    Path("queue.mapping.toml").write_text(_mapping())
    closed = f"http://127.0.0.1:{free_port()}"
    common = ["--mapping", "queue.mapping.toml", "--out", "queue.parquet", *RANGE]

    want = _example("a step that does not divide the range")
    got = _import([*common, "--step", re.search(r"a step of (\d+) s", want).group(1), "--url", closed], capsys)  # type: ignore[union-attr]
    assert got.startswith(_prefix(want)), (got, want)
    row = next(ln for ln in DOC.splitlines() if ln.startswith("| a step that does not divide the range"))
    from_mapping = re.search(r"\(or `([^`]+)` when the step came from the mapping\)", row).group(1)  # type: ignore[union-attr]
    Path("queue.mapping.toml").write_text(re.sub(r'(?m)^step = "5m"', 'step = "7m"', _mapping()))
    assert _import([*common, "--url", closed], capsys).startswith(_prefix(from_mapping))

    Path("queue.mapping.toml").write_text(_mapping().replace('[columns."kpi.latency_ms"]', '[columns."latency"]'))
    want = _example("a column that is not in the contract")
    got = _import([*common, "--url", closed], capsys)
    assert got.startswith(_prefix(want)), (got, want)

    Path("queue.mapping.toml").write_text(_mapping())
    want = _example("the server cannot be reached").replace("http://prometheus:9090", closed)
    got = _import([*common, "--url", closed], capsys)
    assert got.startswith(_prefix(want)), (got, want)
