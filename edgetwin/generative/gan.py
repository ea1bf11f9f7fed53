"""GAN-SMMSG (seed 004 §3.3, Algorithm 1, eqs. 3-4) and the GAN / WGAN-GP baselines, in PyTorch.

All three share the conditional generator: ``G(z, c)`` maps noise ``z ~ N(0, I)`` and the one-hot
scenario ``c`` to the transformed profile (`ProfileTransformer.transform`): one normal score per
continuous column and a logit block per discrete column, which is sampled with (straight-through)
Gumbel-softmax so generated discrete values are always allowed ones.

* ``gan-smmsg``: the discriminator judges instances **and groups**: an instance head ``D(x, c)``
  and a DeepSets head ``D_set({x_i}, c)`` over groups of ``group_size`` agents of one scenario
  (mean and std pooling), both trained with eq. 3. The generator maximises eq. 4::

      D(G(z)) + alpha * H(V(G(z))) - beta * KL(V(x) || V(G(z)))

  where ``V`` are group-level statistics of one scenario's minibatch, computed differentiably:
  a soft histogram of each continuous column (Gaussian kernel over fixed bin centres in normal-
  score space) and the category proportions of each discrete column (mean softmax). ``H`` is
  their mean entropy (breadth), ``KL`` their mean KL from the real minibatch of the same scenario
  to the generated one. ``D(G(z))`` is used in its non-saturating form (``log D``), for both heads.
  By default ``alpha`` decays linearly to 0 over the first quarter of training
  (``alpha_anneal=0.25``): the entropy bonus widens the distribution early on (against mode
  collapse), but the maximiser of ``H(q) - KL(p || q)`` is flatter than ``p``, so keeping it on to
  the end costs fidelity; ``alpha_anneal=0`` keeps the paper's constant ``alpha``.
* ``gan``: instance discriminator only, eq. 3 / non-saturating generator loss, no H or KL term.
* ``wgan``: WGAN-GP (Gulrajani et al. 2017): instance critic, gradient penalty 10, 5 critic steps
  per generator step.

The scenario proportions are the training rows' frequencies; scenarios are balanced within a
training batch so rare scenarios are learned as well as frequent ones.
"""

from __future__ import annotations

import copy
import time
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pandas as pd
import torch
from torch import nn
from torch.nn import functional as F

from edgetwin.contract.errors import InputError
from edgetwin.generative.base import PopulationModel

WEIGHTS_FILE = "weights.safetensors"

#: Defaults shared by the three GAN variants; `VARIANT_DEFAULTS` overrides per variant.
GAN_DEFAULTS: dict[str, Any] = {
    "steps": 3000,  # generator updates
    "batch_per_scenario": 256,  # real and generated rows per scenario per step
    "noise_dim": 32,
    "hidden": 256,
    "d_hidden": 256,
    "layers": 2,  # hidden layers of G and D
    "lr_g": 2e-4,
    "lr_d": 2e-4,
    "betas": (0.5, 0.9),
    "tau": 0.2,  # Gumbel-softmax temperature
    "g_steps": 1,  # k of Algorithm 1: generator updates per discriminator update
    "sample_chunk": 16384,
    # Samples come from an exponential moving average of the generator's weights (Polyak
    # averaging; decay warms up as min(ema, (1 + step) / (10 + step))): it damps the adversarial
    # oscillation of the last steps. 0 samples from the trained generator itself.
    "ema": 0.999,
    # Marginal calibration layer fitted after training (`edgetwin.generative.calibration`), from
    # this many generated rows per scenario.
    "calibrate": False,
    "calibrate_samples": 50_000,
}
VARIANT_DEFAULTS: dict[str, dict[str, Any]] = {
    "gan-smmsg": {
        "alpha": 1.0,
        "beta": 1.0,
        "alpha_anneal": 0.25,  # alpha decays linearly to 0 over this fraction of the steps (0: constant)
        "calibrate": True,
        # "gmm": the generator is a fitted 10-component GMM per scenario plus a learned residual
        # that starts at zero (`MixtureResidualGenerator`); "none": a plain MLP generator.
        "base": "gmm",
        # Components per scenario of the base mixture; a list is a choice, made by log-likelihood
        # on a validation split of the training rows (`select_components`).
        "base_components": [10, 20, 30],
        # Checkpoint selection: every `select_every` generator updates (and at the start and the
        # end) the sampler is scored by C2ST AUC against a validation split carved out of the
        # TRAINING rows (`val_fraction` of them, never trained on); the best checkpoint is kept.
        # 0 switches it off (the last checkpoint is kept).
        "select_every": 500,
        "val_fraction": 0.1,
        "group_size": 64,
        "set_hidden": 128,
        "hist_bins": 40,
        "hist_range": 4.0,  # bin centres span [-r, r] normal scores
    },
    "gan": {},
    "wgan": {"n_critic": 5, "gp_lambda": 10.0, "lr_g": 1e-4, "lr_d": 1e-4},
}


