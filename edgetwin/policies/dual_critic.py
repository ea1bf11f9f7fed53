"""Dual-critic PPO (seed 000, PFRL-DM, eqs. 10-17) on top of SB3's PPO.

Each client keeps two critics: a **local** critic ``V_φ`` (SB3's own value branch) and a **public**
critic ``V_ψ`` that federated aggregation averages across sites. The value PPO uses for its
advantages is (eq. 14)::

    V(s) = α V_φ(s) + (1 - α) V_ψ(s),      α = exp(-L_φ) / (exp(-L_φ) + exp(-L_ψ))   (eq. 15)

where ``L_φ, L_ψ`` are the critics' mean squared errors against the returns of the rollout in the
buffer, re-evaluated whenever the parameters change (§4.3): before every update on the fresh
rollout, and when a global model is installed (`DualCriticPolicy.load_public_critic`), on the rollout
the client last trained on, so that the next rollout's advantages already use the new weighting.
Both critics regress on the returns independently (eqs. 16-17); the actor is PPO's clipped
objective (eqs. 10-13).

Built from SB3's extension points, not a copy of its PPO: the policy is an
:class:`~stable_baselines3.common.policies.ActorCriticPolicy` with a second critic; the critics'
losses go in through :class:`~edgetwin.policies.regularised.AuxLossAdam` (the combined value that
PPO's own value loss sees is detached, so it only logs); the rollout buffer remembers the minibatch
it last handed out so that the policy can read its returns. The action-norm regulariser of seed 004
is available here too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

import numpy as np
import torch as th
from stable_baselines3 import PPO
from stable_baselines3.common.buffers import RolloutBuffer
from stable_baselines3.common.policies import ActorCriticPolicy, BaseModel
from stable_baselines3.common.torch_layers import MlpExtractor
from stable_baselines3.common.type_aliases import RolloutBufferSamples
from torch import nn

from edgetwin.policies.regularised import ActionNormMixin, _aux_optimizer_kwargs


class SampleTrackingRolloutBuffer(RolloutBuffer):
    """A RolloutBuffer that remembers the minibatch it last returned (the policy reads its returns)."""

    last_samples: RolloutBufferSamples | None = None

    def _get_samples(self, batch_inds: np.ndarray, env: Any = None) -> RolloutBufferSamples:
        samples = super()._get_samples(batch_inds, env)
        self.last_samples = samples
        return samples


class DualCriticPolicy(ActionNormMixin, ActorCriticPolicy):
    """Actor-critic policy with a local and a public critic of the same architecture.

    Args:
        action_norm_lambda: λ of the seed 004 eq. 8 regulariser (0 = off, the default here).
        alpha_temperature: divides the losses in eq. 15 (1 = the paper); larger keeps α away from 0/1
            when returns are large.
        vf_coef: weight of the two critics' losses (PPO's ``vf_coef``; set by :class:`DualCriticPPO`).
        *args, **kwargs: as :class:`~stable_baselines3.common.policies.ActorCriticPolicy`.
    """

    alpha: th.Tensor  # eq. 15's weight, a registered buffer (saved with the state dict)

    def __init__(
        self,
        *args: Any,
        action_norm_lambda: float = 0.0,
        alpha_temperature: float = 1.0,
        vf_coef: float = 0.5,
        **kwargs: Any,
    ) -> None:
        self.action_norm_lambda = float(action_norm_lambda)
        self.alpha_temperature = float(alpha_temperature)
        self.vf_coef = float(vf_coef)
        self._init_aux()
        self._buffer: SampleTrackingRolloutBuffer | None = None
        super().__init__(*args, **_aux_optimizer_kwargs(kwargs))
        self._hook_optimizer()

    def _build(self, lr_schedule: Any) -> None:
        # The public critic must exist before SB3 builds the optimizer over self.parameters().
        twin = MlpExtractor(self.features_dim, self.net_arch, self.activation_fn, self.device)
        self.public_critic = nn.ModuleDict({"body": twin.value_net, "head": nn.Linear(twin.latent_dim_vf, 1)})
        self.register_buffer("alpha", th.tensor(0.5))
        super()._build(lr_schedule)
        if self.ortho_init:
            self.public_critic["body"].apply(lambda m: self.init_weights(m, gain=np.sqrt(2)))
            self.public_critic["head"].apply(lambda m: self.init_weights(m, gain=1.0))

    def _get_constructor_parameters(self) -> dict[str, Any]:
        data = super()._get_constructor_parameters()
        data.update(
            action_norm_lambda=self.action_norm_lambda,
            alpha_temperature=self.alpha_temperature,
            vf_coef=self.vf_coef,
        )
        return data

    # --- the two critics -----------------------------------------------------------------------
    def _vf_features(self, obs: Any) -> th.Tensor:
        # BaseModel's extractor (as SB3's predict_values does), whether or not features are shared
        return BaseModel.extract_features(self, obs, self.vf_features_extractor)  # type: ignore[return-value]

    def local_value(self, obs: Any) -> th.Tensor:
        """``V_φ(s)``: (B, 1)."""
        return self.value_net(self.mlp_extractor.forward_critic(self._vf_features(obs)))

    def public_value(self, obs: Any) -> th.Tensor:
        """``V_ψ(s)``: (B, 1)."""
        return self.public_critic["head"](self.public_critic["body"](self._vf_features(obs)))

    def _combine(self, local: th.Tensor, public: th.Tensor) -> th.Tensor:
        return self.alpha * local + (1.0 - self.alpha) * public

    # --- SB3 entry points: every value SB3 sees is the combination of eq. 14 --------------------
    def forward(self, obs: th.Tensor, deterministic: bool = False) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        actions, local, log_prob = super().forward(obs, deterministic)
        return actions, self._combine(local, self.public_value(obs)), log_prob

    def predict_values(self, obs: Any) -> th.Tensor:
        return self._combine(super().predict_values(obs), self.public_value(obs))

    def evaluate_actions(self, obs: Any, actions: th.Tensor) -> tuple[th.Tensor, th.Tensor, th.Tensor | None]:
        local, log_prob, entropy = super().evaluate_actions(obs, actions)
        public = self.public_value(obs)
        samples = None if self._buffer is None else self._buffer.last_samples
        if self.training and samples is not None and samples.observations is obs:
            returns = samples.returns.flatten()
            # eqs. 16-17: each critic regresses on the returns by itself
            loss_local = th.nn.functional.mse_loss(local.flatten(), returns)
            loss_public = th.nn.functional.mse_loss(public.flatten(), returns)
            self.add_aux_loss("local_critic_loss", self.vf_coef * loss_local)
            self.add_aux_loss("public_critic_loss", self.vf_coef * loss_public)
            # PPO's own value loss sees the combination detached: it logs, the critics learn above
            return self._combine(local, public).detach(), log_prob, entropy
        return self._combine(local, public), log_prob, entropy

    # --- α (eq. 15) --------------------------------------------------------------------------
    @th.no_grad()
    def critic_losses(
        self, observations: th.Tensor, returns: th.Tensor, batch_size: int = 4096
    ) -> tuple[float, float]:
        """Mean squared errors ``(L_φ, L_ψ)`` of the two critics against ``returns`` (B,)."""
        sq_l, sq_p, n = 0.0, 0.0, 0
        for i in range(0, len(returns), batch_size):
            o, r = observations[i : i + batch_size], returns[i : i + batch_size].flatten()
            sq_l += float(((self.local_value(o).flatten() - r) ** 2).sum())
            sq_p += float(((self.public_value(o).flatten() - r) ** 2).sum())
            n += len(r)
        return sq_l / max(n, 1), sq_p / max(n, 1)

    def buffer_returns(self) -> tuple[th.Tensor, th.Tensor] | None:
        """``(observations (B, O), returns (B,))`` of the rollout in the buffer, or None if it holds none."""
        buf = self._buffer
        if buf is None or not (buf.full or buf.generator_ready):
            return None
        # SB3 flattens the buffer in place the first time it is sampled (generator_ready).
        flat = (lambda a: a) if buf.generator_ready else buf.swap_and_flatten
        obs = th.as_tensor(flat(buf.observations), device=self.device)
        returns = th.as_tensor(flat(buf.returns), device=self.device).flatten()
        return obs, returns

    def refresh_alpha(self) -> tuple[float, float, float] | None:
        """Eq. 15 on the buffer's rollout: ``(alpha, L_local, L_public)``, or None without a rollout."""
        data = self.buffer_returns()
        if data is None:
            return None
        was_training = self.training
        self.set_training_mode(False)
        loss_local, loss_public = self.critic_losses(*data)
        self.set_training_mode(was_training)
        return self.update_alpha(loss_local, loss_public), loss_local, loss_public

    def update_alpha(self, loss_local: float, loss_public: float) -> float:
        """Eq. 15 (a softmax of the negated losses, computed stably)."""
        z = -np.array([loss_local, loss_public]) / self.alpha_temperature
        z -= z.max()
        w = np.exp(z)
        self.alpha.fill_(float(w[0] / w.sum()))
        return float(self.alpha)

    # --- federation --------------------------------------------------------------------------
    def public_critic_parameters(self) -> dict[str, th.Tensor]:
        """The public critic's weights (CPU copies), what the server aggregates."""
        return {k: v.detach().cpu().clone() for k, v in self.public_critic.state_dict().items()}

    def local_critic_parameters(self) -> dict[str, th.Tensor]:
        """The local critic's weights, keyed like :meth:`public_critic_parameters`."""
        body = {f"body.{k}": v for k, v in self.mlp_extractor.value_net.state_dict().items()}
        head = {f"head.{k}": v for k, v in self.value_net.state_dict().items()}
        return {k: v.detach().cpu().clone() for k, v in {**body, **head}.items()}

    def load_public_critic(self, state: Mapping[str, Any], shift_local: bool = True) -> None:
        """Install an aggregated public critic (seed 000, Algorithm 1, lines 7-9).

        Args:
            state: weights keyed like :meth:`public_critic_parameters` (tensors or arrays).
            shift_local: first copy the current public critic into the local one, as Algorithm 1
                does; False keeps the local critic as it is.

        Then α is re-evaluated by eq. 15 on the rollout still in the buffer (line 9), if any.
        """
        tensors = {
            k: th.as_tensor(np.asarray(v), dtype=th.float32, device=self.device) for k, v in state.items()
        }
        expected = set(self.public_critic.state_dict())
        if set(tensors) != expected:
            raise ValueError(f"public critic keys differ: expected {sorted(expected)}, got {sorted(tensors)}")
        if shift_local:
            self.mlp_extractor.value_net.load_state_dict(self.public_critic["body"].state_dict())
            self.value_net.load_state_dict(self.public_critic["head"].state_dict())
        self.public_critic.load_state_dict(tensors)
        self.refresh_alpha()


