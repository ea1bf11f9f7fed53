"""An updated twin's and a site-personalised federated twin's members carry an output noise model
(`Member.fit_output_noise`, as `Twin.fit` fits one), and the same seed gives the same one."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from edgetwin.emulator.cluster import ClusterConfig
from edgetwin.emulator.logs import generate_logs
from edgetwin.imitation.noise import noise_to_json
from edgetwin.twin.twin import Twin

torch.set_num_threads(1)
CLUSTER = ClusterConfig(n_agents=12, steps=16)


def _tables(twin: Twin) -> list[str]:
    return [noise_to_json(m.noise, m.noise_source) if m.noise is not None else "" for m in twin.members]


@pytest.fixture(scope="module")
def parent() -> dict:  # type: ignore[type-arg]
    log, spec = generate_logs(CLUSTER, 3, "random", seed=0)
    twin = Twin.fit(log, spec, seed=0, members=2, progress=False, rounds=0, bc_epochs=2, population_model="empirical")
    new, _ = generate_logs(CLUSTER, 2, "heuristic", seed=11)
    return {"log": log, "spec": spec, "twin": twin, "new": new.assign(episode=new["episode"] + 100)}


def test_an_updated_twins_members_carry_their_own_noise_model(parent) -> None:  # type: ignore[no-untyped-def]
    tw = parent["twin"]
    # what is checked: the updated models' own residuals, not the parent's tables carried over
    for m in tw.members:
        m.noise = None
    child = tw.update(parent["new"], [parent["log"]], seed=4, epochs=1, max_steps=20)
    assert all(m.noise is not None for m in child.members), [m.noise_source for m in child.members]
    assert all(m.noise_source == "training episodes" for m in child.members)  # each member's own draw (issue 44)
    again = tw.update(parent["new"], [parent["log"]], seed=4, epochs=1, max_steps=20)
    assert _tables(child) == _tables(again)  # the same seed, the same noise model
    other = tw.update(parent["new"], [parent["log"]], seed=5, epochs=1, max_steps=20)
    assert _tables(other) != _tables(child)  # the seed reaches it (the draws of the new episodes differ)
    # and the updated twin samples with it: the same seed gives the same rollout
    pol = np.array([0.5, 1.0, 0.5])

    class Const:
        def act(self, obs: np.ndarray) -> np.ndarray:
            return np.tile(pol, (len(obs), 1))

    a = child.rollout(Const(), episodes=1, seed=2, n_agents=8, steps=6)
    b = again.rollout(Const(), episodes=1, seed=2, n_agents=8, steps=6)
    assert a.equals(b)


@pytest.mark.slow
def test_a_personalised_federated_twins_members_carry_a_noise_model() -> None:
    from edgetwin.federation.twin.personalise import personalise

    log, spec = generate_logs(CLUSTER, 3, "random", seed=0)
    fed = Twin.fit(log, spec, seed=0, members=1, progress=False, rounds=0, bc_epochs=2, population_model="empirical")
    for m in fed.members:  # as the coordinator assembles it: no noise model (it holds no row)
        m.noise = None
    site = log[log["site"] == log["site"].iloc[0]]
    one = personalise(fed, site, epochs=2, seed=0, local_epochs=2)
    two = personalise(fed, site, epochs=2, seed=0, local_epochs=2)
    assert all(m.noise is not None for m in one.members)
    assert _tables(one) == _tables(two)
