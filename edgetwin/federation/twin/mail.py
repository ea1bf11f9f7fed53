"""MAIL's adversarial rounds, federated: each site runs GAIL on its own logs, the coordinator averages.

After the federated behaviour-cloning phase (`edgetwin.federation.twin.fit`, phase ``weights``),
a member's client models are refined adversarially as `edgetwin.imitation.mail.fit_mail` refines
them centrally, in rounds of phase ``adversarial``:

1. the coordinator sends the global client policies (PPO actor-critic: actor, critic, ``log_std``)
   and one discriminator per scenario (imitation's `BasicRewardNet`), plus the member's fixed
   engine policies;
2. each site loads them into its *own* GAIL trainers, built once per member with the same entry
   points as the centralised fit (`training_world`, `client_learners`, `gail_trainers`) on its
   own rows: its training world is drawn from its own logged site units, populated from its own
   logged profiles and initial states (they never leave it), and the demonstrations are its own
   logged client steps; it runs one `gail_round` per scenario (PPO on the discriminator's reward,
   then discriminator updates) and sends back the change of every parameter;
3. the coordinator aggregates the changes with the weight rule (FedAvg by default; FedAvgM,
   secure aggregation, Gaussian DP) **per scenario**: each scenario's block of a site's change is
   scaled by the site's share of that scenario's logged rows and the shares are appended, as in
   the ``weights`` phase (`TwinAssembler.apply_blocks`), so a site without agents of a scenario
   neither pulls its models nor its discriminator.

What travels is parameters only: the vector's size follows from the layout and the architectures
(`adversarial_size`), never from a site's rows. A site keeps its optimisers' state (PPO's and the
discriminator's Adam moments) between rounds, as a FedAvg client usually does.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import torch as th
from imitation.algorithms.adversarial.gail import GAIL
from imitation.rewards.reward_nets import BasicRewardNet
from stable_baselines3.common.policies import ActorCriticPolicy
from stable_baselines3.common.utils import set_random_seed
from torch import nn

from edgetwin.contract.spec import TwinSpec
from edgetwin.generative.fitting import agent_profiles
from edgetwin.imitation.layout import Layout
from edgetwin.imitation.mail import (
    GaussianModel,
    MailConfig,
    client_learners,
    client_rows,
    gail_round,
    gail_trainers,
    gaussian_policy,
    training_world,
)
from edgetwin.imitation.steps import StepTable
from edgetwin.imitation.world import Composition, InitialStates
from edgetwin.twin.twin import EmpiricalPopulation, PopulationSampler

__all__ = [
    "SiteAdversarial",
    "adversarial_templates",
    "load_module_vector",
    "module_blocks",
    "module_vector",
]


# ------------------------------------------------------------------------------------ vectors
def module_vector(mods: Mapping[str, nn.Module]) -> np.ndarray:
    """Every parameter of ``mods`` (sorted by key, then in `named_parameters` order) as float32."""
    return np.concatenate(
        [p.detach().cpu().numpy().ravel() for k in sorted(mods) for _, p in mods[k].named_parameters()]
    ).astype(np.float32)


def load_module_vector(mods: Mapping[str, nn.Module], vector: np.ndarray) -> None:
    """Load a `module_vector` back in place (an optimiser holding the parameters keeps them)."""
    v = np.asarray(vector, np.float32)
    i = 0
    with th.no_grad():
        for k in sorted(mods):
            for _, p in mods[k].named_parameters():
                n = p.numel()
                p.copy_(th.as_tensor(v[i : i + n].reshape(tuple(p.shape))))
                i += n
    if i != v.size:
        raise ValueError(f"parameter vector has {v.size} values, the models need {i}")


def module_blocks(mods: Mapping[str, nn.Module]) -> list[tuple[int, slice]]:
    """``(scenario, slice)`` of each module's block in `module_vector` (key ``<kind><scenario>``)."""
    out, i = [], 0
    for k in sorted(mods):
        n = int(sum(p.numel() for p in mods[k].parameters()))
        out.append((int(k.lstrip("abcdefghijklmnopqrstuvwxyz_")), slice(i, i + n)))
        i += n
    return out


def mail_config(options: Mapping[str, Any]) -> MailConfig:
    """The `MailConfig` of a federated fit's options (its ``mail`` overrides, its architectures)."""
    cfg = MailConfig.from_hyper(dict(options.get("mail") or {}))
    cfg.net_arch = list(options["net_arch"])
    cfg.engine_arch = list(options["engine_arch"])
    cfg.disc_arch = tuple(int(h) for h in cfg.disc_arch)
    return cfg