class DualCriticPPO(PPO):
    """PPO with a local and a public critic (seed 000). Arguments as :class:`stable_baselines3.PPO`.

    Args:
        alpha_temperature: see :class:`DualCriticPolicy`.
        action_norm_lambda: the seed 004 eq. 8 regulariser on the actor (0 = off).
    """

    policy_aliases = {"MlpPolicy": DualCriticPolicy}  # noqa: RUF012 - SB3's own convention

    def __init__(
        self,
        policy: str | type[DualCriticPolicy] = "MlpPolicy",
        env: Any = None,
        alpha_temperature: float = 1.0,
        action_norm_lambda: float = 0.0,
        **kwargs: Any,
    ) -> None:
        policy_kwargs = dict(kwargs.pop("policy_kwargs", None) or {})
        policy_kwargs.setdefault("alpha_temperature", alpha_temperature)
        policy_kwargs.setdefault("action_norm_lambda", action_norm_lambda)
        policy_kwargs.setdefault("vf_coef", kwargs.get("vf_coef", 0.5))
        kwargs.setdefault("rollout_buffer_class", SampleTrackingRolloutBuffer)
        super().__init__(policy, env, policy_kwargs=policy_kwargs, **kwargs)

    def _setup_model(self) -> None:
        super()._setup_model()
        if not isinstance(self.rollout_buffer, SampleTrackingRolloutBuffer):
            raise TypeError("DualCriticPPO needs a SampleTrackingRolloutBuffer")
        cast(DualCriticPolicy, self.policy)._buffer = self.rollout_buffer

    def train(self) -> None:
        policy = cast(DualCriticPolicy, self.policy)
        refreshed = policy.refresh_alpha()  # the parameters changed since the last rollout
        if refreshed is not None:
            alpha, loss_local, loss_public = refreshed
            self.logger.record("train/alpha", alpha)
            self.logger.record("train/local_critic_mse", loss_local)
            self.logger.record("train/public_critic_mse", loss_public)
        super().train()
        for k, v in policy.pop_aux_log().items():
            self.logger.record(f"train/{k}", v)

    def public_critic_parameters(self) -> dict[str, th.Tensor]:
        return cast(DualCriticPolicy, self.policy).public_critic_parameters()

    def load_public_critic(self, state: Mapping[str, Any], shift_local: bool = True) -> None:
        cast(DualCriticPolicy, self.policy).load_public_critic(state, shift_local)
