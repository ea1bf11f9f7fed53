"""The causal response model, federated: sites send per-policy sums and gradients, never a row.

`edgetwin.imitation.causal.CausalResponseModel` minimises a loss that depends on the rows only
through per-policy sums of the residuals ``r = y - F(x)`` (count, Σr, Σr² per output:
`group_sums`, `invariance_loss`). So the federated fit runs the same optimiser (Adam with a cosine
schedule, the same initial weights for the same seed) on the *pooled* loss, exactly, with two
rounds per step, per ensemble member, after the behaviour-cloning phase (whose engine models the
twin keeps):

1. ``causal_sums``: the coordinator sends the client models' weights θ; each site returns, per
   scenario and per logged policy, the sums of its own rows' residuals (a vector of
   ``scenarios x policies x (1 + 2·outputs)``). Summed over sites they are the pooled sums S.
2. ``causal_grad``: the coordinator computes the loss ``L(S)`` (each scenario's model has its own,
   they add up) and ``c = ∂L/∂S`` by autograd, and sends θ and c; each site returns
   ``∇θ Σ c·S_site(θ)`` over its rows. By the chain rule their sum is ``∇θ L``: the gradient of the
   pooled full-batch loss, which the coordinator's Adam steps on.

A last ``causal_sums`` round at the final weights gives each scenario's residual spread (the
model's ``noise_std``), as `CausalResponseModel.fit` measures it on the pooled rows.

The difference from the centralised fit: full batches (the centralised fit draws at most
``batch`` rows per policy per step, so on logs with fewer rows per policy the two take the same
steps, up to float sums), and the k-agent rule: a site leaves out of both rounds every
(scenario, policy) group of its rows that is an aggregate over fewer than ``min_agents`` effective
agents (`effective_agents`), so a randomized arm on a few of a site's service groups does not
count there. Policy ids travel in the ``hello`` (the ids of policies with at least ``min_agents``
agents at the site), as scenario labels do. The sums and gradients are added up by the
coordinator's statistics rule (secure aggregation when the fit is secure); Gaussian DP is not
applied to them, so a causal fit under ``dp_gaussian`` is refused rather than run without it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch as th

from edgetwin.contract.spec import POLICY_COLUMN
from edgetwin.federation.twin.agents import effective_agents
from edgetwin.imitation.causal import CausalResponseModel, group_sums, invariance_loss
from edgetwin.imitation.layout import Layout
from edgetwin.imitation.mail import OUTPUT_CLIP, client_rows
from edgetwin.imitation.steps import StepTable

__all__ = ["UNNAMED_POLICY", "CausalAggregate", "SiteCausal", "causal_modules", "causal_size", "site_policies"]

#: the policy id of rows of a log without a ``policy`` column (one unknown logging policy)
UNNAMED_POLICY = ""


def _effective(agents: np.ndarray) -> float:
    return effective_agents(np.bincount(pd.factorize(agents)[0])) if len(agents) else 0.0


def _policy_of(frame: pd.DataFrame) -> np.ndarray:
    if POLICY_COLUMN not in frame.columns:
        return np.full(len(frame), UNNAMED_POLICY, dtype=object)
    return frame[POLICY_COLUMN].astype(str).to_numpy()


def site_policies(log: pd.DataFrame, min_agents: int) -> list[str]:
    """The policy ids of a site's log that some scenario logged over at least ``min_agents``
    effective agents: the only ones it names in its ``hello`` (a policy of one service group is
    not announced)."""
    pol = _policy_of(log)
    agents = log["agent"].astype(str).to_numpy()
    scen = log["scenario"].astype(str).to_numpy()
    out = set()
    for p in pd.unique(pol):
        for s in pd.unique(scen):
            rows = (pol == p) & (scen == s)
            if _effective(agents[rows]) >= min_agents:
                out.add(str(p))
                break
    return sorted(out)


def causal_modules(layout: Layout, options: Mapping[str, Any], member: int) -> dict[str, th.nn.Sequential]:
    """One untrained MLP per scenario (``causal<s>``), initialised as `Twin.fit` initialises the
    member's `CausalResponseModel` (seed ``seed·1000 + member + s``): every party builds the same."""
    return {
        f"causal{s}": _model(options, member, s).init_net(layout.n_client_inputs, layout.n_model_outputs)
        for s in range(len(layout.scenarios))
    }


