"""`edgetwin train`'s selection: the trained policy scored beside simple candidates, best lower bound exported."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from edgetwin.cli import main
from edgetwin.emulator.cluster import ClusterConfig
from edgetwin.emulator.logs import generate_logs
from edgetwin.policies.candidates import (
    CandidateScore,
    ConstantPolicy,
    best_by_lower_bound,
    evidence_command,
    export_note,
    score_policies,
    select_export,
    simple_candidates,
)
from edgetwin.policies.export import export_policy, load_policy
from edgetwin.twin.twin import Twin

torch.set_num_threads(1)
CONFIG = ClusterConfig(n_agents=32, steps=12)


@pytest.fixture(scope="module")
def twin(tmp_path_factory: pytest.TempPathFactory) -> Twin:
    log, spec = generate_logs(CONFIG, episodes=3, policy="random", seed=5)
    tw = Twin.fit(log, spec, members=2, seed=0, progress=False, population_model="empirical", response_model="bc",
                  bc_epochs=5)  # fmt: skip
    tw.save(tmp_path_factory.mktemp("cand") / "twin")
    return tw


def test_simple_candidates_cover_the_action_box(twin: Twin) -> None:
    c = simple_candidates(twin)
    consts = [p for p in c.values() if isinstance(p, ConstantPolicy)]
    assert len(consts) == 1 + 2 ** len(twin.spec.action_columns)  # centre + the 25 %/75 % corners
    low, high = np.asarray(twin.action_low), np.asarray(twin.action_high)
    for p in consts:
        assert np.all(np.asarray(p.action) >= low) and np.all(np.asarray(p.action) <= high)
    assert "logging clone" in c


def test_select_exports_the_best_lower_bound_and_says_when_it_is_not_the_network(twin: Twin, tmp_path: Path) -> None:
    # a deliberately poor "trained" policy: nothing at the edge, no capacity, full price
    export_policy(ConstantPolicy(twin.spec, [0.0, 0.0, 1.0]), tmp_path / "pol", twin.spec)
    sel = select_export(twin, tmp_path / "pol", episodes=1, steps=8, n_agents=16)
    scores = {s.name: s for s in sel.scores}
    assert "trained network" in scores and len(scores) >= 10
    assert all(s.low <= s.mean <= s.high for s in sel.scores)
    exportable = [s for s in sel.scores if s.name != "logging clone"]
    assert sel.chosen == best_by_lower_bound(exportable).name
    if sel.replaced:  # the exported policy is the winner, the network is kept aside and the note says so
        assert "NOT the trained network" in sel.note and Path(sel.trained_path).is_dir()
        # the printed canary plan command names the kept network, and that path loads as a policy
        assert sel.evidence_command and sel.evidence_command in sel.note
        named = sel.evidence_command.split("--policy ")[1].split(" ")[0]
        assert Path(named) == Path(sel.trained_path)
        kept = load_policy(named)
        assert kept.act(np.zeros((2, len(twin.spec.observation_columns)))).shape[0] == 2
        exported = load_policy(tmp_path / "pol")
        obs = np.zeros((3, len(twin.spec.observation_columns)))
        winner = next(s for s in sel.scores if s.name == sel.chosen)
        assert winner.low > scores["trained network"].low
        assert np.allclose(exported.act(obs)[0], ConstantPolicy(twin.spec, eval_action(sel.chosen)).act(obs)[0])
    else:
        assert "exported the trained network" in sel.note


def _score(name: str, low: float, out: float, trained: bool = False) -> CandidateScore:
    return CandidateScore(name, low + 1.0, low, low + 2.0, out, trained)


@pytest.mark.parametrize("net_low, const_low", [(29.97, 26.43), (26.43, 29.97)])
def test_export_note_says_the_support_reason_first_and_compares_only_truly(net_low: float, const_low: float) -> None:
    # issue 46: the network was dropped for being 65 % off the logs' support; the note once led with
    # "26.43 beats 29.97". Both orderings of the bounds: the reason comes first, the comparison is true.
    net, const = _score("trained network", net_low, 0.65, trained=True), _score("constant(1)", const_low, 0.02)
    note = export_note(const, net, 0.25, "/p.trained")
    reason = note.index("65 % of the trained network's agent-steps are outside the logs' support, over the 25 % rule")
    assert note.startswith("exported 'constant(1)', NOT the trained network: ") and reason < 60
    assert "beats" not in note
    if const_low > net_low:
        assert f"({const_low:.4g}) is also above the trained network's ({net_low:.4g})" in note
    else:
        assert f"trained network's lower bound in the twin ({net_low:.4g}) is above that of 'constant(1)' ({const_low:.4g})" in note
        assert "is also above" not in note


def test_export_note_compares_when_the_comparison_is_the_reason() -> None:
    net, const = _score("trained network", 10.0, 0.1, trained=True), _score("constant(1)", 12.5, 0.1)
    note = export_note(const, net, 0.25, "/p.trained")
    assert "(12.5) beats the trained network's (10)" in note and "support" not in note
    assert export_note(net, net, 0.25, "/p").startswith("exported the trained network")


def test_evidence_command_quotes_paths_and_names_placeholders() -> None:
    cmd = evidence_command("/tw dir", "/p.trained", None)
    assert cmd.startswith("edgetwin canary plan '/tw dir' --policy /p.trained --log RECENT_LOG")
    assert evidence_command(None, "/p.trained", "/l.parquet").startswith("edgetwin canary plan TWIN ")


def eval_action(name: str) -> list[float]:
    return [float(x) for x in name[len("constant("):-1].split(",")]


def test_score_policies_is_deterministic(twin: Twin) -> None:
    pols = {"a": ConstantPolicy(twin.spec, [0.5, 1.0, 0.5]), "b": ConstantPolicy(twin.spec, [1.0, 2.0, 0.0])}
    one = score_policies(twin, pols, episodes=1, steps=6, n_agents=8, seed=3)
    two = score_policies(twin, pols, episodes=1, steps=6, n_agents=8, seed=3)
    assert [s.to_dict() for s in one] == [s.to_dict() for s in two]


def test_cli_train_reports_candidates_with_intervals(twin: Twin, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "tw"
    twin.save(d)
    with pytest.raises(SystemExit) as e:
        main(["train", str(d), "--out", str(tmp_path / "p"), "--steps", "256", "--agents", "8", "--episode-steps", "6",
              "--checkpoint-every", "0", "--json"])  # fmt: skip
    assert e.value.code == 0
    doc = json.loads(capsys.readouterr().out)
    sel = doc["selection"]
    assert sel["chosen"] in {s["name"] for s in sel["scores"]}
    assert all(len({"low", "high", "mean"} & set(s)) == 3 for s in sel["scores"])
    assert (tmp_path / "p").is_dir()
