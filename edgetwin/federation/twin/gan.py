"""The GAN-SMMSG population model, federated: each site plays the adversarial game on its own
profiles, the coordinator averages the networks.

The population model of a default twin is GAN-SMMSG (`edgetwin.generative.gan`): a generator that
starts from a per-scenario Gaussian mixture and learns a residual, judged by an instance and a
set (DeepSets) discriminator. Federated, in rounds of phase ``population``:

1. the starting mixture is the one the federation already fitted by federated EM (its profile
   marginal, in the code space of the federated "standard" encoding), so every party builds the
   same model from the coordinator's context (`federated_gan`);
2. each round, every site loads the global generator and discriminators, runs ``gan_local_steps``
   steps of the very same game (`GanSteps`, Algorithm 1 with eq. 4's entropy and KL terms) on its
   own agents' profiles, scenario-balanced over the scenarios it has, and sends the change of every
   parameter, weighted by its number of agents;
3. the coordinator aggregates the changes with the weight rule (FedAvg by default).

Differences from the centralised GAN-SMMSG, each because it would need rows at one place: the
encoding is "standard" (pooled moments), not the quantile map; no marginal calibration layer; no
checkpoint selection on a validation split; no EMA of the generator (``ema = 0``). Discriminator
and generator optimisers keep their state on each site between rounds.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
from torch import nn

from edgetwin.contract.spec import TwinSpec
from edgetwin.federation.twin.mail import load_module_vector, module_vector
from edgetwin.generative.fitting import agent_profiles
from edgetwin.generative.gan import GANSMMSGPopulation, GanSteps
from edgetwin.generative.transform import ProfileTransformer

__all__ = ["SiteGan", "federated_gan", "gan_modules"]

#: GAN-SMMSG hyper-parameters of a federated fit (the rest are the centralised defaults)
FEDERATED_GAN = {"calibrate": False, "select_every": 0, "ema": 0.0, "base": "gmm"}


def federated_gan(spec: TwinSpec, scenarios: Sequence[str], proportions: np.ndarray, transformer: ProfileTransformer,
                  mixtures: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], options: Mapping[str, Any]
                  ) -> GANSMMSGPopulation:
    """The federated GAN-SMMSG before training: seeded networks, the residual at zero, the base
    mixture set to ``mixtures`` (per scenario ``(w (K,), mu (K, P), chol (K, P, P))`` in code space).

    Every party calls it with the same arguments and gets the same model."""
    K = int(options["n_components"])
    hyper = {**dict(options.get("gan") or {}), **FEDERATED_GAN, "base_components": [K],
             "steps": int(options["gan_rounds"]) * int(options["gan_local_steps"])}
    pop = GANSMMSGPopulation(spec=spec, scenarios=list(scenarios), proportions=np.asarray(proportions, float),
                             transformer=transformer, hyper=hyper,
                             meta={"federated": True, "seed": int(options["seed"])})
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(options["seed"]) + 0x6A)
        for m in gan_modules(pop).values():
            for layer in m.modules():
                if isinstance(layer, nn.Linear):
                    layer.reset_parameters()
    gen = pop.generator
    gen.zero_residual()  # type: ignore[operator]
    gen.set_mixtures([(np.asarray(w), np.asarray(mu), np.asarray(ch)) for w, mu, ch in mixtures])  # type: ignore[operator]
    return pop


def gan_modules(pop: GANSMMSGPopulation) -> dict[str, nn.Module]:
    """The networks whose parameters travel (buffers such as the base mixture do not)."""
    mods: dict[str, nn.Module] = {"generator": pop.generator, "discriminator": pop.discriminator}
    if pop.set_discriminator is not None:
        mods["set_discriminator"] = pop.set_discriminator
    return mods


def gan_size(pop: GANSMMSGPopulation) -> int:
    return int(sum(p.numel() for m in gan_modules(pop).values() for p in m.parameters()))


class SiteGan:
    """One site's side of the population rounds: the game on its own agents' profiles.

    Args:
        name: the site (seeds its batches).
        log: its log (one profile row per agent is taken from it; none leaves).
        pop: the model `federated_gan` built from the coordinator's context.
        options: the fit's options (``gan_local_steps``, ``seed``).
    """

    def __init__(self, name: str, log: pd.DataFrame, pop: GANSMMSGPopulation, options: Mapping[str, Any]) -> None:
        self.pop = pop
        self.local_steps = int(options["gan_local_steps"])
        profiles = agent_profiles(log, pop.spec)[pop.columns]
        self.n_agents = len(profiles)
        self.modules = gan_modules(pop)
        seed = int(options["seed"]) * 1000 + zlib.crc32(name.encode()) % 10_000
        self.seed = seed
        self.game = GanSteps(pop, profiles, seed, int(pop.hyper["steps"]), partial=True)

    def round(self, step: int, global_vector: np.ndarray) -> tuple[np.ndarray, float, dict[str, float]]:
        """``gan_local_steps`` steps of the game from the global networks: ``(delta, agents, losses)``."""
        g = np.asarray(global_vector, np.float32)
        load_module_vector(self.modules, g)
        losses: dict[str, torch.Tensor] = {}
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed + 7919 * step)
            for i in range(self.local_steps):
                losses = self.game.step(step * self.local_steps + i)
        delta = module_vector(self.modules).astype(np.float64) - g.astype(np.float64)
        return delta.astype(np.float32), float(self.n_agents), {k: float(v.detach()) for k, v in losses.items()}
