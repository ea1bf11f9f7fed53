"""Resealed artifacts that try to exhaust the reader (issue 45, items 7 and 9).

Someone who can write a twin or policy directory can reseal its manifest (an unsigned artifact proves
integrity, not authorship). Two ways to hurt every reader without running code:

* a network header that claims a huge network (``net_arch [12000, 12000]``: 2.7 GB of weights and
  optimiser state) over the original small tensors — refused before anything is built;
* JSON nested 100,000 deep in ``SIGNATURE.json``, ``MANIFEST.json``, ``policy.json`` or a twin's
  ``meta.json`` — refused by the bounded reader instead of an uncaught `RecursionError`.
"""

from __future__ import annotations

import json
import resource
import shutil
from pathlib import Path
from typing import Any

import pytest

from edgetwin.contract.errors import InputError
from edgetwin.contract.manifest import write_manifest
from edgetwin.edge.signed_dirs import verify_directory
from edgetwin.edge.signing import ArtifactRejected, Signer, TrustStore
from edgetwin.emulator.cluster import ClusterConfig
from edgetwin.emulator.logs import generate_logs
from edgetwin.policies.export import export_policy, load_policy
from edgetwin.policies.heuristics import UniformRandom
from edgetwin.twin.twin import Twin

DEEP = "[" * 100_000 + "]" * 100_000


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    d = tmp_path_factory.mktemp("bounds")
    log, spec = generate_logs(ClusterConfig(n_agents=4, steps=4), episodes=2, policy="random", seed=1)
    twin = Twin.fit(log, spec, members=1, seed=0, progress=False, population_model="empirical",
                    response_model="bc", bc_epochs=1)  # fmt: skip
    twin.save(d / "twin")
    export_policy(UniformRandom(spec, seed=0), d / "policy", spec)
    return {"dir": d}


def copy_of(world: dict[str, Any], name: str, dest: Path) -> Path:
    shutil.copytree(world["dir"] / name, dest / name)
    return dest / name


def reseal(path: Path, kind: str) -> None:
    (path / "MANIFEST.json").unlink()
    write_manifest(path, kind)


def twin_with_engine_net_arch(world: dict[str, Any], dest: Path, net_arch: list[int]) -> Path:
    """A copy of the twin whose member 0 engine header claims ``net_arch`` over its own tensors, resealed."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    p = copy_of(world, "twin", dest)
    f = p / "member_0" / "engine_0.safetensors"
    with safe_open(str(f), framework="pt") as sf:
        tensors = {k: sf.get_tensor(k) for k in sf.keys()}  # noqa: SIM118 - safe_open has no __iter__
        header = json.loads(sf.metadata()["edgetwin"])
    header["kwargs"]["net_arch"] = net_arch
    save_file(tensors, str(f), metadata={"edgetwin": json.dumps(header)})
    reseal(p, "twin")
    return p


def test_a_header_claiming_a_huge_network_is_refused_before_it_is_built(world: dict[str, Any], tmp_path: Path) -> None:
    p = twin_with_engine_net_arch(world, tmp_path, [12000, 12000])
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    with pytest.raises(InputError, match=r"engine_0\.safetensors.*needs at least [\d,]+ weights, the file holds [\d,]+"):
        Twin.load(p)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) / 1024
    assert grown_mib < 500, f"the reader's peak memory grew by {grown_mib:.0f} MiB"


def test_a_header_with_nonsense_widths_is_refused(world: dict[str, Any], tmp_path: Path) -> None:
    p = twin_with_engine_net_arch(world, tmp_path, [64, -3])
    with pytest.raises(InputError, match="net_arch must list positive integer widths"):
        Twin.load(p)


def test_deep_json_in_a_twins_meta_and_manifest_is_refused(world: dict[str, Any], tmp_path: Path) -> None:
    p = copy_of(world, "twin", tmp_path)
    (p / "meta.json").write_text(DEEP)
    reseal(p, "twin")
    with pytest.raises(InputError, match=r"meta\.json.*nested 100,000 levels deep"):
        Twin.load(p)
    (p / "MANIFEST.json").write_text(DEEP)
    with pytest.raises(InputError, match=r"MANIFEST\.json.*nested 100,000 levels deep"):
        Twin.load(p)


def test_deep_json_in_policy_json_is_refused(world: dict[str, Any], tmp_path: Path) -> None:
    p = copy_of(world, "policy", tmp_path)
    (p / "policy.json").write_text(DEEP)
    reseal(p, "policy")
    with pytest.raises(InputError, match=r"policy\.json.*nested 100,000 levels deep"):
        load_policy(p)


def test_deep_json_in_signature_json_is_refused(world: dict[str, Any], tmp_path: Path) -> None:
    p = copy_of(world, "policy", tmp_path)
    signer = Signer.generate()
    (p / "SIGNATURE.json").write_text(DEEP)
    with pytest.raises(ArtifactRejected, match="nested 100,000 levels deep"):
        verify_directory(p, "policy", TrustStore([signer.public_key]))


def test_the_weight_bound_admits_a_recurrent_network_with_a_narrow_lstm(tmp_path: Path) -> None:
    """The bound is a lower bound of what an honest file holds: behind an LSTM the heads read the
    LSTM's output, not the observation (a wide observation and a narrow LSTM must still load)."""
    import gymnasium as gym
    import numpy as np
    from sb3_contrib.common.recurrent.policies import RecurrentActorCriticPolicy

    from edgetwin.imitation.networks import load_network, save_network

    classes = {"RecurrentActorCriticPolicy": RecurrentActorCriticPolicy}
    obs, act = gym.spaces.Box(-1, 1, (200,), np.float32), gym.spaces.Box(-1, 1, (3,), np.float32)
    net = RecurrentActorCriticPolicy(obs, act, lambda _: 1e-3, net_arch={"pi": [64], "vf": [64]}, lstm_hidden_size=16)
    f = tmp_path / "n.safetensors"
    save_network(net, f, classes, extra={"lstm_hidden_size": 16})
    back = load_network(f, classes)
    assert sum(p.numel() for p in back.parameters()) == sum(p.numel() for p in net.parameters())
