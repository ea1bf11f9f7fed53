"""GAN-SMMSG and its baselines (GMM, plain GAN, WGAN-GP): who shows up.

A population model learns the joint distribution of the agents' static ``profile.*`` features
per scenario, and how often each scenario occurs, from one row per agent::

    from edgetwin.generative import agent_profiles, fit_population

    profiles = agent_profiles(log, spec)             # one row per (episode, agent)
    model = fit_population(profiles, spec, "gan-smmsg", seed=0, steps=3000)
    agents = model.sample(100_000, seed=1)           # columns: scenario, profile.*
    model.save("population/")
"""

from edgetwin.generative.base import PopulationModel
from edgetwin.generative.fitting import (
    DEFAULT_SCENARIO,
    MODEL_CLASSES,
    MODELS,
    agent_profiles,
    fit_population,
    load_population,
)
from edgetwin.generative.gan import GANPopulation, GANSMMSGPopulation, WGANPopulation
from edgetwin.generative.gmm import GMMPopulation

__all__ = [
    "DEFAULT_SCENARIO",
    "MODEL_CLASSES",
    "MODELS",
    "GANPopulation",
    "GANSMMSGPopulation",
    "GMMPopulation",
    "PopulationModel",
    "WGANPopulation",
    "agent_profiles",
    "fit_population",
    "load_population",
]
