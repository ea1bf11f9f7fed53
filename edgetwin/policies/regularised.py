"""Extra loss terms for SB3's on-policy algorithms, and the action-norm regulariser of seed 004 eq. 8.

Seed 004 trains its policy in the learned simulator with ``... + λ/|S| Σ_s |π(s)|²`` (eq. 8,
λ = 0.4): a penalty on the size of the policy's action that keeps it near the centre of the action
range the logs cover, where the twin is trustworthy, instead of exploiting its errors at the edges.

SB3's ``train()`` methods (PPO, A2C, MaskablePPO, RecurrentPPO) are closed loops that build
``loss = policy + ent + vf`` and then call ``optimizer.zero_grad(); loss.backward(); step()``. Rather
than copy them to add a term, the policies here use :class:`AuxLossAdam`: an Adam whose
``zero_grad()`` back-propagates the auxiliary loss that the policy recorded during the same
minibatch's ``evaluate_actions``. ``loss.backward()`` then accumulates onto it, so the clipped
gradient SB3 steps with is exactly ``∇(loss + aux)``.

The penalty is on the mean of the Gaussian (the deterministic action) in the policy's own action
space, which `edgetwin.policies.train` rescales to [-1, 1]: ``|π(s)|²`` is then scale-free. It
applies to continuous (Box) actions; for discrete actions it is 0.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch as th
from gymnasium import spaces
from sb3_contrib.common.recurrent.policies import RecurrentActorCriticPolicy
from stable_baselines3.common.distributions import Distribution
from stable_baselines3.common.policies import ActorCriticPolicy

#: Default λ of seed 004 eq. 8.
ACTION_NORM_LAMBDA = 0.4


class AuxLossAdam(th.optim.Adam):
    """Adam that back-propagates an auxiliary loss each time SB3 zeroes the gradients.

    ``aux_loss_source`` is set by the owning policy; it returns the loss recorded for the current
    minibatch (or None). ``retain_graph`` keeps the shared forward graph for SB3's own backward.
    """

    aux_loss_source: Callable[[], th.Tensor | None] | None = None

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        if self.aux_loss_source is not None:
            aux = self.aux_loss_source()
            if aux is not None and aux.requires_grad:
                aux.backward(retain_graph=True)


class AuxLossMixin:
    """Lets a policy add loss terms during ``evaluate_actions`` (training mode only).

    Subclasses call :meth:`add_aux_loss` while the policy is in training mode; the terms are
    summed, handed to :class:`AuxLossAdam` at the next ``zero_grad`` and forgotten.
    :attr:`aux_log` keeps running means of each term for logging (``train/<name>``).
    """

    optimizer: th.optim.Optimizer
    training: bool

    def _init_aux(self) -> None:
        self._aux_terms: dict[str, th.Tensor] = {}
        self.aux_log: dict[str, list[float]] = {}

    def add_aux_loss(self, name: str, value: th.Tensor) -> None:
        self._aux_terms[name] = value
        self.aux_log.setdefault(name, []).append(float(value.detach()))

    def _pop_aux_loss(self) -> th.Tensor | None:
        if not self._aux_terms:
            return None
        total = sum(self._aux_terms.values())
        self._aux_terms = {}
        return total  # type: ignore[return-value]

    def _hook_optimizer(self) -> None:
        if isinstance(self.optimizer, AuxLossAdam):
            self.optimizer.aux_loss_source = self._pop_aux_loss

    def pop_aux_log(self) -> dict[str, float]:
        """Mean of each auxiliary term since the last call (and reset)."""
        out = {k: sum(v) / len(v) for k, v in self.aux_log.items() if v}
        self.aux_log = {}
        return out


def _aux_optimizer_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    kwargs.setdefault("optimizer_class", AuxLossAdam)
    if kwargs["optimizer_class"] is AuxLossAdam and kwargs.get("optimizer_kwargs") is None:
        kwargs["optimizer_kwargs"] = {"eps": 1e-5}  # SB3's default for Adam in on-policy algorithms
    return kwargs


class ActionNormMixin(AuxLossMixin):
    """Adds ``λ · mean_s |μ(s)|²`` (seed 004 eq. 8) for Box action spaces while training."""

    action_space: spaces.Space
    action_norm_lambda: float

    def _get_action_dist_from_latent(self, latent_pi: th.Tensor, *args: Any, **kwargs: Any) -> Distribution:
        dist = super()._get_action_dist_from_latent(latent_pi, *args, **kwargs)  # type: ignore[misc]
        if self.training and self.action_norm_lambda > 0 and isinstance(self.action_space, spaces.Box):
            mean = dist.mode()  # the Gaussian's mean: π(s) as a deterministic action
            self.add_aux_loss("action_norm_loss", self.action_norm_lambda * (mean**2).sum(dim=-1).mean())
        return dist


class RegularisedActorCriticPolicy(ActionNormMixin, ActorCriticPolicy):
    """SB3's ``MlpPolicy`` for PPO / A2C with the action-norm regulariser (λ = 0.4 by default).

    Args:
        action_norm_lambda: λ of seed 004 eq. 8; 0 turns it off.
        *args, **kwargs: as :class:`stable_baselines3.common.policies.ActorCriticPolicy`.
    """

    def __init__(self, *args: Any, action_norm_lambda: float = ACTION_NORM_LAMBDA, **kwargs: Any) -> None:
        self.action_norm_lambda = float(action_norm_lambda)
        self._init_aux()
        super().__init__(*args, **_aux_optimizer_kwargs(kwargs))
        self._hook_optimizer()

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data["action_norm_lambda"] = self.action_norm_lambda
        return data


class RegularisedRecurrentPolicy(ActionNormMixin, RecurrentActorCriticPolicy):
    """sb3-contrib's ``MlpLstmPolicy`` for RecurrentPPO with the action-norm regulariser."""

    def __init__(self, *args: Any, action_norm_lambda: float = ACTION_NORM_LAMBDA, **kwargs: Any) -> None:
        self.action_norm_lambda = float(action_norm_lambda)
        self._init_aux()
        super().__init__(*args, **_aux_optimizer_kwargs(kwargs))
        self._hook_optimizer()

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data["action_norm_lambda"] = self.action_norm_lambda
        return data
