"""Issue 48 (the demo's time): the what-if report's PNGs shared by the demo's two processes
(`edgetwin.demo._Drawing`: the spare core draws from the first, this process from the last, each
PNG claimed once) give the report `_whatif` writes in one process, byte for byte, and every cell is
still run once, before the report (none again while it is written)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest
import torch

from edgetwin import demo
from edgetwin.emulator.cluster import ClusterConfig
from edgetwin.emulator.logs import generate_logs
from edgetwin.twin import report
from edgetwin.twin.twin import Twin
from edgetwin.twin.whatif import run as whatif_run

torch.set_num_threads(1)
EPISODES = 1


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> tuple[Twin, Path, pd.DataFrame, Path]:
    """A small twin (saved, as the spare core reads it), the recent log and a trained policy."""
    from edgetwin.policies.train import train_policy

    root = tmp_path_factory.mktemp("demo14")
    config = ClusterConfig(n_agents=10, steps=96)  # a day: every shipped scenario's window fits
    log, spec = generate_logs(config, episodes=2, policy="random", seed=0)
    twin = Twin.fit(log, spec, members=2, seed=0, progress=False, population_model="empirical", response_model="bc",
                    bc_epochs=2)  # fmt: skip
    twin_dir = Path(twin.save(root / "twin"))
    policy = train_policy(twin, algo="ppo", steps=256, seed=0, out=root / "policy", progress=False)
    recent, _ = generate_logs(config, episodes=EPISODES, policy="random", seed=10_000)
    return Twin.load(twin_dir), twin_dir, recent, Path(policy.path)


def _files(d: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def _split_report(saved: Any, out: Path, monkeypatch: pytest.MonkeyPatch) -> demo._Drawing:
    """The demo's own calls on a real spare core: the logging policy's cells ahead, the trained
    policy's, then `_Drawing`, finished here after this process's cells of the last scenarios."""
    twin, twin_dir, recent, policy_dir = saved
    spare = demo._SpareCore()
    try:
        args = (twin_dir, recent, policy_dir, out, 7, EPISODES)
        spare.submit(demo._whatif_ahead_task, twin_dir, recent, 7, EPISODES)
        spare.submit(demo._whatif_trained_task, *args)
        drawing = demo._Drawing(spare, args)
        mine, _, _ = demo._whatif_main_cells(twin, recent, 7, EPISODES)
        # every cell ran before the report: writing it here runs no episode again
        ran: list[Any] = []
        real = whatif_run.run_episode
        monkeypatch.setattr(whatif_run, "run_episode", lambda *a, **k: ran.append(a) or real(*a, **k))
        path, _, _ = drawing.finish(twin, mine)
        monkeypatch.undo()
        assert ran == [] and Path(path) == out / "report.html"
        claims = sorted(p.name for p in Path(drawing.claim_dir).iterdir())
        drawing.close()
        assert not Path(drawing.claim_dir).exists()
        assert len(claims) == len(drawing.drawn)
    finally:
        spare.close()
    return drawing


@pytest.mark.slow  # ~70 s (a real spare process): the default run's 10-minute budget; the demo's shared report stays in it
# through the demo itself: tests/test_demo.py::test_demo_runs_every_stage_and_reports_where_things_went
def test_the_shared_report_is_the_one_written_in_one_process(
    saved: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    twin, _, recent, policy_dir = saved
    demo._whatif(twin, recent, policy_dir, tmp_path / "one", 7, EPISODES, progress=False)
    drawing = _split_report(saved, tmp_path / "two", monkeypatch)
    one, two = _files(tmp_path / "one"), _files(tmp_path / "two")
    assert one.keys() == two.keys() and len([n for n in one if n.endswith(".png")]) == len(demo._whatif_scenarios()) + 2
    for name in one:
        assert one[name] == two[name], name
    # each PNG drawn once, by one of the two processes; the spare core cannot draw the changes
    # (it lacks the last scenario's logging-policy cells) nor that scenario's timeline
    units = report.report_units(demo._whatif_result(twin, recent, policy_dir, 7, EPISODES))
    assert sorted(drawing.drawn) == sorted(units)
    last = demo._whatif_scenario_split()[1]
    assert drawing.drawn["changes"] == "here" and all(drawing.drawn[f"timeline:{s.name}"] == "here" for s in last)


@pytest.mark.slow  # ~22 s quiet (a what-if and its pictures): the default run's 10-minute budget; both processes drawing
# the report's pictures stay in it through the demo itself: tests/test_demo.py::test_demo_runs_every_stage_and_reports_where_things_went
def test_plot_some_draws_only_what_it_claims(saved: Any, tmp_path: Path) -> None:
    twin, _, recent, policy_dir = saved
    result = demo._whatif_result(twin, recent, policy_dir, 7, EPISODES)
    units = report.report_units(result)
    claim_a, claim_b = demo._claimer(str(tmp_path)), demo._claimer(str(tmp_path))
    first = report.plot_some(result, tmp_path / "out", units[:3], claim=claim_a)
    rest = report.plot_some(result, tmp_path / "out", units, claim=claim_b)
    assert list(first) == units[:3] and list(rest) == units[3:]
    assert not claim_a(units[0]) and not claim_b(units[-1])  # a claim is given once
    with pytest.raises(ValueError, match="unknown report image"):
        report.plot_some(result, tmp_path / "out", ["legend"])
