"""MAIL-MMSG and the behaviour-cloning baseline: how service groups respond.

* `fit_mail` (`edgetwin.imitation.mail`): seed 004's MAIL-MMSG on imitation's GAIL, one client
  policy per scenario trained round-robin in a shared world of sites (`ClientVecEnv`).
* `SupervisedResponseModel`, `ClonedPlatformPolicy` (`edgetwin.imitation.baselines`): the one-step
  regression and behaviour-cloning baselines in the same harness.
* `Layout`, `build_steps`, `World` (`edgetwin.imitation.world`): the harness itself: scaling, site
  aggregates and one tick of a batch of agents, generic over the log contract; `SiteStateModel`,
  an optional model of the site-level state columns from the whole site's tick.
"""

from edgetwin.imitation.baselines import ClonedPlatformPolicy, SupervisedResponseModel
from edgetwin.imitation.mail import (
    ClientVecEnv,
    GaussianModel,
    MailConfig,
    MailResult,
    behaviour_clone,
    fit_mail,
    fit_transition,
)
from edgetwin.imitation.world import (
    Composition,
    InitialStates,
    Layout,
    SiteStateModel,
    StepTable,
    World,
    build_steps,
)

__all__ = [
    "ClientVecEnv",
    "ClonedPlatformPolicy",
    "Composition",
    "GaussianModel",
    "InitialStates",
    "Layout",
    "MailConfig",
    "MailResult",
    "SiteStateModel",
    "StepTable",
    "SupervisedResponseModel",
    "World",
    "behaviour_clone",
    "build_steps",
    "fit_mail",
    "fit_transition",
]
