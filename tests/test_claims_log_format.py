"""docs/log-format.md's spec table and guard defaults, checked against the code that keeps them.

A KPI column's ``margin`` defaults to the gate's ``default_margin`` (5 %; `promote --gate-config`: the
page once named a `--default-margin` flag that `promote` does not have), the spec's top-level and
feature defaults are what a bare spec loads with, and the emulated cluster declares the margins the
page names.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import typer.main

from edgetwin.cli import app
from edgetwin.cli.policy import GateConfig
from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import TwinSpec
from edgetwin.emulator.cluster import KPI_GOALS
from edgetwin.policies.gate_checks import resolve_guards
from edgetwin.twin.whatif.kpis import default_kpis

DOC = (Path(__file__).resolve().parents[1] / "docs" / "log-format.md").read_text()


def _row(key: str) -> list[str]:
    """The cells of the spec table's row of ``key``."""
    line = next(ln for ln in DOC.splitlines() if ln.startswith(f"| `{key}` |"))
    return [c.strip() for c in line.strip("|").split("|")]


def test_a_kpis_margin_defaults_to_the_gates_default_margin() -> None:
    cells = _row("margin")
    stated = float(re.search(r"`default_margin` \((\d+) %", cells[2]).group(1)) / 100  # type: ignore[union-attr]
    promote = typer.main.get_command(app).commands["promote"]  # type: ignore[attr-defined]
    flags = {o for p in promote.params for o in p.opts}
    named = set(re.findall(r"`(--[a-z-]+)", cells[2]))
    assert named <= flags, f"log-format.md names {named - flags}, which `promote` does not take"
    assert "--gate-config" in cells[2] and "--gate-config" in flags
    assert GateConfig().default_margin == pytest.approx(stated)
    spec = TwinSpec.from_dict({"features": [
        {"name": "action.admit"},
        {"name": "kpi.wait", "better": "lower"},
        {"name": "kpi.gain", "better": "higher", "margin": 0.02},
    ]})
    margins = {g.kpi: g.max_regression for g, _ in resolve_guards(default_kpis(spec, ["kpi.wait", "kpi.gain"]), None)}
    assert margins == {"kpi.wait": pytest.approx(stated), "kpi.gain": pytest.approx(0.02)}


def test_the_emulated_clusters_declared_margins_are_the_pages() -> None:
    text = re.sub(r"\s+", " ", _row("margin")[3])
    assert "revenue higher at 2 %, SLO violations, task time, energy and carbon lower at 5 %" in text
    assert KPI_GOALS == {
        "kpi.revenue": ("higher", 0.02), "kpi.slo_violation": ("lower", 0.05), "kpi.task_time_ms": ("lower", 0.05),
        "kpi.energy_j": ("lower", 0.05), "kpi.carbon_g": ("lower", 0.05),
    }


def test_a_bare_spec_takes_the_tables_defaults() -> None:
    spec = TwinSpec.from_dict({"features": [{"name": "state.q"}, {"name": "action.admit"}]})
    assert _row("name")[2] == '`"unnamed"`' and spec.name == "unnamed"
    assert _row("step_seconds")[2] == "`1.0`" and spec.step_seconds == 1.0
    feat = spec.feature("state.q")
    assert feat is not None
    assert _row("kind")[2] == '`"continuous"`' and feat.kind == "continuous"
    assert _row("scope")[2] == '`"agent"`' and feat.scope == "agent"
    assert _row("low`, `high")[2] == "unbounded" and feat.low is None and feat.high is None


def _flat() -> str:
    return re.sub(r"\s+", " ", DOC)