def _model(options: Mapping[str, Any], member: int, s: int) -> CausalResponseModel:
    return CausalResponseModel(tuple(int(h) for h in options["net_arch"]), invariance=float(options["invariance"]),
                               steps=int(options["causal_steps"]), lr=float(options["causal_lr"]),
                               seed=int(options["seed"]) * 1000 + member + s)


def causal_size(layout: Layout, options: Mapping[str, Any]) -> int:
    """Parameters of every scenario's model (the ``causal_grad`` vector's size), counted without
    building one (building seeds torch's global generator, which a site's thread may be using)."""
    widths = [layout.n_client_inputs, *(int(h) for h in options["net_arch"]), layout.n_model_outputs]
    per_model = sum(a * b + b for a, b in zip(widths, widths[1:], strict=False))
    return int(per_model * len(layout.scenarios))


def _vector(mods: Mapping[str, th.nn.Module]) -> np.ndarray:
    from edgetwin.federation.twin.mail import module_vector

    return module_vector(mods)


def _load(mods: Mapping[str, th.nn.Module], vector: np.ndarray) -> None:
    from edgetwin.federation.twin.mail import load_module_vector

    load_module_vector(mods, vector)


# ------------------------------------------------------------------------------------ site side
class SiteCausal:
    """One site's rows of one member, grouped by (scenario, policy) for the two rounds.

    Args:
        steps: the member's step table of this site's log.
        layout: the federated layout.
        policies: the fit's policy ids (the union of the sites' announcements), in order.
        min_agents: groups over fewer effective agents are left out (module docstring).
        options: the fit's options (architecture, seed).
        member: the ensemble member.
    """

    def __init__(self, steps: StepTable, layout: Layout, policies: Sequence[str], min_agents: int,
                 options: Mapping[str, Any], member: int) -> None:
        self.n_scen, self.n_pol, self.out = len(layout.scenarios), len(policies), layout.n_model_outputs
        self.mods = causal_modules(layout, options, member)
        index = {p: k for k, p in enumerate(policies)}
        pol = _policy_of(steps.frame)
        agents = steps.frame["agent"].astype(str).to_numpy()
        #: (scenario, policy index, x (n, in), y (n, out)) of every group this site may count
        self.groups: list[tuple[int, int, th.Tensor, th.Tensor]] = []
        for s in range(self.n_scen):
            rows = client_rows(steps, layout, s)
            for p in pd.unique(pol[rows]):
                k = index.get(str(p))
                g = rows[pol[rows] == p]
                if k is None or len(g) < 2 or _effective(agents[g]) < min_agents:
                    continue
                y = np.clip(steps.y_client[g], -OUTPUT_CLIP, OUTPUT_CLIP).astype(np.float32)
                self.groups.append((s, k, th.from_numpy(np.ascontiguousarray(steps.x_client[g])), th.from_numpy(y)))

    def _sums(self) -> th.Tensor:
        """``(scenarios, policies, 1 + 2·out)`` float64, differentiable in the models' weights."""
        zero = th.zeros(1 + 2 * self.out, dtype=th.float64)
        cells: dict[tuple[int, int], th.Tensor] = {}
        for s, k, x, y in self.groups:
            r = (y - self.mods[f"causal{s}"](x)).double()
            cells[(s, k)] = group_sums([r])[0]
        return th.stack([cells.get((s, k), zero) for s in range(self.n_scen) for k in range(self.n_pol)]).reshape(
            self.n_scen, self.n_pol, -1)

    def sums(self, params: np.ndarray) -> np.ndarray:
        """The ``causal_sums`` answer at weights ``params``."""
        _load(self.mods, params)
        with th.no_grad():
            return self._sums().numpy().ravel()

    def gradient(self, params: np.ndarray, coefficients: np.ndarray) -> np.ndarray:
        """The ``causal_grad`` answer: ``∇θ Σ c·S_site(θ)`` over this site's groups, flat as `_vector`."""
        _load(self.mods, params)
        for m in self.mods.values():
            m.zero_grad(set_to_none=False)
        c = th.as_tensor(np.asarray(coefficients, np.float64).reshape(self.n_scen, self.n_pol, 1 + 2 * self.out))
        if self.groups:
            (c * self._sums()).sum().backward()
        return np.concatenate([
            (p.grad if p.grad is not None else th.zeros_like(p)).detach().numpy().ravel()
            for k in sorted(self.mods) for _, p in self.mods[k].named_parameters()
        ]).astype(np.float32)


