"""The cheaper arithmetic of GAN-SMMSG's fit is the same arithmetic: the calibration layer's
proportional fit of the logit biases (`edgetwin.generative.calibration._proportional_fit`) against
the formula it replaced (two ``scipy.special.logsumexp`` per iteration), and the set
discriminator's hand-written std pooling against torch's ``std``."""

from __future__ import annotations

import numpy as np
import torch
from scipy.special import logsumexp

from edgetwin.generative.calibration import MarginalCalibration, _proportional_fit
from edgetwin.generative.gan import SetDiscriminator


def _reference(logits: np.ndarray, want: np.ndarray, iters: int) -> np.ndarray:
    """The proportional fit as it was written before (edgetwin at b68ff97)."""
    b = np.zeros(logits.shape[1])
    for _ in range(iters):
        z = logits + b
        have = logsumexp(z - logsumexp(z, axis=1, keepdims=True), axis=0) - np.log(len(z))
        b += want - have
    return b - b.mean()


def test_the_proportional_fit_is_the_logsumexp_formula() -> None:
    rng = np.random.default_rng(0)
    for scale, k in ((1.0, 2), (3.0, 5), (12.0, 7)):  # up to logits ~50 apart within a row
        logits = rng.normal(size=(5000, k)) * scale + rng.normal(size=k) * scale
        p = rng.dirichlet(np.ones(k))
        want = np.log(p)
        b = _proportional_fit(logits, want, 50)
        assert np.allclose(b, _reference(logits, want, 50), rtol=0, atol=1e-9)
        assert abs(b.mean()) < 1e-12


def test_the_calibrated_logits_hit_the_training_proportions() -> None:
    """What the bias is for: the mean softmax of the biased logits is the target's proportions."""
    rng = np.random.default_rng(1)
    gen = rng.normal(size=(20000, 3)) * 2.0
    target = np.eye(3)[rng.choice(3, size=4000, p=[0.6, 0.3, 0.1])]
    cal = MarginalCalibration.fit(gen, np.zeros(20000, np.int64), target, np.zeros(4000, np.int64), 1, [], [(0, 3)])
    z = gen + cal.bias[0]
    soft = np.exp(z - logsumexp(z, axis=1, keepdims=True)).mean(0)
    assert np.allclose(soft, target.mean(0), atol=1e-6)


def test_the_set_pooling_std_is_torch_std() -> None:
    torch.manual_seed(0)
    d = SetDiscriminator(net_dim=6, n_cond=3, hidden=16)
    x, c = torch.randn(4, 64, 6), torch.eye(3)[[0, 1, 2, 0]]
    h = torch.nn.functional.leaky_relu(d.phi(torch.cat([x, c[:, None, :].expand(4, 64, -1)], dim=2)), 0.2)
    ref = d.rho(torch.cat([torch.cat([h.mean(dim=1), h.std(dim=1)], dim=1), c], dim=1)).squeeze(1)
    assert torch.allclose(d(x, c), ref, rtol=1e-5, atol=1e-6)
