"""Priority-weighted softmax action selection (seed 001, WA3C, eq. 10) as an SB3 policy option.

WA3C picks option ``j`` with probability ``exp(Q(s, j) + β P_j) / Σ_k exp(Q(s, k) + β P_k)``,
``β = 2``: the learned preference plus a fixed bonus for urgent options. In an SB3 actor-critic the
actor's logits play the role of ``Q(s, ·)``; :class:`PriorityWeightedPolicy` adds ``β P(s)`` to them
before the categorical distribution is formed, so sampling, log-probabilities, entropy and PPO's
ratio all use the priority-weighted softmax. ``P(s)`` comes from the observation as the policy sees
it (after any observation normalisation) through :class:`PriorityScores`:

* ``option_columns``: one observation column per option holding that option's priority (a queue of
  jobs, one slot per option: WA3C's setting), or
* ``job_column`` × ``option_weights``: the agent's own priority times a fixed weight per option
  (per-agent placement: urgent agents lean towards, e.g., the faster targets).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch as th
from gymnasium import spaces
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.type_aliases import PyTorchObs

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import TwinSpec

#: β of seed 001 eq. 10.
PRIORITY_BETA = 2.0


@dataclass(frozen=True)
class PriorityScores:
    """``P(s)``: (B, K) priority of each of the K options, from observation columns (by index).

    Give ``option_columns`` (K indices), or ``job_column`` with ``option_weights`` (K weights).
    """

    option_columns: tuple[int, ...] | None = None
    job_column: int | None = None
    option_weights: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        by_option = self.option_columns is not None
        by_job = self.job_column is not None and self.option_weights is not None
        if by_option == by_job:
            raise InputError("priority: give option_columns, or job_column with option_weights", "priority")

    @property
    def n_options(self) -> int:
        return len(self.option_columns if self.option_columns is not None else self.option_weights)  # type: ignore[arg-type]

    def __call__(self, obs: th.Tensor) -> th.Tensor:
        obs = obs.float().reshape(obs.shape[0], -1)
        if self.option_columns is not None:
            return obs[:, list(self.option_columns)]
        w = th.as_tensor(self.option_weights, dtype=obs.dtype, device=obs.device)
        return obs[:, [self.job_column]] * w[None, :]

    @classmethod
    def from_spec(
        cls,
        spec: TwinSpec,
        option_columns: Sequence[str] | None = None,
        job_column: str | None = None,
        option_weights: Sequence[float] | None = None,
    ) -> PriorityScores:
        """The same, naming the spec's observation columns instead of indices."""
        cols = spec.observation_columns

        def idx(c: str) -> int:
            if c not in cols:
                raise InputError(f"priority column {c!r} is not an observation column ({cols})", "priority")
            return cols.index(c)

        return cls(
            option_columns=None if option_columns is None else tuple(idx(c) for c in option_columns),
            job_column=None if job_column is None else idx(job_column),
            option_weights=None if option_weights is None else tuple(float(w) for w in option_weights),
        )


class PrioritySoftmaxMixin:
    """Adds ``β P(s)`` to the logits of a Discrete action distribution (eq. 10)."""

    action_space: spaces.Space
    action_net: th.nn.Module
    action_dist: Any
    priority: PriorityScores
    priority_beta: float

    def _init_priority(
        self, action_space: spaces.Space, priority: PriorityScores | None, beta: float
    ) -> None:
        if not isinstance(action_space, spaces.Discrete):
            raise InputError("priority-weighted softmax needs a Discrete action space (options)", "priority")
        if priority is None:
            raise InputError("priority-weighted softmax needs PriorityScores", "priority")
        if priority.n_options != int(action_space.n):
            raise InputError(
                f"priority gives {priority.n_options} options, the action space has {action_space.n}",
                "priority",
            )
        self.priority = priority
        self.priority_beta = float(beta)
        self._prio_obs: PyTorchObs | None = None

    # Every path to a distribution starts from one of these three; remember the observation.
    def forward(self, obs: th.Tensor, *args: Any, **kwargs: Any) -> Any:
        self._prio_obs = obs
        return super().forward(obs, *args, **kwargs)  # type: ignore[misc]

    def evaluate_actions(self, obs: PyTorchObs, *args: Any, **kwargs: Any) -> Any:
        self._prio_obs = obs
        return super().evaluate_actions(obs, *args, **kwargs)  # type: ignore[misc]

    def get_distribution(self, obs: PyTorchObs, *args: Any, **kwargs: Any) -> Any:
        self._prio_obs = obs
        return super().get_distribution(obs, *args, **kwargs)  # type: ignore[misc]

    def priority_logits(self, latent_pi: th.Tensor) -> th.Tensor:
        """``Q(s, ·) + β P(s)``: (B, K)."""
        assert self._prio_obs is not None, "a distribution was asked for without an observation"
        obs = cast(th.Tensor, self._prio_obs)  # options need a flat (Box) observation, not a Dict
        return self.action_net(latent_pi) + self.priority_beta * self.priority(obs)

    # A Distribution under ActorCriticPolicy, a MaskableDistribution under MaskableActorCriticPolicy.
    def _get_action_dist_from_latent(self, latent_pi: th.Tensor) -> Any:
        return self.action_dist.proba_distribution(action_logits=self.priority_logits(latent_pi))

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()  # type: ignore[misc]
        data.update(priority=self.priority, priority_beta=self.priority_beta)
        return data


class PriorityWeightedPolicy(PrioritySoftmaxMixin, ActorCriticPolicy):
    """PPO/A2C ``MlpPolicy`` with WA3C's priority-weighted softmax over Discrete options.

    Args:
        observation_space, action_space, lr_schedule: as SB3's ActorCriticPolicy.
        priority: where ``P`` comes from.
        priority_beta: β (2.0 in seed 001).
    """

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        lr_schedule: Any,
        *args: Any,
        priority: PriorityScores | None = None,
        priority_beta: float = PRIORITY_BETA,
        **kwargs: Any,
    ) -> None:
        self._init_priority(action_space, priority, priority_beta)
        super().__init__(observation_space, action_space, lr_schedule, *args, **kwargs)


class MaskablePriorityWeightedPolicy(PrioritySoftmaxMixin, MaskableActorCriticPolicy):
    """MaskablePPO's policy with the priority-weighted softmax; masks apply after the bonus."""

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        lr_schedule: Any,
        *args: Any,
        priority: PriorityScores | None = None,
        priority_beta: float = PRIORITY_BETA,
        **kwargs: Any,
    ) -> None:
        self._init_priority(action_space, priority, priority_beta)
        super().__init__(observation_space, action_space, lr_schedule, *args, **kwargs)
