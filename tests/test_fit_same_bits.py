"""The member fit's cheaper arithmetic changes no weight (issue 47): behaviour cloning's Adam over
all tensors at once (``foreach``) trains the bits the per-tensor loop trains, and its written-out
Gaussian log-density is SB3's."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch as th

from edgetwin.imitation import mail


def _clone(seed: int) -> list[th.Tensor]:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3000, 7)).astype(np.float32)
    y = (np.tanh(x[:, :3]) + 0.3 * rng.standard_normal((3000, 3))).astype(np.float32)
    th.manual_seed(seed)
    policy = mail.gaussian_policy(7, 3, [16, 16])
    mail.behaviour_clone(x, y, policy, 2, seed=seed, max_steps=40)
    return [p.detach().clone() for p in policy.parameters()]


def test_behaviour_cloning_trains_the_same_bits_with_the_loop_adam(monkeypatch: Any) -> None:
    before = th.get_num_threads()
    th.set_num_threads(1)
    try:
        fast = _clone(3)
        real = mail.bc.BC

        def loop_adam(*a: Any, **k: Any) -> Any:  # torch's CPU default: one tensor at a time
            return real(*a, **{**k, "optimizer_kwargs": {"foreach": False}})

        monkeypatch.setattr(mail.bc, "BC", loop_adam)
        loop = _clone(3)
    finally:
        th.set_num_threads(before)
    assert all(th.equal(a, b) for a, b in zip(fast, loop, strict=True))
    th.manual_seed(3)
    untrained = [p.detach() for p in mail.gaussian_policy(7, 3, [16, 16]).parameters()]
    assert any(not th.equal(a, b) for a, b in zip(fast, untrained, strict=True))  # it trained


def test_the_written_out_log_density_is_sb3s() -> None:
    policy = mail.gaussian_policy(5, 2, [8])
    with th.no_grad():
        policy.log_std.copy_(th.tensor([-0.3, 0.4]))
    obs, acts = th.randn(50, 5), th.randn(50, 2)
    latent = policy.mlp_extractor.forward_actor(policy.extract_features(obs))
    sb3 = policy._get_action_dist_from_latent(latent).log_prob(acts)
    ours = mail._diag_gaussian_log_prob(policy.action_net(latent), policy.log_std, acts)
    assert th.equal(sb3, ours)
