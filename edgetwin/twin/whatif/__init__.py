"""What-if replays: run policies through a twin under composable scenario perturbations.

A *scenario* is a list of perturbations applied, in order, to the columns of a simulated tick.
Because the twin is generic, every perturbation names the column it acts on (the system's own
names, from its spec), so the same engine serves any system that writes the log contract::

    [[perturbation]]                       # an arrival burst at one site
    kind = "burst"
    column = "response.demand"
    factor = 3
    start = 20                             # steps [start, end) of the episode
    end = 40
    sites = ["edge-ams"]

    [[perturbation]]                       # link degradation everywhere, all episode long
    kind = "scale"
    column = "state.rtt_edge_ms"
    factor = 2

Kinds (`KINDS`): ``scale`` (× ``factor``), ``burst`` (× ``factor`` over a required window),
``add`` (+ ``value``), ``set`` (= ``value``), ``failure`` (= ``value``, default 0: a capacity or
availability column of a site goes to zero), ``clip`` (to ``[low, high]``: e.g. fewer nodes cap
an allocation), ``jitter`` (+ N(0, ``std``) or × (1 + N(0, ``cv``))), ``shift_time`` (``hours``
added to the twin's clock and to an optional time-of-day column whose bounds span one day) and
``population_shift`` (a profile column × ``factor`` and/or a new scenario mix
``scenario_weights``). Any perturbation may be limited to ``sites``, agent ``scenarios`` and a
window ``start``/``end``.

Where a perturbation acts follows the column's role: ``profile.*`` and ``state.*`` change what
the policy and the twin see at the start of the tick, ``action.*`` what the platform did (after
the policy acted), ``response.*``, ``kpi.*`` and ``reward`` what the twin answered (the site
means that the next tick's responses depend on see the perturbed values too). A perturbed state
is an exogenous condition, not a new trajectory: after the tick, the perturbation is undone where
it can be (scale, add, jitter) so that it does not compound, while ``set``/``failure``/``clip``
leave the column where the twin took it from the forced value.

Two ways to run (`run_whatif`):

* **generated**: fresh populations from the twin's population model, initial states from its
  logged first ticks (`Twin.simulation`);
* **counterfactual replay** (`LoggedEpisode`, from a log): each recorded episode's agents, sites,
  profiles and first states come from the log; the policy is swapped and the responses come from
  the twin. Built-in policy ``"logged"`` replays the log's own actions; columns named
  ``exogenous`` follow the log at every tick (traffic the policy cannot change, e.g. the clock or
  grid carbon intensity).

Every (policy, scenario) cell runs each replicate world with every ensemble member, the same
worlds and response noise for every policy and scenario (paired comparisons). KPIs are reported
with 95 % intervals from a two-level bootstrap over members and replicates, so the ensemble's
disagreement widens them; every number also carries the share of its agent-steps that lie outside
the logs' support (`Twin.support`), and is flagged when that share exceeds ``oos_tolerance``.

The package, one concept a module: `perturbations` (`Perturbation`, `KINDS`), `scenarios`
(`Scenario`, `load_scenarios`), `kpis` (`KpiDef`, `default_kpis`), `policies` (`PolicySpec`,
`builtin_policy`), `replay` (`LoggedEpisode`, `logged_episodes`), `engine` (`run_episode`, one
episode), `results` (`Cell`, `bootstrap_ci`, `WhatIfResult`), `run` (`run_whatif`, every cell) and
`files` (reading a scenario or KPI file).
"""

from edgetwin.twin.whatif.engine import DAY_HOURS, OUTPUT_ROLES, EpisodeOutcome, run_episode
from edgetwin.twin.whatif.kpis import (
    STATS,
    KpiDef,
    default_kpis,
    kpis_from_dicts,
    load_kpis,
    merge_kpis,
    weighted_quantile,
)
from edgetwin.twin.whatif.perturbations import COMMON_KEYS, EPISODE_KINDS, KINDS, Perturbation
from edgetwin.twin.whatif.policies import (
    BUILTIN_POLICIES,
    PolicyFactory,
    PolicySpec,
    RoutedPolicy,
    builtin_policy,
    fixed_policy,
    routed_policy,
)
from edgetwin.twin.whatif.replay import (
    LoggedEpisode,
    logged_episode_kpis,
    logged_episodes,
    logged_support_share,
)
from edgetwin.twin.whatif.results import Cell, WhatIfResult, bootstrap_ci
from edgetwin.twin.whatif.run import episode_seeds, run_whatif
from edgetwin.twin.whatif.scenarios import NOMINAL, Scenario, load_scenarios, scenario_from_dict

__all__ = [
    "BUILTIN_POLICIES",
    "COMMON_KEYS",
    "DAY_HOURS",
    "EPISODE_KINDS",
    "KINDS",
    "NOMINAL",
    "OUTPUT_ROLES",
    "STATS",
    "Cell",
    "EpisodeOutcome",
    "KpiDef",
    "LoggedEpisode",
    "Perturbation",
    "PolicyFactory",
    "PolicySpec",
    "RoutedPolicy",
    "Scenario",
    "WhatIfResult",
    "bootstrap_ci",
    "builtin_policy",
    "default_kpis",
    "episode_seeds",
    "fixed_policy",
    "kpis_from_dicts",
    "load_kpis",
    "load_scenarios",
    "logged_episode_kpis",
    "logged_episodes",
    "logged_support_share",
    "merge_kpis",
    "run_episode",
    "routed_policy",
    "run_whatif",
    "scenario_from_dict",
    "weighted_quantile",
]