def _as_list(v: Any) -> list[int]:
    """An int or a list of ints (a hyper-parameter that may be a choice) as a list of ints."""
    return [int(x) for x in v] if isinstance(v, list | tuple) else [int(v)]


def _mlp(n_in: int, hidden: int, n_out: int, layers: int = 2) -> nn.Sequential:
    mods: list[nn.Module] = []
    d = n_in
    for _ in range(layers):
        mods += [nn.Linear(d, hidden), nn.LeakyReLU(0.2)]
        d = hidden
    mods.append(nn.Linear(d, n_out))
    return nn.Sequential(*mods)


class Generator(nn.Module):
    """``(z (N, noise_dim), c (N, S)) -> raw (N, net_dim)``: normal scores and discrete logits."""

    def __init__(self, noise_dim: int, n_cond: int, net_dim: int, hidden: int, layers: int = 2) -> None:
        super().__init__()
        self.noise_in = noise_dim
        self.net = _mlp(noise_dim + n_cond, hidden, net_dim, layers=layers)

    def forward(self, z: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([z, c], dim=1))


class MixtureResidualGenerator(nn.Module):
    """A fitted per-scenario GMM as the starting point, plus a learned residual (zero at init).

    ``(z (N, 1 + n_codes + noise_dim), c (N, S)) -> raw (N, net_dim)``. All randomness is in ``z``
    so the module is a deterministic function like `Generator`: ``Phi(z[:, 0])`` picks the
    mixture component by inverse CDF over the scenario's weights, ``z[:, 1:1 + n_codes]`` is the
    component's standard-normal draw, the rest feeds the residual. The mixture draw, in the GMM's
    code space (`ProfileTransformer.transform_codes`), is put in the net encoding as ``base``:
    normal scores as they are, a discrete column's snapped value as a one-hot of logits
    ``logit_gap`` apart. The generator returns ``base + r(base, z_rest, c)``; ``r``'s last layer
    starts at zero, so training starts from the GMM and the adversarial game refines it.

    Buffers (saved with the state dict): ``cum_w (S, K)`` cumulative component weights,
    ``mu (S, K, n_codes)``, ``chol (S, K, n_codes, n_codes)``.
    """

    cum_w: torch.Tensor
    mu: torch.Tensor
    chol: torch.Tensor

    def __init__(
        self,
        noise_dim: int,
        n_cond: int,
        net_dim: int,
        hidden: int,
        layers: int,
        codecs: list[tuple[int, int, np.ndarray | None, float, float]],
        n_components: int,
        logit_gap: float = 8.0,
    ) -> None:
        super().__init__()
        self.n_codes = len(codecs)
        self.noise_dim = noise_dim
        self.net_dim = net_dim
        self.logit_gap = logit_gap
        # (net start, net end, allowed values or None, code mean, code std) of each code column
        self.codecs = codecs
        for j, (_, _, vals, _, _) in enumerate(codecs):
            if vals is not None:
                self.register_buffer(
                    f"mids_{j}", torch.as_tensor((vals[1:] + vals[:-1]) / 2.0, dtype=torch.float32)
                )
        k, d = n_components, self.n_codes
        self.register_buffer("cum_w", torch.ones(n_cond, k))
        self.register_buffer("mu", torch.zeros(n_cond, k, d))
        self.register_buffer("chol", torch.eye(d).repeat(n_cond, k, 1, 1))
        self.residual = _mlp(net_dim + noise_dim + n_cond, hidden, net_dim, layers=layers)
        self.zero_residual()

    @property
    def noise_in(self) -> int:
        """Width of the noise ``z`` this generator takes."""
        return 1 + self.n_codes + self.noise_dim

    def zero_residual(self) -> None:
        last = self.residual[-1]
        assert isinstance(last, nn.Linear)
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)

    def set_mixtures(self, params: list[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> None:
        """Load per-scenario mixtures (weights ``(K_s,)``, means, Cholesky factors); pads to ``K``."""
        k = self.cum_w.shape[1]
        for s, (w, mu, chol) in enumerate(params):
            ks = len(w)
            cw = np.ones(k)
            cw[:ks] = np.cumsum(w) / np.sum(w)
            self.cum_w[s] = torch.as_tensor(cw, dtype=torch.float32)
            self.mu[s, :ks] = torch.as_tensor(mu, dtype=torch.float32)
            self.chol[s, :ks] = torch.as_tensor(chol, dtype=torch.float32)

    def base(self, z: torch.Tensor, s_idx: torch.Tensor) -> torch.Tensor:
        """The mixture draw in the net encoding, ``(N, net_dim)``."""
        d = self.n_codes
        u = torch.special.ndtr(z[:, 0:1])
        comp = (u > self.cum_w[s_idx]).sum(dim=1).clamp_(max=self.cum_w.shape[1] - 1)
        code = self.mu[s_idx, comp] + (self.chol[s_idx, comp] @ z[:, 1 : 1 + d, None]).squeeze(2)
        cols = []
        for j, (s, e, vals, mean, std) in enumerate(self.codecs):
            if vals is None:
                cols.append(code[:, j : j + 1])
            else:
                idx = torch.bucketize(code[:, j] * std + mean, getattr(self, f"mids_{j}"))
                cols.append(self.logit_gap * F.one_hot(idx, e - s).to(code.dtype))
        return torch.cat(cols, dim=1)

    def forward(self, z: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        base = self.base(z, c.argmax(dim=1))
        feats = base.clone()
        for s, e, vals, _, _ in self.codecs:
            if vals is not None:  # the residual sees one-hots, not gap-scaled logits
                feats[:, s:e] = feats[:, s:e] / self.logit_gap
        return base + self.residual(torch.cat([feats, z[:, 1 + self.n_codes :], c], dim=1))


class InstanceDiscriminator(nn.Module):
    """``(x (N, net_dim), c (N, S)) -> logit (N,)``: is this one agent real?"""

    def __init__(self, net_dim: int, n_cond: int, hidden: int, layers: int = 2) -> None:
        super().__init__()
        self.net = _mlp(net_dim + n_cond, hidden, 1, layers=layers)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([x, c], dim=1)).squeeze(1)


class SetDiscriminator(nn.Module):
    """DeepSets head: ``(x (G, m, net_dim), c (G, S)) -> logit (G,)``: is this group real?

    ``phi`` embeds each agent, the group is pooled by mean and std (permutation invariant), and
    ``rho`` judges the pooled embedding with the scenario.
    """

    def __init__(self, net_dim: int, n_cond: int, hidden: int) -> None:
        super().__init__()
        self.phi = _mlp(net_dim + n_cond, hidden, hidden, layers=1)
        self.rho = _mlp(2 * hidden + n_cond, hidden, 1, layers=1)

    def forward(self, x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        g, m, _ = x.shape
        h = F.leaky_relu(self.phi(torch.cat([x, c[:, None, :].expand(g, m, -1)], dim=2)), 0.2)
        # the std by hand: torch's CPU ``std`` (and ``var``) forward and backward took 3x as long
        # on these (G, 64, 128) blocks, ~4 % of a GAN-SMMSG step; the same values up to rounding
        mean = h.mean(dim=1, keepdim=True)
        std = ((h - mean).square().sum(dim=1) / (m - 1)).sqrt()
        pooled = torch.cat([mean.squeeze(1), std], dim=1)
        return self.rho(torch.cat([pooled, c], dim=1)).squeeze(1)


def gumbel_softmax(
    logits: torch.Tensor, tau: float, hard: bool, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Gumbel-softmax over the last dim, with a seedable noise source (``F.gumbel_softmax`` has none)."""
    y = _gumbel_probs(logits, tau, generator)
    if not hard:
        return y
    # Straight-through: exact one-hot forward (the discriminator never sees soft values), soft grad.
    one_hot = F.one_hot(y.argmax(dim=-1), y.shape[-1]).to(y.dtype)
    return one_hot - y.detach() + y


def _gumbel_probs(logits: torch.Tensor, tau: float, generator: torch.Generator | None) -> torch.Tensor:
    """``softmax((logits + Gumbel noise) / tau)`` over the last dim; the noise drawn from ``generator``."""
    u = torch.rand(logits.shape, generator=generator, dtype=logits.dtype).clamp_(1e-10, 1.0 - 1e-7)
    return F.softmax((logits - torch.log(-torch.log(u))) / tau, dim=-1)


class _Layout:
    """Index sets of the continuous dims and the discrete blocks of the net encoding."""

    def __init__(self, spans: list[tuple[int, int, bool]]) -> None:
        self.cont = [s for s, e, disc in spans if not disc]
        self.blocks = [(s, e) for s, e, disc in spans if disc]

    def activate(
        self, raw: torch.Tensor, tau: float, hard: bool, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Raw generator output -> encoded rows (continuous dims kept, discrete blocks sampled)."""
        if not self.blocks:
            return raw
        out = raw.clone()
        for s, e in self.blocks:
            out[:, s:e] = gumbel_softmax(raw[:, s:e], tau, hard, generator)
        return out

    def decode(self, raw: torch.Tensor, tau: float, generator: torch.Generator | None = None) -> np.ndarray:
        """``activate(raw, tau, hard=True, generator)`` for sampling: ``(N, net_dim)`` float64, the
        continuous dims as they are, each block the one-hot of the category drawn.

        The same noise in the same order and the same category (``argmax`` of the same softmax) as
        `activate`, whose straight-through one-hot ``onehot - y + y`` is 0 off the category and
        ~1 on it: decoded by ``argmax``, both give the same rows (tests/test_reset_draws.py).
        Why: no clone, one-hot tensor or autograd arithmetic per block when a twin draws its
        population at every episode reset (issue 47).
        """
        out = raw.numpy().astype(np.float64)
        rows = np.arange(len(out))
        for s, e in self.blocks:
            cat = _gumbel_probs(raw[:, s:e], tau, generator).argmax(dim=-1).numpy()
            out[:, s:e] = 0.0
            out[rows, s + cat] = 1.0
        return out


def group_statistics(
    x: torch.Tensor, layout: _Layout, centres: torch.Tensor, width: float, probs: torch.Tensor | None = None
) -> list[torch.Tensor]:
    """Group statistics V(x) of scenario batches ``x (S, b, net_dim)``, differentiable.

    Returns a list of ``(S, K)`` probability tensors, one per column: for continuous columns the
    mean over the ``b`` rows of a softmax over the ``K`` bin ``centres`` of
    ``-(x - c_k)^2 / (2 width^2)`` (a soft histogram; rows outside the range count in the edge
    bins), for discrete columns the mean of ``probs`` (the generator's softmax probabilities: the
    expected category proportions) or, when None, of the one-hot rows.
    """
    src = x if probs is None else probs
    stats: list[torch.Tensor] = []
    if layout.cont:
        d = x[:, :, layout.cont, None] - centres  # (S, b, C, K)
        hist = F.softmax(-(d * d) / (2 * width * width), dim=3).mean(dim=1)  # (S, C, K)
        stats += list(hist.unbind(dim=1))
    for s, e in layout.blocks:
        stats.append(src[:, :, s:e].mean(dim=1))
    return stats


def _entropy(p: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of each row of ``p (S, K)``."""
    return -(p * torch.log(p + 1e-8)).sum(dim=-1)


def _kl(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """KL(p || q) (nats) of each row pair of ``(S, K)`` tensors."""
    return (p * (torch.log(p + 1e-8) - torch.log(q + 1e-8))).sum(dim=-1)


class GANPopulation(PopulationModel):
    """Conditional GAN population model; the ``variant`` hyper-parameter picks the objective."""

    name: ClassVar[str] = "gan"
    variant: ClassVar[str] = "gan"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        hyper = {**GAN_DEFAULTS, **VARIANT_DEFAULTS[self.variant], **self.hyper}
        hyper["betas"] = tuple(hyper["betas"])
        self.hyper = hyper
        spans = [(s, e, c.is_discrete) for s, e, c in self.transformer.spans]
        self.layout = _Layout(spans)
        net_dim, n_cond = self.transformer.net_dim, len(self.scenarios)
        layers = int(hyper["layers"])
        base = str(hyper.get("base", "none"))
        if base not in ("none", "gmm"):
            raise InputError(f"base must be 'none' or 'gmm', got {base!r}", "base")
        self.generator: Generator | MixtureResidualGenerator
        if base == "gmm":
            codecs = [(s, e, c.values, c.mean, c.std) for s, e, c in self.transformer.spans]
            self.generator = MixtureResidualGenerator(
                int(hyper["noise_dim"]),
                n_cond,
                net_dim,
                int(hyper["hidden"]),
                layers,
                codecs,
                max(_as_list(hyper["base_components"])),
            )
        else:
            self.generator = Generator(int(hyper["noise_dim"]), n_cond, net_dim, int(hyper["hidden"]), layers)
        self.discriminator = InstanceDiscriminator(net_dim, n_cond, int(hyper["d_hidden"]), layers)
        self.set_discriminator: SetDiscriminator | None = None
        if self.variant == "gan-smmsg":
            self.set_discriminator = SetDiscriminator(net_dim, n_cond, int(hyper["set_hidden"]))
        self.generator_ema: Generator | MixtureResidualGenerator | None = None
        if float(hyper["ema"]) > 0:
            self.generator_ema = copy.deepcopy(self.generator).requires_grad_(False)
        self.history: list[dict[str, float]] = []

    @property
    def sampler(self) -> Generator | MixtureResidualGenerator:
        """The network that samples: the EMA generator when ``ema > 0``, else the generator."""
        return self.generator if self.generator_ema is None else self.generator_ema

    @torch.no_grad()
    def _update_ema(self, step: int) -> None:
        assert self.generator_ema is not None
        decay = min(float(self.hyper["ema"]), (1.0 + step) / (10.0 + step))
        for pe, p in zip(self.generator_ema.parameters(), self.generator.parameters(), strict=True):
            pe.mul_(decay).add_(p.detach(), alpha=1.0 - decay)

    @classmethod
    def hyper_keys(cls) -> set[str]:
        return set(GAN_DEFAULTS) | set(VARIANT_DEFAULTS[cls.variant])

    # ------------------------------------------------------------------------------------ fit
    def fit(self, profiles: pd.DataFrame, seed: int = 0, progress: bool = False) -> GANPopulation:
        """Train on the profile rows (Algorithm 1 for ``gan-smmsg``); seeded, no global RNG effects."""
        val = None
        if int(self.hyper.get("select_every", 0)) > 0 and int(self.hyper["steps"]) > 0:
            is_val = np.random.default_rng([seed, 0x7A1]).random(len(profiles)) < float(
                self.hyper["val_fraction"]
            )
            v_labels = profiles["scenario"].astype(str).to_numpy()[is_val]
            # Too few validation rows of some scenario: the score would be noise; keep all rows.
            if min(int((v_labels == sc).sum()) for sc in self.scenarios) >= 20:
                val = profiles[is_val].reset_index(drop=True)
                profiles = profiles[~is_val].reset_index(drop=True)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            # Re-initialise under the seed so that the same seed gives the same model.
            for m in (self.generator, self.discriminator, self.set_discriminator):
                if m is not None:
                    for layer in m.modules():
                        if isinstance(layer, nn.Linear):
                            layer.reset_parameters()
            if isinstance(self.generator, MixtureResidualGenerator):
                from edgetwin.generative.gmm import fit_mixtures, select_components

                self.generator.zero_residual()
                codes = self.transformer.transform_codes(profiles, rng=np.random.default_rng([seed, 0x6A1]))
                labels = profiles["scenario"].astype(str).to_numpy()
                candidates = _as_list(self.hyper["base_components"])
                k = min(candidates)
                smallest = min(int((labels == sc).sum()) for sc in self.scenarios)
                # A choice needs enough rows per scenario for a validation split to say anything.
                if len(candidates) > 1 and smallest >= 10 * max(candidates):
                    k, scores = select_components(codes, labels, self.scenarios, candidates, seed=seed)
                    self.meta["base_components_val_loglik"] = scores
                self.meta["base_components_selected"] = k
                self.generator.set_mixtures(
                    fit_mixtures(codes, labels, self.scenarios, k, seed=seed, progress=progress)
                )
            if self.generator_ema is not None:
                self.generator_ema.load_state_dict(self.generator.state_dict())
            self._train(profiles, seed, progress, val)
        return self

    def _validation_auc(self, fit_rows: pd.DataFrame, val: pd.DataFrame, seed: int) -> float:
        """C2ST AUC of the current sampler (calibrated on ``fit_rows`` if the model calibrates) vs ``val``.

        Features as in `edgetwin.contract.metrics.fidelity_report`: profile columns (heavy-tailed in
        log space) plus the one-hot scenario.
        """
        from edgetwin.contract.metrics import c2st_auc, joint_matrix

        cols = self.spec.names("profile")
        if self.hyper.get("calibrate"):
            self.fit_calibration(
                fit_rows, seed, samples_per_scenario=min(20_000, int(self.hyper["calibrate_samples"]))
            )
        gen = self.sample(len(val), seed=seed + 1)
        self.calibration = None
        xr, xg = joint_matrix(val, self.spec, cols), joint_matrix(gen, self.spec, cols, ref=val)
        if len(self.scenarios) > 1:
            names = np.asarray(self.scenarios)
            xr = np.hstack([xr, (val["scenario"].astype(str).to_numpy()[:, None] == names).astype(float)])
            xg = np.hstack([xg, (gen["scenario"].astype(str).to_numpy()[:, None] == names).astype(float)])
        return c2st_auc(xr, xg, seed=seed)

    def training_steps(
        self, profiles: pd.DataFrame, seed: int, total_steps: int | None = None, partial: bool = False
    ) -> GanSteps:
        """The training state on ``profiles``: optimisers, batch samplers and one step of the game
        (`GanSteps.step`). `_train` loops over it; a federated site runs a few steps of it per round
        on its own profiles (`edgetwin.federation.twin.gan`). ``partial``: scenarios without rows
        are left out of the batches (a site that logged only some of them) instead of refused."""
        return GanSteps(self, profiles, seed, int(self.hyper["steps"]) if total_steps is None else total_steps, partial)

    def _train(
        self, profiles: pd.DataFrame, seed: int, progress: bool, val: pd.DataFrame | None = None
    ) -> None:
        from tqdm.auto import trange

        h = self.hyper
        game = self.training_steps(profiles, seed)
        steps = game.total_steps
        self.history = []
        t0 = time.perf_counter()
        select_every = int(h.get("select_every", 0)) if val is not None else 0
        best: tuple[float, int, dict[str, torch.Tensor]] | None = None
        selection: list[dict[str, float]] = []

        def checkpoint(step: int) -> None:
            nonlocal best
            auc = self._validation_auc(profiles, val, seed)
            selection.append({"step": step, "val_c2st_auc": auc})
            if best is None or auc < best[0]:
                best = (auc, step, copy.deepcopy(self.sampler.state_dict()))

        bar = trange(steps, desc=self.name, disable=not progress)
        for step in bar:
            if select_every and step % select_every == 0:
                checkpoint(step)
            losses = game.step(step)
            if step % 50 == 0 or step == steps - 1:
                rec = {k: float(v.detach()) for k, v in losses.items()}
                self.history.append({"step": step, **rec})
                bar.set_postfix(loss_d=f"{rec['loss_d']:.3f}", loss_g=f"{rec['loss_g']:.3f}")
        if select_every:
            checkpoint(steps)
            assert best is not None
            self.sampler.load_state_dict(best[2])
            self.meta["selection"] = selection
            self.meta["selected_step"] = best[1]
        self.meta["train_seconds"] = time.perf_counter() - t0

    # ------------------------------------------------------------------------------- sampling
    @torch.inference_mode()
    def _raw_chunks(self, scenario_idx: np.ndarray, g: torch.Generator):  # noqa: ANN202
        """Yield ``(rows, raw (n, net_dim))`` chunks of the sampler's output for these scenarios.

        Under ``inference_mode`` (no autograd bookkeeping at all, not only no graph): the same
        numbers, ~12 % less time a call on a reset's few hundred rows (issue 47)."""
        net = self.sampler
        n_s = len(self.scenarios)
        chunk = int(self.hyper["sample_chunk"])
        idx = torch.as_tensor(scenario_idx, dtype=torch.long)
        for i in range(0, len(idx), chunk):
            c = F.one_hot(idx[i : i + chunk], n_s).to(torch.float32)
            z = torch.randn(len(c), net.noise_in, generator=g)
            yield slice(i, i + len(c)), net(z, c)

    def _sample_raw(self, scenario_idx: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        g = torch.Generator().manual_seed(int(rng.integers(0, 2**62)))
        return np.concatenate([raw.numpy() for _, raw in self._raw_chunks(scenario_idx, g)]).astype(
            np.float64
        )

    def _calibration_target(
        self, profiles: pd.DataFrame, rng: np.random.Generator
    ) -> tuple[np.ndarray, list[int], list[tuple[int, int]]]:
        target = self.transformer.transform(profiles, rng=rng).astype(np.float64)
        return target, list(self.layout.cont), list(self.layout.blocks)

    @torch.inference_mode()
    def _sample_profiles(self, scenario_idx: np.ndarray, rng: np.random.Generator, seed: int) -> np.ndarray:
        g = torch.Generator().manual_seed(int(rng.integers(0, 2**62)))
        outs = []
        for rows, raw in self._raw_chunks(scenario_idx, g):
            if self.calibration is not None:
                raw = torch.as_tensor(
                    self.calibration.apply(raw.numpy(), scenario_idx[rows]), dtype=torch.float32
                )
            # tau -> 0 of Gumbel-softmax: argmax(logits + Gumbel) is an exact categorical draw.
            outs.append(self.layout.decode(raw, 1.0, generator=g))
        return self.transformer.inverse_array(outs[0] if len(outs) == 1 else np.concatenate(outs))

    # ---------------------------------------------------------------------------- persistence
    def _save_params(self, path: Path) -> None:
        state = {"generator": self.generator.state_dict(), "discriminator": self.discriminator.state_dict()}
        if self.set_discriminator is not None:
            state["set_discriminator"] = self.set_discriminator.state_dict()
        if self.generator_ema is not None:
            state["generator_ema"] = self.generator_ema.state_dict()
        from safetensors.torch import save_file

        # one flat file of tensors, "<module>.<parameter>": data, not a pickle (`PopulationModel`)
        flat = {f"{m}.{k}": v.detach().contiguous() for m, sd in state.items() for k, v in sd.items()}
        save_file(flat, str(path / WEIGHTS_FILE))
        (path / "history.json").write_text(pd.DataFrame(self.history).to_json(orient="records"))

    def _load_params(self, path: Path) -> None:
        from safetensors.torch import load_file

        state: dict[str, dict[str, torch.Tensor]] = {}
        for name, t in load_file(str(path / WEIGHTS_FILE), device="cpu").items():
            module, _, key = name.partition(".")
            state.setdefault(module, {})[key] = t
        self.generator.load_state_dict(state["generator"])
        self.discriminator.load_state_dict(state["discriminator"])
        if self.set_discriminator is not None:
            self.set_discriminator.load_state_dict(state["set_discriminator"])
        if self.generator_ema is not None:
            self.generator_ema.load_state_dict(state["generator_ema"])


class GanSteps:
    """The adversarial game of a `GANPopulation` on some profile rows, one step at a time.

    Holds the encoded rows, the scenario-balanced batch samplers (numpy generator seeded by
    ``seed``; noise from torch's global generator) and the two Adam optimisers. ``step(i)`` is one
    iteration of Algorithm 1: ``n_critic`` discriminator updates (eq. 3, instance and set heads),
    then ``g_steps`` generator updates (eq. 4 for GAN-SMMSG, with ``alpha`` annealed over
    ``total_steps``), then the EMA update.

    Args:
        model: the population model whose networks are trained in place.
        profiles: rows ``[scenario, profile.*]``.
        seed: seeds the batch sampler.
        total_steps: the length of the whole training (the entropy bonus's annealing schedule).
        partial: leave scenarios without rows out of the batches instead of failing on them.
    """

    def __init__(self, model: GANPopulation, profiles: pd.DataFrame, seed: int, total_steps: int,
                 partial: bool = False) -> None:
        self.model = model
        h = model.hyper
        self.rng = np.random.default_rng(seed)
        self.x_all = torch.as_tensor(model.transformer.transform(profiles, rng=self.rng))
        labels = profiles["scenario"].astype(str).to_numpy()
        rows = [np.flatnonzero(labels == s) for s in model.scenarios]
        present = [i for i, r in enumerate(rows) if len(r) or not partial]
        self.rows = [rows[i] for i in present]
        n_all = len(model.scenarios)
        self.n_s, self.b = len(present), int(h["batch_per_scenario"])
        # (S*b, S), scenario-major; all scenarios: the identity's rows in order
        self.cond = torch.repeat_interleave(torch.eye(n_all)[present], self.b, dim=0)
        self.tau = float(h["tau"])
        self.smmsg = model.variant == "gan-smmsg"
        self.wgan = model.variant == "wgan"
        if self.smmsg:
            self.m = int(h["group_size"])
            if self.b % self.m:
                raise InputError(f"batch_per_scenario {self.b} must be a multiple of group_size {self.m}", "group_size")
            self.centres = torch.linspace(-float(h["hist_range"]), float(h["hist_range"]), int(h["hist_bins"]))
            self.width = float(self.centres[1] - self.centres[0])
            self.group_cond = torch.repeat_interleave(torch.eye(n_all)[present], self.b // self.m, dim=0)
        d_params = list(model.discriminator.parameters())
        if model.set_discriminator is not None:
            d_params += list(model.set_discriminator.parameters())
        # foreach: Adam over all tensors at once, not a Python loop over them (the same arithmetic
        # element by element: the same weights)
        self.opt_g = torch.optim.Adam(model.generator.parameters(), lr=float(h["lr_g"]), betas=h["betas"], foreach=True)
        self.opt_d = torch.optim.Adam(d_params, lr=float(h["lr_d"]), betas=h["betas"], foreach=True)
        self.noise_dim = model.generator.noise_in
        self.total_steps = int(total_steps)
        self.n_critic = int(h.get("n_critic", 1))

    def real_batch(self) -> torch.Tensor:
        idx = np.concatenate([r[self.rng.integers(0, len(r), size=self.b)] for r in self.rows])
        return self.x_all[idx]

    def fake_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        raw = self.model.generator(torch.randn(self.n_s * self.b, self.noise_dim), self.cond)
        return self.model.layout.activate(raw, self.tau, hard=True), raw

    def groups(self, x: torch.Tensor) -> torch.Tensor:
        return x.reshape(self.n_s * self.b // self.m, self.m, x.shape[1])

    def step(self, step: int) -> dict[str, torch.Tensor]:
        """One iteration (``step`` counts from 0 over the whole training); returns its losses."""
        model, h, cond = self.model, self.model.hyper, self.cond
        n_s, b = self.n_s, self.b
        # --- discriminator / critic: eq. 3 on the instance head (and the set head) ---
        for _ in range(self.n_critic):
            xr = self.real_batch()
            with torch.no_grad():
                xf, _ = self.fake_batch()
            if self.wgan:
                loss_d = model.discriminator(xf, cond).mean() - model.discriminator(xr, cond).mean()
                eps = torch.rand(xr.shape[0], 1)
                xi = (eps * xr + (1 - eps) * xf).requires_grad_(True)
                grad = torch.autograd.grad(model.discriminator(xi, cond).sum(), xi, create_graph=True)[0]
                loss_d = loss_d + float(h["gp_lambda"]) * ((grad.norm(dim=1) - 1) ** 2).mean()
            else:
                lr_, lf_ = model.discriminator(xr, cond), model.discriminator(xf, cond)
                loss_d = F.binary_cross_entropy_with_logits(lr_, torch.ones_like(lr_)) + (
                    F.binary_cross_entropy_with_logits(lf_, torch.zeros_like(lf_))
                )
                if self.smmsg:
                    assert model.set_discriminator is not None
                    sr = model.set_discriminator(self.groups(xr), self.group_cond)
                    sf = model.set_discriminator(self.groups(xf), self.group_cond)
                    loss_d = (
                        loss_d
                        + F.binary_cross_entropy_with_logits(sr, torch.ones_like(sr))
                        + (F.binary_cross_entropy_with_logits(sf, torch.zeros_like(sf)))
                    )
            self.opt_d.zero_grad(set_to_none=True)
            loss_d.backward()
            self.opt_d.step()

        # --- generator: k steps of eq. 4 (or the plain GAN / WGAN generator loss) ---
        for _ in range(int(h["g_steps"])):
            xf, raw = self.fake_batch()
            if self.wgan:
                loss_g = -model.discriminator(xf, cond).mean()
                ent = kl = torch.zeros(())
            else:
                lf_ = model.discriminator(xf, cond)
                loss_g = F.binary_cross_entropy_with_logits(lf_, torch.ones_like(lf_))
                ent = kl = torch.zeros(())
                if self.smmsg:
                    assert model.set_discriminator is not None
                    sf = model.set_discriminator(self.groups(xf), self.group_cond)
                    loss_g = loss_g + F.binary_cross_entropy_with_logits(sf, torch.ones_like(sf))
                    xr = self.real_batch()
                    probs = xf
                    if model.layout.blocks:  # expected proportions: softmax of the logits
                        probs = xf.clone()
                        for s_, e_ in model.layout.blocks:
                            probs[:, s_:e_] = F.softmax(raw[:, s_:e_], dim=1)
                    vg = group_statistics(
                        xf.view(n_s, b, -1), model.layout, self.centres, self.width, probs.view(n_s, b, -1)
                    )
                    vr = group_statistics(xr.view(n_s, b, -1), model.layout, self.centres, self.width)
                    # Columns' statistics are taken as independent: H and KL of the product
                    # are the sums over columns; averaged over scenarios.
                    ent = torch.stack([_entropy(q) for q in vg]).sum(0).mean()
                    kl = torch.stack([_kl(p, q) for p, q in zip(vr, vg, strict=True)]).sum(0).mean()
                    alpha = float(h["alpha"])
                    frac = float(h["alpha_anneal"])
                    if frac > 0:
                        alpha *= max(0.0, 1.0 - step / max(1.0, frac * self.total_steps))
                    loss_g = loss_g - alpha * ent + float(h["beta"]) * kl
            self.opt_g.zero_grad(set_to_none=True)
            loss_g.backward()
            self.opt_g.step()
            if model.generator_ema is not None:
                model._update_ema(step)
        return {"loss_d": loss_d, "loss_g": loss_g, "entropy": ent, "kl": kl}



class GANSMMSGPopulation(GANPopulation):
    """GAN-SMMSG: instance + group discriminator, entropy bonus and KL guide (eq. 4)."""

    name: ClassVar[str] = "gan-smmsg"
    variant: ClassVar[str] = "gan-smmsg"


class WGANPopulation(GANPopulation):
    """WGAN-GP baseline."""

    name: ClassVar[str] = "wgan"
    variant: ClassVar[str] = "wgan"