def test_the_prometheus_importers_stated_bounds_are_its_defaults() -> None:
    """"at most `--max-points` steps (Prometheus answers at most 11,000 points per series)", "retried
    `--retries` times (3)", "`--concurrency` (2)", "`--max-answer-mb` (256)"."""
    from edgetwin.contract.prometheus.grid import MAX_POINTS

    flat = _flat()
    cmd = typer.main.get_command(app).commands["logs"].commands["import"].commands["prometheus"]  # type: ignore[attr-defined]
    defaults = {p.opts[0]: p.default for p in cmd.params}
    points = int(re.search(r"at most ([\d,]+) points per series", flat).group(1).replace(",", ""))  # type: ignore[union-attr]
    assert defaults["--max-points"] == points == MAX_POINTS
    for flag in ("--retries", "--concurrency", "--max-answer-mb"):
        stated = float(re.search(rf"`{flag}`(?: times)? \((\d+)\)", flat).group(1))  # type: ignore[union-attr]
        assert defaults[flag] == pytest.approx(stated), flag


def test_an_answer_nested_deeper_than_the_page_says_is_refused() -> None:
    """"JSON nested deeper than 64 levels is refused before it is parsed"; a server's error shown
    "as one line of at most 300 characters"."""
    from edgetwin.contract.json_bounds import JSONRefused, loads_bounded
    from edgetwin.contract.prometheus.http import _shown

    flat = _flat()
    depth = int(re.search(r"JSON nested deeper than (\d+) levels is refused", flat).group(1))  # type: ignore[union-attr]
    assert loads_bounded(b"[" * depth + b"]" * depth, max_bytes=1 << 20) is not None
    with pytest.raises(JSONRefused):
        loads_bounded(b"[" * (depth + 1) + b"]" * (depth + 1), max_bytes=1 << 20)
    shown = int(re.search(r"shown as one line of at most (\d+) characters", flat).group(1))  # type: ignore[union-attr]
    line = _shown("<html>\n" + "x" * 5000)
    assert len(line) == shown and "\n" not in line


def _console(after: str) -> list[str]:
    """The lines of the ```console block of "Running the validator" that starts with ``$ after``."""
    start = DOC.index(f"$ {after}\n", DOC.index("## Running the validator")) + len(f"$ {after}\n")
    return DOC[start : DOC.index("```", start)].rstrip("\n").splitlines()


def _fenced(lang: str) -> str:
    start = DOC.index(f"```{lang}\n") + len(f"```{lang}\n")
    return DOC[start : DOC.index("```", start)]


