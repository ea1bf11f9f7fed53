"""Declared dynamics and site scope (`edgetwin.contract.dynamics`): the spec, validation, the twin.

The toy system: each site has a number of vCPUs (a site constant); each agent places a share
(the action) of its demand on its site; the site's backlog is a fluid queue of that load. The
training logs never overload a site (each agent's share is drawn at random in [0, 1], so a site
carries half its agents' demand on average); a twin with the queue declared must still show the
backlog growing under a policy that places every agent's whole demand on the site at once: each
agent's action is one the logs have seen, the site's total is not.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from edgetwin.contract.dynamics import agreement
from edgetwin.contract.errors import InputError
from edgetwin.contract.policy import FunctionPolicy
from edgetwin.contract.spec import TwinSpec
from edgetwin.contract.validate import validate_log
from edgetwin.twin.twin import Twin


@pytest.fixture(autouse=True)
def _allow_spec_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """The specs here name functions of these modules: allowed, as a user would (docs/log-format.md)."""
    monkeypatch.setenv("EDGETWIN_ALLOW_CODE", "toy_accounting,toy_bad,edgetwin.nowhere")

STEP_S = 60.0
QUEUE = {"arrivals": "sum(kpi.site_cpu) / profile.vcpu", "service": "1"}


def toy_spec(declared: bool = True) -> TwinSpec:
    scope = {"scope": "site"} if declared else {}
    d: dict = {
        "name": "toy-queue",
        "step_seconds": STEP_S,
        "features": [
            {"name": "profile.demand", "kind": "heavy_tailed", "low": 0.0},
            {"name": "profile.vcpu", "low": 1.0, **scope},
            {"name": "state.backlog_s", "low": 0.0, "high": 10_000.0, **scope},
            {"name": "action.share", "low": 0.0, "high": 1.0},
            {"name": "kpi.site_cpu", "kind": "heavy_tailed", "low": 0.0},
        ],
        "reward": {"weights": {"kpi.site_cpu": 1.0}},
    }
    if declared:
        d["dynamics"] = [{"column": "state.backlog_s", "queue": QUEUE}]
    return TwinSpec.from_dict(d, "toy.spec.toml")


def toy_log(episodes: int = 4, agents_per_site: int = 20, steps: int = 20, seed: int = 0) -> pd.DataFrame:
    """Two sites of 20 agents (demand ~1 vCPU each) with 16 and 17 vCPUs; random shares in [0, 1]
    put ~10 vCPU of load on a site (4 standard deviations below its capacity)."""
    rng = np.random.default_rng(seed)
    rows = []
    for e in range(episodes):
        demand = rng.uniform(0.5, 1.5, size=2 * agents_per_site)
        site = np.repeat([0, 1], agents_per_site)
        vcpu = np.array([16.0, 17.0])
        backlog = np.zeros(2)
        for t in range(steps):
            share = rng.uniform(0.0, 1.0, size=len(demand))
            cpu = demand * share * np.exp(rng.normal(0.0, 0.05, len(demand)))
            for i in range(len(demand)):
                rows.append({"episode": f"e{e}", "t": t, "agent": f"e{e}-a{i}", "scenario": "web",
                             "site": f"edge-{'ab'[site[i]]}", "profile.demand": demand[i],
                             "profile.vcpu": vcpu[site[i]], "state.backlog_s": backlog[site[i]],
                             "action.share": share[i], "kpi.site_cpu": cpu[i]})
            load = np.bincount(site, cpu, 2) / vcpu
            backlog = np.clip(backlog + (load - 1.0) * STEP_S, 0.0, 10_000.0)
    return pd.DataFrame(rows)


def test_declarations_reproduce_the_log_they_describe() -> None:
    log = toy_log(episodes=2)
    res = agreement(log, toy_spec().declared_dynamics())  # type: ignore[arg-type]
    n, bad, _ = res["state.backlog_s"]
    assert n > 0 and bad == 0
    # a wrong declaration (service 0.05 instead of 1) disagrees on the transitions where it matters
    wrong = toy_spec().to_dict()
    wrong["dynamics"] = [{"column": "state.backlog_s", "queue": {**QUEUE, "service": "0.05"}}]
    n, bad, _ = agreement(log, TwinSpec.from_dict(wrong).declared_dynamics())["state.backlog_s"]  # type: ignore[arg-type]
    assert bad > 0.5 * n


def test_validation_reports_a_declaration_that_disagrees_and_a_site_column_that_is_not(tmp_path: Path) -> None:
    log = toy_log(episodes=2)
    spec = toy_spec()
    assert validate_log(log, spec).find("dynamics_disagree") == []
    wrong = spec.to_dict()
    wrong["dynamics"] = [{"column": "state.backlog_s", "queue": {**QUEUE, "service": "0.05"}}]
    rep = validate_log(log, TwinSpec.from_dict(wrong))
    assert rep.usable and rep.find("dynamics_disagree", "state.backlog_s")
    broken = log.copy()
    broken.loc[3, "profile.vcpu"] = 7.0  # one agent of edge-a disagrees about its site's vCPUs
    rep = validate_log(broken, spec)
    assert not rep.usable
    (p,) = rep.find("site_scope_differs", "profile.vcpu")
    assert p.rows[0] == 0 and 3 in p.rows  # the whole (episode, site, t) group is named


@pytest.mark.parametrize(
    "entry, match",
    [
        ({"column": "state.backlog_s", "next": "kpi.site_cpu * 2"}, r"vary between the agents of a site"),
        ({"column": "state.backlog_s", "next": "sum(kpi.nothing)"}, r"unknown name\(s\) \['kpi.nothing'\]"),
        ({"column": "state.backlog_s", "next": "sum(sum(kpi.site_cpu))"}, r"aggregate inside an aggregate"),
        ({"column": "state.backlog_s", "function": "edgetwin.nowhere:fn"}, r"cannot be imported"),
        ({"column": "state.backlog_s", "function": "toy_bad:wrong_shape"}, r"returned shape \(3, 2\) for 3 agents"),
        ({"column": "state.nope", "next": "1"}, r"not a state feature"),
        ({"column": "state.backlog_s", "queue": {"arrivals": "1"}}, r"needs 'arrivals' and 'service'"),
        ({"column": "state.backlog_s", "next": "1", "queue": QUEUE}, r"exactly one of"),
        ({"column": "state.backlog_s", "next": "__import__('os').system('true')"}, r"cannot read expression"),
    ],
)
def test_bad_declarations_name_the_spec_file_and_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, entry: dict, match: str
) -> None:
    (tmp_path / "toy_bad.py").write_text("import numpy as np\ndef wrong_shape(columns, site):\n    return np.zeros((len(site), 2))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    d = toy_spec().to_dict()
    d["dynamics"] = [entry]
    path = tmp_path / "toy.spec.toml"
    import tomli_w

    path.write_text(tomli_w.dumps(d))
    with pytest.raises(InputError, match=match) as e:
        TwinSpec.load(path)
    assert str(e.value).startswith(f"{path}: [[dynamics]] entry 1")


def test_a_declared_function_is_called_with_the_tick(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = tmp_path / "toy_accounting.py"
    mod.write_text(
        "import numpy as np\n"
        "def next_backlog(columns, site):\n"
        "    load = np.bincount(site, columns['kpi.site_cpu'])[site] / columns['profile.vcpu']\n"
        "    return np.maximum(columns['state.backlog_s'] + (load - 1.0) * 60.0, 0.0)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    d = toy_spec().to_dict()
    d["dynamics"] = [{"column": "state.backlog_s", "function": "toy_accounting:next_backlog"}]
    spec = TwinSpec.from_dict(d)
    n, bad, _ = agreement(toy_log(episodes=1), spec.declared_dynamics())["state.backlog_s"]  # type: ignore[arg-type]
    assert n > 0 and bad == 0


def test_the_twin_extrapolates_a_declared_queue_the_logs_never_filled() -> None:
    log = toy_log()
    assert log["state.backlog_s"].max() == 0.0  # the logs never overloaded a site
    overload = FunctionPolicy(lambda obs: np.ones((len(obs), 1)), "everything on the site")
    gentle = FunctionPolicy(lambda obs: np.full((len(obs), 1), 0.1), "a tenth on the site")
    kw = dict(members=1, seed=0, progress=False, population_model="empirical", response_model="bc", bc_epochs=20)
    declared = Twin.fit(log, toy_spec(), **kw)
    learned = Twin.fit(log, toy_spec(declared=False), **kw)

    def backlog(twin: Twin, policy: FunctionPolicy) -> pd.DataFrame:
        df = twin.rollout(policy, episodes=2, seed=1, n_agents=40, steps=20)
        return df.groupby("t")["state.backlog_s"].mean()

    grown = backlog(declared, overload)
    # 20 agents of demand ~1 on a 16-17 vCPU site: load ~1.2x capacity, ~12 s more backlog a minute
    assert grown.iloc[-1] > 2 * STEP_S
    assert np.all(np.diff(grown.to_numpy()[1:]) > 0)  # it grows every tick
    assert backlog(declared, gentle).max() == 0.0  # and stays empty where the site keeps up
    # a site keeps its logged name and constants in a generated world
    sim = declared.simulation(n_agents=40, seed=2)
    names = [n.split("#")[0] for n in sim.site_names]
    assert set(names) <= {"edge-a", "edge-b"}
    vcpu = sim.world.profile[:, declared.layout.profile.index("profile.vcpu")]
    for k, name in enumerate(names):
        assert np.all(vcpu[sim.world.site == k] == {"edge-a": 16.0, "edge-b": 17.0}[name])
    # the twin that learned the backlog has never seen one, and does not produce one
    assert backlog(learned, overload).iloc[-1] < 0.1 * grown.iloc[-1]