# ------------------------------------------------------------------------------------ coordinator side
class CausalAggregate:
    """The coordinator's optimiser of one member's causal models: the same Adam and cosine schedule
    as `CausalResponseModel.fit`, stepping on the gradient of the pooled loss."""

    def __init__(self, layout: Layout, options: Mapping[str, Any], member: int, policies: Sequence[str]) -> None:
        self.layout, self.options, self.member = layout, dict(options), member
        self.n_scen, self.n_pol, self.out = len(layout.scenarios), len(policies), layout.n_model_outputs
        self.mods = causal_modules(layout, options, member)
        self.params = [p for k in sorted(self.mods) for _, p in self.mods[k].named_parameters()]
        self.opt = th.optim.Adam(self.params, lr=float(options["causal_lr"]))
        self.sched = th.optim.lr_scheduler.CosineAnnealingLR(self.opt, int(options["causal_steps"]))
        self.invariance = float(options["invariance"])
        self.history: list[dict[str, float]] = []

    def vector(self) -> np.ndarray:
        return _vector(self.mods)

    def coefficients(self, total_sums: np.ndarray, step: int) -> np.ndarray:
        """``∂L/∂S`` of the pooled sums (every scenario's loss added up), flat as the sums."""
        sums = th.as_tensor(np.asarray(total_sums, np.float64).reshape(self.n_scen, self.n_pol, -1)).requires_grad_(True)
        parts = [invariance_loss(sums[s], self.invariance) for s in range(self.n_scen)]
        loss = th.stack([p[0] for p in parts]).sum()
        if step % 50 == 0 or step == int(self.options["causal_steps"]) - 1:
            self.history.append({"step": float(step), "error": float(sum(float(p[1]) for p in parts)),
                                 "penalty": float(sum(float(p[2]) for p in parts))})
        if not loss.requires_grad:  # no group anywhere: nothing to learn
            return np.zeros(sums.numel(), np.float32)
        (grad,) = th.autograd.grad(loss, sums)
        grad[..., 0] = 0.0  # counts do not depend on the weights
        return grad.numpy().ravel().astype(np.float32)

    def step(self, total_gradient: np.ndarray) -> None:
        """One Adam step on the pooled gradient (the sites' answers summed)."""
        g = np.asarray(total_gradient, np.float32)
        i = 0
        for p in self.params:
            n = p.numel()
            p.grad = th.as_tensor(g[i : i + n].reshape(tuple(p.shape)).copy())
            i += n
        self.opt.step()
        self.sched.step()

    def models(self, total_sums: np.ndarray) -> dict[int, CausalResponseModel]:
        """The fitted models, each with its residual spread over the pooled rows (``noise_std``,
        population std as `CausalResponseModel.fit` measures it). A scenario no site could count
        gets the spread 1 (its outputs are standardised)."""
        sums = np.asarray(total_sums, np.float64).reshape(self.n_scen, self.n_pol, -1)
        out = {}
        for s in range(self.n_scen):
            n = sums[s, :, 0].sum()
            s1, s2 = sums[s, :, 1 : 1 + self.out].sum(0), sums[s, :, 1 + self.out :].sum(0)
            std = np.sqrt(np.maximum(s2 / n - (s1 / n) ** 2, 0.0)) if n > 0 else np.ones(self.out)
            m = _model(self.options, self.member, s)
            m.net = self.mods[f"causal{s}"]
            m.chosen = self.invariance  # fixed λ: the federated fit does not cross-fit (no held-out rows leave a site)
            m.noise_std = std.astype(np.float32)
            m.history = [(h["error"], h["penalty"]) for h in self.history]
            out[s] = m
        return out
