"""docs/canary.md's defaults, flags and numbers, checked against the code that keeps them.

Each test reads what the page states (so a changed sentence fails too) and checks it against the
config, the CLI's own defaults or the planner: `canary.toml`'s keys (the page once gave
`max_loss = ["KPI=0.5%"]` and `train_log = ["TRAIN.parquet"]` as defaults; both are empty), the
commands' bracketed defaults, the planner's candidate windows and design, the `CanaryConfig` example.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import click
import pytest
import typer.main

from edgetwin.cli import app
from edgetwin.contract.errors import InputError
from edgetwin.edge.canary import CanaryConfig
from edgetwin.loop.fleet import EmulatedCanaryConfig
from edgetwin.loop.plan import HOURS_GRID

DOC = (Path(__file__).resolve().parents[1] / "docs" / "canary.md").read_text()
FLAT = re.sub(r"\s+", " ", DOC)


def _command(path: list[str]) -> click.Command:
    cmd = typer.main.get_command(app)
    for word in path:
        cmd = cmd.commands[word]  # type: ignore[attr-defined]
    return cmd


def _default(path: list[str], flag: str) -> object:
    return next(p for p in _command(path).params if flag in p.opts).default


def test_an_empty_canary_toml_keeps_the_pages_defaults(tmp_path: Path) -> None:
    para = FLAT[FLAT.index("`canary.toml` (`edgetwin.loop.fleet.EmulatedCanaryConfig`") :]
    para = para[: para.index("An unknown key")]
    stated = {}
    for span in re.findall(r"`(\w+ = [^`]+)`", para):
        stated.update(tomllib.loads(span))
    assert set(stated) == {"rounds", "max_share", "max_loss", "hours", "current", "agents", "train_log"}
    (tmp_path / "canary.toml").write_text("")
    cfg = EmulatedCanaryConfig.load(tmp_path / "canary.toml")
    for key, value in stated.items():
        got = getattr(cfg, key)
        assert (list(got) if isinstance(got, tuple) else got) == value, key
    assert dict(cfg.budget().max_loss) == {}  # no loss budget unless asked
    (tmp_path / "bad.toml").write_text("round = 2\n")
    with pytest.raises(InputError) as err:
        EmulatedCanaryConfig.load(tmp_path / "bad.toml")
    assert err.value.exit_code == 2 and "round" in str(err.value)


def test_the_commands_bracketed_defaults_are_the_clis() -> None:
    """The synopsis lines' ``[--flag VALUE]`` of a default-valued flag, and the sentences' defaults."""
    checked = 0
    for line in DOC.splitlines():
        m = re.match(r"edgetwin canary (\w+) ", line)
        if not m:
            continue
        for flag, value in re.findall(r"\[(--[a-z-]+) ([\d.]+%?)\]", line):
            default = _default(["canary", m.group(1)], flag)
            if isinstance(default, str):
                assert default == value, (line, flag)
            else:
                assert default == pytest.approx(float(value)), (line, flag)
            checked += 1
    assert checked >= 6  # plan's --max-share / --hours, start's --pre-ticks / --alpha, verdict's --tick-seconds
    assert "`auto` (the default)" in FLAT and _default(["canary", "plan"], "--design") == "auto"


def test_the_planner_weighs_the_pages_candidate_windows() -> None:
    stated = tuple(float(h) for h in re.search(r"each candidate window \(([\d, ]+) h\)", FLAT).group(1).split(", "))  # type: ignore[union-attr]
    assert stated == HOURS_GRID


def test_the_canary_config_example_uses_its_defaults() -> None:
    """The example's `alpha`, `tick_seconds`, `pre_ticks` are `CanaryConfig`'s defaults (so the example
    shows what a config without them does), and the emulated cluster's tick is 900 s."""
    block = DOC[DOC.index("config = CanaryConfig(") :]
    block = block[: block.index("\n)\n")]
    stated = {k: ast.literal_eval(v) for k, v in re.findall(r"^\s+(alpha|tick_seconds|pre_ticks)=([\d.]+),", block, re.M)}
    assert set(stated) == {"alpha", "tick_seconds", "pre_ticks"}
    fields = CanaryConfig.__dataclass_fields__
    for key, value in stated.items():
        assert fields[key].default == pytest.approx(value), key


def test_the_plan_and_the_verdict_live_where_the_page_says() -> None:
    """The page's opening: "The plan ... and the verdict that uses both are in `edgetwin.X`" (it said
    `edgetwin.policies`, which holds neither)."""
    import importlib

    pkg = re.search(r"the verdict that uses both are in `(edgetwin\.\w+)`", FLAT).group(1)  # type: ignore[union-attr]
    assert callable(importlib.import_module(f"{pkg}.plan").plan_canary)
    assert callable(importlib.import_module(f"{pkg}.day_verdict").stopped_verdict)


def test_update_refuses_to_write_over_its_parent(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """"Refused with exit 2 and one line: ... `--out` equal to `TWIN`" (the page said `--update`, the
    old spelling's flag); and `update`'s bracketed defaults are the CLI's."""
    from edgetwin.cli import main

    assert "`--out` equal to `TWIN`" in FLAT
    twin = tmp_path / "twin"
    twin.mkdir()
    (twin / "MANIFEST.json").write_text("{}")
    for name in ("canary.parquet", "old.parquet"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(SystemExit) as done:
        main(["update", str(twin), str(tmp_path / "canary.parquet"), "--log", str(tmp_path / "old.parquet"), "--out", str(twin)])
    err = capsys.readouterr().err.strip().splitlines()
    assert done.value.code == 2 and len(err) == 1 and "--out" in err[0]
    assert sorted(p.name for p in twin.iterdir()) == ["MANIFEST.json"]
    line = next(ln for ln in DOC.splitlines() if ln.startswith("edgetwin update TWIN CANARY_LOG"))
    for flag, value in re.findall(r"\[(--[a-z-]+) (\d+)\]", line):
        assert _default(["update"], flag) == int(value), flag
    assert len(re.findall(r"\[(--[a-z-]+) (\d+)\]", line)) == 2


def test_a_status_cannot_make_a_short_log_a_whole_day() -> None:
    """The sites' status (`canary verdict --status`) is data from the operator's machine: saying
    "completed" over a log short of the plan's ticks leaves it a "short log" stop (the log's own tick
    count decides whether the day ran whole); naming the guard only turns the verdict into a refusal."""
    import pandas as pd

    from edgetwin.loop.evidence import canary_stop

    log = pd.DataFrame({"t": [0, 1, 2, 3, 4, 5, 6], "site": ["a"] * 7})  # 4 pre-ticks, then 3 of the plan's 8
    said = {"run": "r", "sites": {"a": {"candidate": "v2", "planned_ticks": 12, "stop_reason": "completed"}}}
    stop = canary_stop(log, 4, 8, said, "v2")
    assert stop.reason == "short log" and stop.short and stop.decides
    whole = pd.DataFrame({"t": list(range(12)), "site": ["a"] * 12})
    assert not canary_stop(whole, 4, 8, said, "v2").decides
    guard = {"sites": {"a": {**said["sites"]["a"], "stop_reason": "guard", "guard": {"stop": {"kpi": "kpi.late"}}}}}
    assert canary_stop(whole, 4, 8, guard, "v2").guard == ("kpi.late",)