def adversarial_templates(layout: Layout, cfg: MailConfig, seed: int) -> dict[str, nn.Module]:
    """Fresh client policies (``client<s>``) and discriminators (``reward<s>``), seeded: every
    party builds the same ones, so their `module_vector` layouts agree."""
    mods: dict[str, nn.Module] = {}
    for s in range(len(layout.scenarios)):
        th.manual_seed(seed + 700 + s)
        pol = gaussian_policy(layout.n_client_inputs, layout.n_model_outputs, list(cfg.net_arch))
        mods[f"client{s}"] = pol
        th.manual_seed(seed + 800 + s)
        mods[f"reward{s}"] = BasicRewardNet(
            pol.observation_space, pol.action_space, use_next_state=False, hid_sizes=cfg.disc_arch
        )
    return mods


def adversarial_size(layout: Layout, cfg: MailConfig) -> int:
    return int(sum(p.numel() for m in adversarial_templates(layout, cfg, 0).values() for p in m.parameters()))


def engine_modules(engines: Mapping[int, ActorCriticPolicy]) -> dict[str, nn.Module]:
    return {f"engine{s}": e for s, e in engines.items()}


# ------------------------------------------------------------------------------------ site side
class SiteAdversarial:
    """One site's GAIL trainers for one ensemble member, built on its own rows only.

    Args:
        name: the site (seeds its world).
        steps: the member's step table of this site's log.
        log: this site's log (its profiles, units and initial states populate the training world).
        spec, layout: the shared spec and the federated layout.
        cfg: MAIL hyper-parameters (the fit's).
        engines: the member's engine policies (behaviour-cloned by the federation).
        seed: the member's seed on this site.
    """

    def __init__(self, name: str, steps: StepTable, log: pd.DataFrame, spec: TwinSpec, layout: Layout,
                 cfg: MailConfig, engines: Mapping[int, ActorCriticPolicy], seed: int) -> None:
        self.layout = layout
        self.cfg = cfg
        self.steps = steps
        seed = seed + zlib.crc32(name.encode()) % 10_000
        self.seed = seed
        self.rounds_done = 0
        population = EmpiricalPopulation(agent_profiles(log, spec), list(layout.profile))
        sampler = PopulationSampler(population, list(layout.profile))
        initial = InitialStates.fit(log, layout)
        composition = Composition.fit(log, layout)
        scen, site = training_world(steps, layout, composition, cfg, seed)
        self.learners = client_learners(
            steps, layout, scen, site, sampler, initial, {s: GaussianModel(e) for s, e in engines.items()}, cfg, seed
        )
        self.trainers: dict[int, GAIL] = gail_trainers(steps, layout, self.learners, cfg)
        # the vector's modules: this site's learners where it trains a scenario, templates elsewhere
        self.modules = adversarial_templates(layout, cfg, 0)
        for s in range(len(layout.scenarios)):
            self.modules[f"client{s}"] = self.learners.clients[s]
            if s in self.trainers:
                self.modules[f"reward{s}"] = self.trainers[s]._reward_net
        self.rows = np.array(
            [len(client_rows(steps, layout, s)) if s in self.trainers else 0 for s in range(len(layout.scenarios))],
            float,
        )

    def local_round(self) -> list[dict[str, float]]:
        """One GAIL round per scenario this site trains, from its current weights (no federation).

        PPO's rollouts and minibatches and imitation's batches draw from the global torch / numpy
        generators: they are seeded from this site's seed and round count first, so a round does
        not depend on what ran before it in the process."""
        set_random_seed(self.seed + 7919 * self.rounds_done)
        self.rounds_done += 1
        return [{"scenario": float(s), **gail_round(t, self.cfg)} for s, t in self.trainers.items()]

    def round(self, global_vector: np.ndarray) -> tuple[np.ndarray, float, list[dict[str, float]]]:
        """One adversarial round from the global parameters: ``(scaled delta ++ shares, rows, stats)``."""
        g = np.asarray(global_vector, np.float32)
        load_module_vector(self.modules, g)
        stats = self.local_round()
        delta = module_vector(self.modules).astype(np.float64) - g.astype(np.float64)
        total = max(float(self.rows.sum()), 1.0)
        share = self.rows / total
        for s, sl in module_blocks(self.modules):
            delta[sl] *= share[s]
        return np.concatenate([delta, share]).astype(np.float32), total, stats
