"""On-policy defaults: the mini-batch divides the rollout, so SB3 neither warns nor trains on a truncated batch."""

from __future__ import annotations

import pytest

from edgetwin.policies.train import default_hyper, minibatch_size


@pytest.mark.parametrize("algo", ["ppo", "maskable_ppo", "dual_critic_ppo", "recurrent_ppo"])
def test_the_default_minibatch_divides_the_rollout(algo: str) -> None:
    # a twin's env count is its agents: 100 agents x 8 steps = 800 transitions (128 does not divide it)
    hp = default_hyper(algo, 100)  # type: ignore[arg-type]
    assert (hp["n_steps"] * 100) % hp["batch_size"] == 0
    for n_envs in range(1, 400):
        hp = default_hyper(algo, n_envs)  # type: ignore[arg-type]
        buffer = hp["n_steps"] * n_envs
        if any(buffer % d == 0 for d in range(64, 257)) or buffer <= 128:
            assert buffer % hp["batch_size"] == 0, n_envs
            assert min(buffer, 64) <= hp["batch_size"] <= 256


def test_minibatch_size_prefers_the_divisor_nearest_the_target() -> None:
    assert minibatch_size(800) == 100 and minibatch_size(512) == 128 and minibatch_size(96) == 96
    assert minibatch_size(8 * 1009) == 128  # no divisor near 128: the target, and SB3's warning
