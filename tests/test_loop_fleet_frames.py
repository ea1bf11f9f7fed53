"""`canary_on_cluster`'s in-process bus carries a 5,000-group tick (issue 48): one site serves every
group, so a tick's JSON decision request and outcome report hold every group in one message; at
the bus default (1 MiB, nats-server's ``max_payload``) the site refused the 5,000-group request
(2.2 MB, 413). `fleet_frame_bytes` sizes the frame to the fleet; these build the two messages as
the driver does and check that they fit, and that 1,000 groups keep the default."""

from __future__ import annotations

import numpy as np

from edgetwin.edge.bus.base import DEFAULT_MAX_BYTES
from edgetwin.edge.canary_command import outcome_envelope
from edgetwin.edge.messages import encode
from edgetwin.emulator.cluster import ClusterConfig, EdgeCluster
from edgetwin.emulator.logs import generate_logs
from edgetwin.emulator.population import SCENARIOS
from edgetwin.loop.fleet import decision_request_body, fleet_frame_bytes


def _request_bytes(n: int) -> int:
    """The JSON body `ask_site` sends for tick 0 of an ``n``-group cluster on one site."""
    em = EdgeCluster(ClusterConfig(n_agents=n, steps=2))
    obs = em.reset(seed=0)
    home = np.array(list(em.site_names), dtype=object)[em.home]
    scen = np.array(SCENARIOS, dtype=object)[em.scenario]
    return len(decision_request_body(obs, list(em.spec.observation_columns), em.agent_ids.tolist(), home.tolist(),
                                     scen.tolist(), 0))  # fmt: skip


def _report_bytes(n: int) -> int:
    """The encoded outcome report `publish_outcomes` sends for tick 0 of an ``n``-group log."""
    log, _ = generate_logs(ClusterConfig(n_agents=n, steps=1), 1, "random", seed=0)
    rows = log[log["t"] == 0].drop(columns=[c for c in ("policy", "propensity") if c in log.columns])
    return len(encode(outcome_envelope("edge", 0, rows.reset_index(drop=True), sender="cluster"), None))


def test_a_5000_group_tick_fits_the_frame_and_did_not_fit_the_default() -> None:
    req, rep = _request_bytes(5000), _report_bytes(5000)
    assert req > DEFAULT_MAX_BYTES and rep > DEFAULT_MAX_BYTES  # what failed before
    assert max(req, rep) <= fleet_frame_bytes(5000) / 1.5  # with room for longer numbers


def test_up_to_1000_groups_the_bus_default_is_kept() -> None:
    assert fleet_frame_bytes(1000) == fleet_frame_bytes(60) == DEFAULT_MAX_BYTES
    assert max(_request_bytes(1000), _report_bytes(1000)) <= DEFAULT_MAX_BYTES
    assert fleet_frame_bytes(5000) > DEFAULT_MAX_BYTES
