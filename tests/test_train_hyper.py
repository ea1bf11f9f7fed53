"""On-policy defaults: the mini-batch divides the rollout, so SB3 neither warns nor trains on a truncated batch."""

from __future__ import annotations

from pathlib import Path

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


def test_train_config_from_toml_is_typed_and_refuses_code(tmp_path: Path) -> None:
    from edgetwin.contract.errors import InputError
    from edgetwin.policies.train import TrainConfig

    f = tmp_path / "train.toml"
    f.write_text('[train]\nalgo = "a2c"\nsteps = 2048\nseed = 7\n[train.hyper]\nlearning_rate = 0.001\n')
    c = TrainConfig.from_toml(f)
    assert (c.algo, c.steps, c.seed, dict(c.hyper or {})) == ("a2c", 2048, 7, {"learning_rate": 0.001})
    assert c.replace(steps=10).steps == 10 and c.steps == 2048
    with pytest.raises(TypeError):
        c.replace(stepz=1)
    f.write_text('[train]\nshield = "my.module:evil"\n')
    with pytest.raises(InputError, match="code-only") as e:
        TrainConfig.from_toml(f)
    assert e.value.where == str(f)
    f.write_text('[train]\nsteps = "many"\n')
    with pytest.raises(InputError, match="train.steps must be int"):
        TrainConfig.from_toml(f)
    f.write_text('[train]\nsteps = true\n')
    with pytest.raises(InputError, match="train.steps must be int"):
        TrainConfig.from_toml(f)
