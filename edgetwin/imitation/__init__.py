"""MAIL-MMSG and the behaviour-cloning baseline: how service groups respond.

* `fit_mail` (`edgetwin.imitation.mail`): seed 004's MAIL-MMSG on imitation's GAIL, one client
  policy per scenario trained round-robin in a shared world of sites (`ClientVecEnv`).
* `SupervisedResponseModel`, `ClonedPlatformPolicy` (`edgetwin.imitation.baselines`): the one-step
  regression and behaviour-cloning baselines in the same harness.
* `CausalResponseModel` (`edgetwin.imitation.causal`): one-step regression whose residuals are
  invariant across the log's ``policy`` ids (effects, not the logging policies' habits), and
  `overlap_report` (`edgetwin.imitation.overlap`): how much a log says about the effect of actions.
* The world they share, generic over the log contract: `Layout` (`edgetwin.imitation.layout`: roles,
  scalers and the structure found in a log), `build_steps` (`edgetwin.imitation.steps`: a log as
  training arrays), `World` (`edgetwin.imitation.world`: one tick of a batch of agents on sites)
  and `SiteStateModel` (`edgetwin.imitation.site_model`: an optional model of the site-level state
  columns from the whole site's tick).
"""

from edgetwin.imitation.baselines import ClonedPlatformPolicy, SupervisedResponseModel
from edgetwin.imitation.layout import Layout
from edgetwin.imitation.mail import (
    ClientVecEnv,
    GaussianModel,
    MailConfig,
    MailResult,
    behaviour_clone,
    fit_mail,
    fit_transition,
)
from edgetwin.imitation.site_model import SiteStateModel
from edgetwin.imitation.steps import StepTable, build_steps
from edgetwin.imitation.world import Composition, InitialStates, World

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
