"""`Twin.update` / ``edgetwin fit --update``: a twin learns from a canary's rows without a refit.
The result is a sealed twin that names its parent; the same seed gives the same twin; a log under
another spec, the wrong old log, or rows the twin already holds are refused with exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from edgetwin.contract.errors import InputError
from edgetwin.contract.manifest import MANIFEST_FILE, verify_manifest
from edgetwin.contract.spec import TwinSpec
from edgetwin.edge.canary import CanaryConfig
from edgetwin.edge.canary_slice import CanarySlice
from edgetwin.edge.kpi_watch import KPIMargin
from edgetwin.emulator.cluster import ClusterConfig
from edgetwin.emulator.logs import SLOAwarePolicy, generate_logs
from edgetwin.loop.fleet import canary_on_cluster
from edgetwin.twin.twin import Twin
from edgetwin.twin.update import manifest_sha256

torch.set_num_threads(1)
CLUSTER = ClusterConfig(n_agents=12, steps=16)


class Constant:
    def __init__(self, spec, action: list[float]) -> None:  # type: ignore[no-untyped-def]
        self.spec = spec
        self.action = np.asarray(action, dtype=np.float64)

    def act(self, obs: np.ndarray) -> np.ndarray:
        return np.tile(self.action, (len(obs), 1))


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("update")
    log, spec = generate_logs(CLUSTER, 2, "heuristic", seed=0)
    log.to_parquet(root / "old.parquet")
    spec.save(root / "old.spec.toml")
    twin = Twin.fit(log, spec, seed=0, members=2, progress=False, rounds=0, bc_epochs=2,
                    population_model="empirical")  # fmt: skip
    twin.save(root / "twin")
    config = CanaryConfig("cand", CanarySlice(sites=("edge-ams", "edge-fra"), seed=0), 2.0,
                          (KPIMargin("kpi.slo_violation", max_regression=0.5),))  # fmt: skip
    r = canary_on_cluster(CLUSTER, SLOAwarePolicy(spec), Constant(spec, [1.0, 0.3, 0.2]), config, seed=9, episode=100)
    r.log.to_parquet(root / "canary.parquet")
    return {"root": root, "twin": root / "twin", "old": root / "old.parquet", "new": root / "canary.parquet"}


def fit_update(world: dict[str, Path], out: Path, *extra: str) -> int:
    from edgetwin.cli import main

    with pytest.raises(SystemExit) as ex:
        main(["fit", "--update", str(world["twin"]), str(world["new"]), "--out", str(out), "--log", str(world["old"]),
              "--update-epochs", "2", "--update-steps", "50", "--json", *extra])  # fmt: skip
    return int(ex.value.code or 0)


def test_fit_update_gives_a_sealed_twin_naming_its_parent(world: dict[str, Path], tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    assert fit_update(world, tmp_path / "tw2", "--seed", "3") == 0
    summary = json.loads(capsys.readouterr().out)
    child = tmp_path / "tw2"
    verify_manifest(child, "twin")  # sealed: every file listed and intact
    meta = json.loads((child / "meta.json").read_text())
    parent = Twin.load(world["twin"])
    assert meta["parent"]["manifest_sha256"] == manifest_sha256(world["twin"]) == summary["parent"]["manifest_sha256"]
    assert meta["parent"]["data_sha256"] == parent.meta["data_sha256"]
    new_rows = len(pd.read_parquet(world["new"]))
    assert meta["update"]["new_rows"] == new_rows and meta["n_rows"] == parent.meta["n_rows"] + new_rows
    assert meta["data_parts"] == [parent.meta["data_sha256"], meta["update"]["new_data_sha256"]]
    t2 = Twin.load(child)
    # the response models moved (fine-tuned), the logging policy's clones did not
    p0, c0 = parent.members[0], t2.members[0]
    moved = [not torch.equal(a, b) for a, b in zip(p0.clients[0].parameters(), c0.clients[0].parameters(), strict=True)]
    assert any(moved)
    for a, b in zip(p0.engines[0].parameters(), c0.engines[0].parameters(), strict=True):
        assert torch.equal(a, b)
    # the canary's steps are in the new support bank
    assert t2.support.bank.shape[0] >= parent.support.bank.shape[0]
    # same seed, same twin: every file's digest equal (the update's timing aside, in meta.json)
    assert fit_update(world, tmp_path / "tw3", "--seed", "3") == 0
    m2 = json.loads((child / MANIFEST_FILE).read_text())["files"]
    m3 = json.loads((tmp_path / "tw3" / MANIFEST_FILE).read_text())["files"]
    differ = sorted(f for f in m2 if m2[f] != m3.get(f))
    assert differ == ["meta.json"], differ
    # an updated twin is updated again with both of its parts
    assert fit_update(world | {"twin": child}, tmp_path / "tw4") == 2  # one --log: it needs two
    assert "2 log part(s)" in capsys.readouterr().err


def test_update_refuses_other_specs_other_logs_and_known_rows(world: dict[str, Path], tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    # a canary log under another spec (written beside it)
    other = tmp_path / "other.parquet"
    pd.read_parquet(world["new"]).to_parquet(other)
    spec = Twin.load(world["twin"]).spec
    d = spec.to_dict()
    d["name"] = "another-system"
    type(spec).from_dict(d).save(tmp_path / "other.spec.toml")
    assert fit_update(world | {"new": other}, tmp_path / "x1") == 2
    assert "another spec" in capsys.readouterr().err
    # the old log is not the twin's data
    wrong = tmp_path / "wrong.parquet"
    generate_logs(CLUSTER, 1, "random", seed=5)[0].to_parquet(wrong)
    assert fit_update(world | {"old": wrong}, tmp_path / "x2") == 2
    assert "not the twin's training data" in capsys.readouterr().err
    # rows the twin already holds are not new evidence
    assert fit_update(world | {"new": world["old"]}, tmp_path / "x3") == 2
    assert "already part of the twin's data" in capsys.readouterr().err
    # --update without the old log
    from edgetwin.cli import main

    with pytest.raises(SystemExit) as ex:
        main(["fit", "--update", str(world["twin"]), str(world["new"]), "--out", str(tmp_path / "x4")])
    assert ex.value.code == 2 and "--log" in capsys.readouterr().err
    # the Python API says the same
    with pytest.raises(InputError, match="not usable"):  # the spec names its scenarios
        Twin.load(world["twin"]).update(
            pd.read_parquet(world["new"]).assign(scenario="xr"), [pd.read_parquet(world["old"])]
        )


def test_a_causal_twin_learns_the_canarys_arms_as_policies(world: dict[str, Path]) -> None:
    """A causal twin's update refits its response model with the rows' ``policy`` ids: the canary's
    two arms make the invariance weight a choice again (cross-fitted: its held-out errors exist),
    where a plain regression on the same rows would have dropped them; the twin's overlap report
    is the union's (it names the canary's arms)."""
    from edgetwin.imitation.causal import CausalResponseModel

    log = pd.read_parquet(world["old"])
    spec = TwinSpec.load(world["root"] / "old.spec.toml")
    parent = Twin.fit(log, spec, seed=0, members=1, progress=False, response_model="causal",
                      population_model="empirical")  # fmt: skip
    assert all(not c.cv_errors for c in parent.members[0].clients.values())  # one policy: nothing to choose
    child = parent.update(pd.read_parquet(world["new"]), [log], seed=1)
    clients = child.members[0].clients.values()
    assert all(isinstance(c, CausalResponseModel) for c in clients)
    assert all(c.cv_errors for c in clients), "the update ignored the new rows' policy ids"
    assert {"cand"} <= set(child.meta["overlap"]["policies"])
    assert child.meta["parent"]["data_sha256"] == parent.meta["data_sha256"]
