"""The overlap report: how much a log says about the effect of actions, and "nothing" said plainly."""

from __future__ import annotations

import numpy as np
import pytest

from edgetwin.contract.validate import load_valid_log
from edgetwin.emulator.cluster import ClusterConfig
from edgetwin.emulator.logs import Regime, generate_logs
from edgetwin.imitation.overlap import MarginalActionDensity, balancing_weights, overlap_report

CFG = ClusterConfig(n_agents=40, steps=24)


def report(regimes: list[Regime]):  # type: ignore[no-untyped-def]
    log, spec = generate_logs(CFG, regimes=regimes, seed=0)
    table, spec, _ = load_valid_log(log, spec)
    return overlap_report(table, spec, seed=0)


def test_one_deterministic_policy_says_nothing() -> None:
    o = report([Regime("heuristic", 3)])
    assert o.says_nothing and o.n_policies == 1 and o.propensity_known == 0.0
    assert "say NOTHING" in o.summary()


def test_noise_and_randomized_arms_say_more() -> None:
    noisy = report([Regime("heuristic", 3, noise=0.1)])
    assert noisy.verdict == "some" and noisy.propensity_known == 1.0
    assert all(0.1 < v < 0.7 for v in noisy.unexplained.values())
    trial = report([Regime("heuristic", 2, noise=0.1), Regime("heuristic", 1, noise=0.1, arms={"r": "random"}, arm_share=0.3)])
    assert trial.n_policies == 2 and trial.ess_share > noisy.ess_share
    assert np.mean(list(trial.unexplained.values())) > np.mean(list(noisy.unexplained.values()))
    uniform = report([Regime("random", 2)])
    assert uniform.ess_share > 0.9 and all(v > 0.95 for v in uniform.unexplained.values())
    assert report([Regime("heuristic", 3, noise=0.1)]).to_dict() == noisy.to_dict()  # deterministic


def test_weights_make_actions_independent_of_the_context() -> None:
    """A confounded policy (action = context + noise): weighted, the correlation is gone."""
    rng = np.random.default_rng(0)
    s = rng.uniform(-1, 1, 20_000)
    sd = 0.3
    a = s + sd * rng.standard_normal(len(s))
    prop = np.exp(-0.5 * ((a - s) / sd) ** 2) / (sd * np.sqrt(2 * np.pi))
    w = balancing_weights(s[:, None], a[:, None], np.array([-np.inf]), np.array([np.inf]), propensity=prop, clip=1e9).w
    raw = np.corrcoef(s, a)[0, 1]
    ws, wa = s - np.average(s, weights=w), a - np.average(a, weights=w)
    weighted = np.average(ws * wa, weights=w) / np.sqrt(np.average(ws**2, weights=w) * np.average(wa**2, weights=w))
    assert raw > 0.8 and abs(weighted) < 0.25
    # the marginal density integrates to 1 (mass on the bounds included)
    f = MarginalActionDensity.fit(np.clip(a, -1, 1)[:, None], np.array([-1.0]), np.array([1.0]))
    grid = np.linspace(-1, 1, 4001)[1:-1, None]
    assert f.mass_low[0] > 0 and f.mass_high[0] > 0
    assert f(grid).mean() * 2 + f.mass_low[0] + f.mass_high[0] == pytest.approx(1.0, abs=0.01)


def test_a_deterministic_policy_beside_a_random_one_is_not_nothing() -> None:
    o = report([Regime("heuristic", 2), Regime("random", 1)])
    assert o.n_policies == 2 and not o.says_nothing


def test_fit_and_fidelity_say_plainly_when_the_logs_say_nothing(tmp_path, capsys) -> None:  # type: ignore[no-untyped-def]
    """`edgetwin fit` prints the overlap report of its logs (and puts it in --json), and `edgetwin
    fidelity` repeats it: one deterministic heuristic's logs say NOTHING about the effect of actions."""
    import contextlib
    import json

    from edgetwin.cli import main
    from edgetwin.contract.logs import write_table

    log, spec = generate_logs(ClusterConfig(n_agents=12, steps=8), regimes=[Regime("heuristic", 2)], seed=0)
    path = tmp_path / "logs.parquet"
    write_table(log, path)
    spec.save(tmp_path / "logs.spec.toml")
    args = ["fit", str(path), "--out", str(tmp_path / "twin"), "--members", "1", "--rounds", "0", "--bc-epochs", "1",
            "--population-model", "empirical", "--workers", "1"]
    with contextlib.suppress(SystemExit):
        main(args)
    printed = capsys.readouterr().out
    assert "say NOTHING about the effect of actions" in printed
    with contextlib.suppress(SystemExit):
        main([*args, "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert doc["overlap"]["verdict"] == "none" and doc["response_model"] == "mail"
    with contextlib.suppress(SystemExit):
        main(["fidelity", str(tmp_path / "twin"), str(path), "--episodes", "1", "--horizon", "2"])
    assert "overlap of the twin's training logs" in capsys.readouterr().out
