"""Fitting a twin across sites: what each site computes on its own rows, and how the coordinator
turns the aggregates into an ordinary `edgetwin.twin.Twin`.

The fit is a sequence of *phases*; in each, every site answers the coordinator's task with one flat
vector whose size `TwinFitPlan` fixes from the spec, the layout and the models (never from the
number of rows), and the coordinator aggregates the vectors with an existing rule
(`edgetwin.federation.aggregation`: FedAvg by default):

=============  ==========================================================  =====================
phase          a site sends                                                aggregated as
=============  ==========================================================  =====================
``hello``      its row count (labels: scenario names, site, columns)       union of labels
``stats1``     per column: count, sum, sum of log1p, non-negatives;        sums (uniform FedAvg
               episode-length histogram; local structure votes (site-      x sites = the total)
               level, clock, echo, persistence); profile sums
``stats2``     per column: sum of squares about the pooled mean            sums
``summary``    k-means centroids, each a mean over >= ``min_agents``         pooled, then weighted
               effective agents, in the population space and the support   k-means (population)
               space; support thresholds from unseen episodes; its mean    or kept (support)
               site unit
``em``         EM sufficient statistics of the population mixture over     sums
               fixed groups of >= ``min_agents`` agents
``weights``    its behaviour-cloned engine and client models after a few   FedAvg / FedAvgM /
               local epochs from the global ones, as a delta               secure / DP
``residual``   sums of squared residuals of the global models              sums
``causal_*``   (``response_model="causal"``) per scenario and policy: the   sums, then one Adam
               sums of its rows' residuals, then the gradient of the        step on the pooled
               pooled loss's share of its rows (`twin.causal`)              loss's gradient
=============  ==========================================================  =====================

What it learns: the layout and scalers from pooled statistics; the population as one Gaussian
mixture per scenario over ``[profile codes, z(initial state)]`` (the GMM baseline of seed 004,
fitted by federated EM), from which the twin's population model (its profile marginal) and its
bank of initial states are sampled; the support index from the sites' aggregates (no logged row)
with thresholds the sites measured on unseen episodes; the client and
engine models by FedAvg of behaviour cloning (MAIL's pre-training: the adversarial rounds are not
federated, see the note in docs/federation.md). The result is a `Twin` like any other.

Where each part lives (this module gathers their public names): `plan` (`FitOptions`,
`TwinFitPlan`), `site` (`SiteFitter`, the site's side), `assemble` (`TwinAssembler`, the
coordinator's side), `clusters` and `columns` (what both sides compute identically),
`candidates` and `personalise` (a site's personalised copy).
"""

from edgetwin.federation.twin.agents import effective_agents
from edgetwin.federation.twin.assemble import (
    TwinAssembler,
    apply_blocks,
    gmm_from_context,
    transformer_from_dict,
)
from edgetwin.federation.twin.candidates import (
    PROX_GRID,
    model_candidates,
    proximal_fit,
    refit,
    select_and_fit,
    validation_agents,
)
from edgetwin.federation.twin.clusters import agent_clusters
from edgetwin.federation.twin.personalise import (
    CRITERIA,
    SITE_ALONE,
    TWIN_CHOICES,
    closed_loop_scores,
    personalise,
)
from edgetwin.federation.twin.plan import (
    DP_SCHEDULE,
    MIN_AGENTS,
    FitOptions,
    TooFewAgents,
    TwinFitPlan,
    strategy_schedule,
)
from edgetwin.federation.twin.site import SiteFitter

__all__ = ["CRITERIA", "DP_SCHEDULE", "MIN_AGENTS", "PROX_GRID", "SITE_ALONE", "TWIN_CHOICES", "FitOptions",
           "SiteFitter", "TooFewAgents", "TwinAssembler", "TwinFitPlan", "agent_clusters", "apply_blocks",
           "closed_loop_scores", "effective_agents", "gmm_from_context", "model_candidates", "personalise",
           "proximal_fit", "refit", "select_and_fit", "strategy_schedule", "transformer_from_dict",
           "validation_agents"]
