"""README claims a user acts on, checked against the code that keeps them.

Each test reads the number the README states (so a changed sentence fails too) and checks it against
the behaviour or the default of the code: the gate's out-of-support share and level, its refusal to
run with nothing to guard, the demo's directory.
"""

from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
import typer.main
from test_docs_commands import cli_tree

from edgetwin.cli import app
from edgetwin.contract.errors import InputError
from edgetwin.policies.gate_checks import MAX_OUT_OF_SUPPORT, check_verdict, resolve_guards
from edgetwin.twin.intervals import LEVEL
from edgetwin.twin.whatif.kpis import KpiDef

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
FLAT = re.sub(r"\s+", " ", README)


def _option(path: list[str], flag: str) -> click.Parameter:
    cmd = typer.main.get_command(app)
    for word in path:
        cmd = cmd.commands[word]  # type: ignore[attr-defined]
    return next(p for p in cmd.params if flag in p.opts)


def test_the_gate_abstains_beyond_the_readmes_out_of_support_share() -> None:
    """README "Trust": abstain when more than `--max-out-of-support` (25 %) of the agent-steps lie
    outside the logs' support — the flag's default, the library's, and the verdict at either side."""
    stated = float(re.search(r"more than `--max-out-of-support` \((\d+) %\)", FLAT).group(1)) / 100  # type: ignore[union-attr]
    assert _option(["promote"], "--max-out-of-support").default == pytest.approx(stated)
    assert pytest.approx(stated) == MAX_OUT_OF_SUPPORT
    inside = (-0.01, 0.01)  # an interval well within a 5 % margin
    assert check_verdict(inside, 0.05, stated + 0.01, MAX_OUT_OF_SUPPORT) == "unsupported"
    assert check_verdict(inside, 0.05, stated - 0.01, MAX_OUT_OF_SUPPORT) == "ok"


def test_the_gate_asks_the_readmes_level_by_default() -> None:
    """README: every number carries a 90 % interval; `promote --level` asks 90 % unless told."""
    assert "carries a 90 % interval" in FLAT
    assert pytest.approx(0.90) == LEVEL
    assert _option(["promote"], "--level").default == "90%"


def test_the_gate_refuses_to_run_with_no_guarded_kpi() -> None:
    """README: "it refuses to run with no guarded KPI (exit 2)": an InputError (exit 2) naming the flag,
    while one KPI with a direction is guarded at the default margin."""
    assert "it refuses to run with no guarded KPI (exit 2)" in FLAT
    undirected = [KpiDef("kpi.a", "kpi.a"), KpiDef("kpi.b", "kpi.b")]
    with pytest.raises(InputError) as err:
        resolve_guards(undirected, None)
    assert err.value.exit_code == 2 and "--max-regression" in str(err.value)
    guarded = resolve_guards([*undirected, KpiDef("kpi.c", "kpi.c", better="lower")], None)
    assert [g.kpi for g, _ in guarded] == ["kpi.c"]


def test_the_demo_writes_where_the_readme_says_by_default() -> None:
    """README: `edgetwin demo` runs in one directory (`edgetwin-demo/` by default)."""
    import inspect

    from edgetwin.demo import run_demo

    stated = re.search(r"in one directory \(`([^`/]+)/` by default\)", FLAT).group(1)  # type: ignore[union-attr]
    assert Path(_option(["demo"], "--out").default) == Path(stated)
    assert Path(inspect.signature(run_demo).parameters["out_dir"].default) == Path(stated)


def test_exit_codes_and_one_line_errors_are_the_readmes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """README: "exit codes 0 (ok) / 1 (failed, e.g. a gate refused) / 2 (bad input ...) / 3 (the gate
    abstained). Errors are one line, printed literally ... Set `EDGETWIN_DEBUG=1` for tracebacks."."""
    from edgetwin.cli import main
    from edgetwin.cli.entry import describe_error, exit_code_of
    from edgetwin.contract.errors import GateAbstained, GateRefused

    assert "exit codes 0 (ok) / 1 (failed, e.g. a gate refused) / 2 (bad input" in FLAT and "/ 3 (the gate abstained)" in FLAT
    assert "Set `EDGETWIN_DEBUG=1` for tracebacks." in FLAT
    assert exit_code_of(GateRefused("kpi.x regressed")) == 1 and describe_error(GateRefused("x")).startswith("refused:")
    assert exit_code_of(GateAbstained("straddles")) == 3 and describe_error(GateAbstained("x")).startswith("abstained:")
    assert exit_code_of(RuntimeError("bug")) == 1
    assert exit_code_of(InputError("no such column", "log.csv")) == 2

    missing = str(tmp_path / "[red]no[such].csv")
    for debug in ("0", "1"):
        monkeypatch.setenv("EDGETWIN_DEBUG", debug)
        with pytest.raises(SystemExit) as done:
            main(["logs", "validate", missing])
        out, err = capsys.readouterr()
        printed = (out + err).strip().splitlines()
        assert done.value.code == 2
        assert any(missing in ln and ln.startswith("error:") for ln in printed)  # brackets kept literally
        assert ("Traceback (most recent call last):" in err) == (debug == "1")
        if debug == "0":
            assert len(printed) == 1


SAMPLING = ["demo", "fit", "fit-federated", "update", "fidelity", "train", "evaluate", "whatif", "promote", "federate",
            "logs generate", "population fit", "population report", "canary plan", "canary verdict"]  # fmt: skip


@pytest.mark.parametrize("command", SAMPLING)
def test_a_command_that_samples_takes_a_seed_and_json(command: str) -> None:
    """README: "Every command has `--help`, a `--seed` where it samples, `--json` where a script reads
    the result": the commands that draw worlds, noise, bootstraps or networks."""
    assert "a `--seed` where it samples, `--json` where a script reads the result" in FLAT
    cmd = cli_tree()  # the CLI's click tree, built once per process (tests/test_docs_commands.py)
    for word in command.split():
        cmd = cmd.commands[word]  # type: ignore[attr-defined]
    opts = {o for p in cmd.params for o in p.opts}
    assert "--seed" in opts and "--json" in opts, command


def test_the_twin_coordinators_seed_reaches_the_fit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`edgetwin agent twin-coordinator` samples (bootstraps, initial weights, GAN noise: the sites draw from
    its plan's seed); it had no `--seed` (always 0). The flag's value is the fit's `FitOptions.seed`."""
    from types import SimpleNamespace

    import edgetwin.federation.twin.runner as runner
    from edgetwin.cli import main

    seen: dict[str, object] = {}

    async def coordinator(spec: object, names: list[str], bus: str, fit_id: str, options: object, **kw: object) -> object:
        seen["options"], seen["sites"] = options, names
        return SimpleNamespace(save=lambda out: Path(out).mkdir(exist_ok=True)), SimpleNamespace(bytes_up=0, bytes_down=0, rounds=[])

    monkeypatch.setattr(runner, "run_twin_coordinator", coordinator)
    (tmp_path / "spec.toml").write_text('[[features]]\nname = "action.a"\n')
    with pytest.raises(SystemExit) as done:
        main(["agent", "twin-coordinator", "--bus", "memory", "--spec", str(tmp_path / "spec.toml"), "--sites", "a,b",
              "--out", str(tmp_path / "tw"), "--seed", "7"])  # fmt: skip
    assert done.value.code == 0 and seen["sites"] == ["a", "b"]
    assert seen["options"].seed == 7  # type: ignore[attr-defined]
    agent = typer.main.get_command(app).commands["agent"]  # type: ignore[attr-defined]
    assert any("--seed" in p.opts for p in agent.params)  # it prints one JSON line per event: no --json to ask