def test_the_validators_printed_report_is_the_pages(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """"Running the validator": the example log, and the same log with "a negative queue length, a CPU
    share of 1.75, `tue`'s last step logged as `t=3`, a repeated row and an extra `note` column",
    print what the page shows, line for line, and exit 0 (usable)."""
    import pandas as pd

    from edgetwin.cli import main

    monkeypatch.chdir(tmp_path)
    Path("queue.spec.toml").write_text(_fenced("toml"))
    Path("bad.spec.toml").write_text(_fenced("toml"))
    Path("queue.csv").write_text(_fenced("csv"))
    good = pd.read_csv("queue.csv")
    bad = good.copy()
    bad.loc[1, "state.queue_len"] = -1  # mon, t=0, nightly-etl
    bad.loc[2, "action.cpu_share"] = 1.75  # mon, t=1, checkout
    bad.loc[bad["episode"].eq("tue") & bad["t"].eq(2), "t"] = 3
    bad = pd.concat([bad, bad.iloc[[4]]], ignore_index=True)  # mon, t=2, checkout again
    bad["note"] = "x"
    bad.to_csv("bad.csv", index=False)
    for name in ("queue.csv", "bad.csv"):
        with pytest.raises(SystemExit) as done:
            main(["logs", "validate", name])
        out = capsys.readouterr().out
        assert int(done.value.code or 0) == 0
        assert [ln.rstrip() for ln in out.rstrip("\n").splitlines()] == _console(f"edgetwin logs validate {name}")


def test_spec_code_is_allowed_as_the_allow_code_table_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """"a module allows its submodules: `mypkg` allows `mypkg.rewards`"; the allow-list file is
    `$EDGETWIN_CONFIG_DIR/allow-code`, default `$XDG_CONFIG_HOME/edgetwin/allow-code`, `#` starts a
    comment; `EDGETWIN_ALLOW_CODE` is comma-separated."""
    from edgetwin.contract.functions import allow_list_file, resolve_function_ref

    flat = _flat()
    assert "a module allows its submodules: `mypkg` allows `mypkg.rewards`" in flat
    assert "`$EDGETWIN_CONFIG_DIR/allow-code` (default `$XDG_CONFIG_HOME/edgetwin/allow-code`" in flat
    ref = "json.decoder:JSONDecoder"  # a stdlib submodule, already imported: nothing runs
    monkeypatch.delenv("EDGETWIN_CONFIG_DIR", raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert allow_list_file() == tmp_path / "xdg" / "edgetwin" / "allow-code"
    for allowed, ok in (("", False), ("jso", False), ("os,json", True), ("json.decoder", True)):
        monkeypatch.setenv("EDGETWIN_ALLOW_CODE", allowed)
        if ok:
            assert callable(resolve_function_ref(ref))
        else:
            with pytest.raises(InputError, match="not allowed to run on this machine"):
                resolve_function_ref(ref)
    monkeypatch.setenv("EDGETWIN_ALLOW_CODE", "")
    (tmp_path / "xdg" / "edgetwin").mkdir(parents=True)
    (tmp_path / "xdg" / "edgetwin" / "allow-code").write_text("# json\n")
    with pytest.raises(InputError):
        resolve_function_ref(ref)
    (tmp_path / "xdg" / "edgetwin" / "allow-code").write_text("json  # the standard library's\n")
    assert callable(resolve_function_ref(ref))
    monkeypatch.setenv("EDGETWIN_CONFIG_DIR", str(tmp_path / "cfg"))
    assert allow_list_file() == tmp_path / "cfg" / "allow-code"
    with pytest.raises(InputError):  # the XDG file is not read once EDGETWIN_CONFIG_DIR names another
        resolve_function_ref(ref)


def test_the_files_beside_a_log_are_named_as_the_page_says() -> None:
    """"`LOG` is the file name up to its first dot: `day1.parquet` → `day1.spec.toml`,
    `day1.quarantine.csv`", for every suffix the page lists."""
    from edgetwin.contract.spec import spec_path_for
    from edgetwin.contract.validation_report import quarantine_path_for

    assert "`day1.parquet` → `day1.spec.toml`, `day1.quarantine.csv`" in DOC
    suffixes = re.findall(r"`LOG(\.[a-z.]+)`", _row("LOG.parquet`, `LOG.pq`, `LOG.csv`, `LOG.csv.gz")[0])
    assert suffixes == [".parquet", ".pq", ".csv", ".csv.gz"]
    for suffix in suffixes:
        log = Path("/data") / f"day1{suffix}"
        assert spec_path_for(log) == Path("/data/day1.spec.toml")
        assert quarantine_path_for(log) == Path("/data/day1.quarantine.csv")


def test_the_emulated_clusters_policy_names_are_the_pages() -> None:
    """"Policy names: `random`, `heuristic` (the SLO-aware one), `regime_switching` and the heuristics of
    `edgetwin.policies.heuristics` (...)": each makes a policy, and there are no others."""
    from edgetwin.emulator.cluster import EdgeCluster
    from edgetwin.emulator.logs import make_policy, policy_names

    text = _flat()
    para = text[text.index("Policy names: ") : text.index("`lowest_carbon`).") + len("`lowest_carbon`")]
    stated = re.findall(r"`([a-z_]+)`", para)
    assert set(stated) == set(policy_names()) and len(stated) == 9
    spec = EdgeCluster().spec
    for name in stated:
        assert make_policy(name, spec, seed=0) is not None
    with pytest.raises(InputError):
        make_policy("no_such_policy", spec, seed=0)
