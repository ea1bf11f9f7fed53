"""Federated aggregation strategies on flat float32 parameter vectors (seed 003 §4.3, seed 000 §4.4).

Every strategy takes the round's `ClientUpdate` s (each a client's ``delta``) and the current model
and returns an `AggregateResult`. See the submodules:

- `fedavg`: FedAvg, FedAvgM (server momentum), staleness-aware mixing, partial participation;
- `robust`: coordinate median, trimmed mean, Krum / multi-Krum, norm clipping;
- `personalized`: PFRL-DM multi-head attention aggregation, clustered FL;
- `privacy`: Gaussian DP with an RDP accountant;
- `secure`: secure aggregation with pairwise masks and dropout recovery;
- `strategies`: the strategies by name (``make_aggregator``);
- `quorum`: `RoundCollector`, k-of-n + grace + timeout.

Site -> cluster -> region -> global trees of these are `edgetwin.federation.hierarchy`.
"""

from edgetwin.federation.aggregation.base import (
    AggregateResult,
    Aggregator,
    ClientUpdate,
    LinearAggregator,
    ParamLayout,
    QuorumNotMet,
    flatten,
    unflatten,
)
from edgetwin.federation.aggregation.fedavg import ClientSampler, FedAvg, FedAvgM, StalenessAware
from edgetwin.federation.aggregation.personalized import (
    AttentionAggregator,
    ClusteredFedAvg,
    attention_weights,
    cluster_by_cosine,
)
from edgetwin.federation.aggregation.privacy import (
    GaussianDP,
    RDPAccountant,
    gaussian_epsilon_exact,
    rdp_sampled_gaussian,
)
from edgetwin.federation.aggregation.quorum import RoundCollector, RoundOutcome
from edgetwin.federation.aggregation.robust import (
    CoordinateMedian,
    Krum,
    NormClipping,
    TrimmedMean,
    clip_by_norm,
    coordinate_median,
    krum_scores,
    trimmed_mean,
)
from edgetwin.federation.aggregation.secure import SecAggClient, SecAggServer, SecureAggregator, secure_sum
from edgetwin.federation.aggregation.strategies import STRATEGIES, make_aggregator

__all__ = [
    "STRATEGIES",
    "AggregateResult",
    "Aggregator",
    "AttentionAggregator",
    "ClientSampler",
    "ClientUpdate",
    "ClusteredFedAvg",
    "CoordinateMedian",
    "FedAvg",
    "FedAvgM",
    "GaussianDP",
    "Krum",
    "LinearAggregator",
    "NormClipping",
    "ParamLayout",
    "QuorumNotMet",
    "RDPAccountant",
    "RoundCollector",
    "RoundOutcome",
    "SecAggClient",
    "SecAggServer",
    "SecureAggregator",
    "StalenessAware",
    "TrimmedMean",
    "attention_weights",
    "clip_by_norm",
    "cluster_by_cosine",
    "coordinate_median",
    "flatten",
    "gaussian_epsilon_exact",
    "krum_scores",
    "make_aggregator",
    "rdp_sampled_gaussian",
    "secure_sum",
    "trimmed_mean",
    "unflatten",
]
