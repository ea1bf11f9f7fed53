"""Issue 46: commands a person can hold. ``fit`` is split into ``fit``, ``fit-federated`` and
``update`` (the old spellings ``fit --federated`` / ``fit --update TWIN`` still work), and the
rarely set knobs of ``whatif`` and ``serve`` live in a ``--config`` TOML (`WhatifConfig`,
`ServeConfig`). These tests check the rewrite, that a config's keys reach the run, and that a bad
config is one line naming the file, exit 2."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from edgetwin.cli import app
from edgetwin.cli.common import legacy_fit_args
from edgetwin.cli.entry import exit_code_of


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (["fit", "--update", "T", "NEW", "--out", "o", "--log", "OLD"], ["update", "T", "NEW", "--out", "o", "--log", "OLD"]),
        (["fit", "NEW", "--update", "T", "--log", "OLD"], ["update", "T", "NEW", "--log", "OLD"]),
        (["fit", "NEW", "--update=T", "--out", "o"], ["update", "T", "NEW", "--out", "o"]),
        (["fit", "L", "--out", "o", "--federated", "--light"], ["fit-federated", "L", "--out", "o", "--light"]),
        (["fit", "L", "--out", "o"], ["fit", "L", "--out", "o"]),
        (["whatif", "--update", "x"], ["whatif", "--update", "x"]),
    ],
)
def test_the_old_fit_spellings_become_the_split_commands(old: list[str], new: list[str]) -> None:
    assert legacy_fit_args(old) == new


def test_fit_update_spelling_reaches_the_update_command(tmp_path: Path) -> None:
    """``fit LOG --update TWIN`` without ``--log`` is refused by `update`'s own check (exit 2)."""
    (tmp_path / "new.parquet").write_bytes(b"")
    res = CliRunner().invoke(app, ["fit", str(tmp_path / "new.parquet"), "--update", str(tmp_path / "twin"),
                                   "--out", str(tmp_path / "out")])
    assert exit_code_of(res.exception) == 2, res.output
    assert "updating a twin needs the twin's training log (--log OLD)" in str(res.exception)


def _whatif(tmp_path: Path, config: str | None, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Run ``edgetwin whatif`` with the twin, policies and replay stubbed: what reaches them."""
    import edgetwin.cli.policy as cli_policy
    import edgetwin.policies.gate as gate
    import edgetwin.twin.report as report
    import edgetwin.twin.whatif as whatif

    seen: dict[str, Any] = {}

    class Stop(Exception):
        pass

    def fake_resolve(ref: str, twin: Any, view: Any = None, name: str | None = None) -> Any:
        seen["view"] = view
        return whatif.PolicySpec(ref, None)

    def fake_run(*args: Any, **kw: Any) -> Any:
        seen.update(kw)
        raise Stop

    monkeypatch.setattr(cli_policy, "_whatif_inputs", lambda *a: (object(), [], [], None))
    monkeypatch.setattr(gate, "resolve_policy", fake_resolve)
    monkeypatch.setattr(whatif, "run_whatif", fake_run)
    monkeypatch.setattr(report, "write_report", lambda *a, **k: {})
    args = ["whatif", str(tmp_path), "--policy", "random", "--out", str(tmp_path / "w")]
    if config is not None:
        (tmp_path / "whatif.toml").write_text(config)
        args += ["--config", str(tmp_path / "whatif.toml")]
    res = CliRunner().invoke(app, args)
    seen["exception"] = res.exception
    return seen


def test_whatif_config_keys_reach_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    default = _whatif(tmp_path, None, monkeypatch)
    assert default["stochastic"] is True and default["oos_tolerance"] == 0.05 and default["view"] is None
    got = _whatif(tmp_path, 'deterministic = true\noos_tolerance = 0.2\nview = "v.toml"\n', monkeypatch)
    assert got["stochastic"] is False and got["oos_tolerance"] == 0.2 and got["view"] == "v.toml"


@pytest.mark.parametrize(
    ("text", "words"),
    [("oos_tolerance = 2.0", "between 0 and 1"), ("deterministc = true", "unknown key"), ("deterministic = 1", "true or false")],
)
def test_a_bad_whatif_config_is_one_line_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, words: str) -> None:
    got = _whatif(tmp_path, text, monkeypatch)
    assert exit_code_of(got["exception"]) == 2 and "stochastic" not in got
    assert words in str(got["exception"]) and "--config" in getattr(got["exception"], "where", "")


def test_serve_config_loads_and_refuses_unknown_keys(tmp_path: Path) -> None:
    from edgetwin.cli.edge import ServeConfig
    from edgetwin.contract.errors import InputError

    (tmp_path / "s.toml").write_text('cluster = "eu"\nprobation = 7\nbaseline = "previous"\n')
    assert ServeConfig.load(tmp_path / "s.toml") == ServeConfig("eu", 7, "previous")
    assert ServeConfig.load(None) == ServeConfig(None, 100, "auto")
    (tmp_path / "bad.toml").write_text("probaton = 7\n")
    with pytest.raises(InputError, match="unknown key"):
        ServeConfig.load(tmp_path / "bad.toml")
    (tmp_path / "neg.toml").write_text("probation = -1\n")
    with pytest.raises(InputError, match="probation"):
        ServeConfig.load(tmp_path / "neg.toml")


def test_serve_refuses_a_bad_config_before_starting(tmp_path: Path) -> None:
    (tmp_path / "s.toml").write_text('cluster = "not a name!"\n')
    res = CliRunner().invoke(app, ["serve", "--site", "s1", "--registry", str(tmp_path / "reg"), "--trust",
                                   str(tmp_path), "--config", str(tmp_path / "s.toml")])
    assert exit_code_of(res.exception) == 2 and "--config cluster" in getattr(res.exception, "where", ""), res.output
