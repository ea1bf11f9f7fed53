"""The causal response model, fitted across sites (issue 36, item 2), no row on the bus.

Logs of two regimes (a day of the SLO-aware heuristic with 10 % noise, then a day of random
actions), split by site; every (site, scenario, policy) group holds at least `MIN_AGENTS` agents, so
the k-agent rule leaves every row in and the two fits see the same rows. The federated fit (``FitOptions(response_model="causal")``, in-process bus)
steps on the gradient of the pooled invariance loss (`edgetwin.federation.twin.causal`), so its
client models must be the ones `Twin.fit` fits for the same member on the pooled rows
(`CausalResponseModel` with the member's seed, in the same layout): within `TOLERANCE` in every
prediction (standardised units), and the same residual spread. Every message of the fit is
recorded: none carries a logged value, a site's row of model inputs or outputs, or a vector whose
size depends on a site's rows. A group under a site's ``min_agents`` is not counted at all.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from test_federated_twin import _mantissa_bits, _secret_values

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import POLICY_COLUMN
from edgetwin.edge.bus import InMemoryBus, MemoryBroker
from edgetwin.edge.messages import Envelope, encode
from edgetwin.emulator.cluster import ClusterConfig
from edgetwin.emulator.logs import Regime, generate_logs
from edgetwin.federation.twin.causal import CausalAggregate, SiteCausal
from edgetwin.federation.twin.fit import FitOptions, effective_agents
from edgetwin.federation.twin.runner import fit_federated, split_by_site
from edgetwin.imitation.causal import CausalResponseModel
from edgetwin.imitation.mail import client_rows
from edgetwin.imitation.steps import build_steps
from edgetwin.twin.twin import Twin

torch.set_num_threads(1)

#: the largest difference allowed between the federated and the centralised model's predictions, in
#: standardised output units (the outputs' spread is ~1): the two take the same Adam steps on the
#: same loss, and differ only by the order of float sums (and float32 on the wire)
TOLERANCE = 0.02
STEPS = 40
MIN_AGENTS = 4
OPTIONS = FitOptions.light(response_model="causal", causal_steps=STEPS, rounds=2, em_iters=2, n_components=2,
                           support_centroids=16, bank=100, net_arch=[32, 32], engine_arch=[8])


class _Recording(InMemoryBus):
    """An in-process bus client that keeps every envelope it publishes."""

    sent: list[tuple[str, Envelope]] = []

    async def publish_durable(self, subject: str, msg: Envelope) -> int:
        _Recording.sent.append((subject, msg))
        return await super().publish_durable(subject, msg)


@pytest.fixture(scope="module")
def two_regimes() -> tuple[Any, Any, dict[str, Any]]:
    regimes = [Regime("heuristic", 1, noise=0.1), Regime("random", 1)]
    df, spec = generate_logs(ClusterConfig(n_agents=90, steps=6), regimes=regimes, seed=0)
    return df, spec, split_by_site(df)


def _group_agents(df: Any) -> Any:
    """Effective agents of every (site, scenario, policy) group."""
    return df.groupby(["site", "scenario", POLICY_COLUMN])["agent"].apply(
        lambda a: effective_agents(np.bincount(pd.factorize(a)[0])))


@pytest.fixture(scope="module")
def fitted(two_regimes: Any) -> tuple[Any, Any, list[tuple[str, Envelope]]]:
    """One federated causal fit for the module: ``(twin, report, every envelope published)``."""
    df, spec, parts = two_regimes
    assert df[POLICY_COLUMN].nunique() == 2 and len(parts) >= 2
    assert _group_agents(df).min() >= MIN_AGENTS  # every group counts: the same rows as the centralised fit
    broker = MemoryBroker()
    _Recording.sent = []
    twin, rep = fit_federated(parts, spec, bus=lambda name: _Recording(broker, name=name), options=OPTIONS,
                              min_agents=MIN_AGENTS)
    return twin, rep, list(_Recording.sent)


def test_a_federated_causal_fit_matches_the_centralised_one_and_sends_no_row(two_regimes: Any, fitted: Any) -> None:
    df, spec, _ = two_regimes
    twin, rep, sent = fitted
    assert twin.meta["response_model"] == "causal"
    phases = [r["phase"] for r in rep.rounds]
    assert phases.count("causal_grad") == STEPS and phases.count("causal_sums") == STEPS + 1
    assert phases.index("causal_sums") > phases.index("residual")

    # the centralised fit of the same member on the pooled rows, in the same layout (as `Twin.fit`)
    steps = build_steps(df, twin.layout)
    policy = steps.frame[POLICY_COLUMN].to_numpy()
    for s, model in twin.members[0].clients.items():
        assert isinstance(model, CausalResponseModel)
        rows = client_rows(steps, twin.layout, s)
        central = CausalResponseModel(tuple(OPTIONS.net_arch), invariance=OPTIONS.invariance, steps=STEPS, seed=OPTIONS.seed * 1000 + 0 + s).fit(
            steps.x_client[rows], steps.y_client[rows], policy[rows])
        x = steps.x_client[rows]
        diff = np.abs(model.mean(x) - central.mean(x))
        assert diff.max() < TOLERANCE, (s, float(diff.max()))
        np.testing.assert_allclose(model.noise_std, central.noise_std, rtol=0.02, atol=1e-3)
        # and both learned something: the fitted model is not the one they started from
        start = central.init_net(x.shape[1], central.noise_std.size)
        assert float(np.abs(model.mean(x) - start(torch.as_tensor(x)).detach().numpy()).mean()) > 0.05

    # no message carries a row: no logged value, no site's (standardised) model input or output row
    updates = [(subj, env) for subj, env in sent if env.kind == "twin_update"]
    assert {env.payload["phase"] for _, env in updates} >= {"causal_sums", "causal_grad"}
    # every number sent travels as a float32 tensor value or as JSON text of a header
    values = np.unique(np.concatenate([np.asarray(t, np.float32).ravel() for _, env in sent
                                       for t in env.tensors.values()]))
    text = " ".join(json.dumps(env.payload) for _, env in sent)
    secrets = np.asarray(_secret_values(df, spec))
    assert len(secrets) > 100
    exact32 = np.array([float(np.float32(v)) == v and _mantissa_bits(v) > 12 for v in secrets], bool)
    assert not np.isin(secrets[exact32].astype(np.float32), values).any()
    numbers = set(re.findall(r"-?\d+\.\d{4,}(?:e-?\d+)?", text))
    assert not [v for v in secrets if repr(float(v)) in numbers]
    # a row sent whole would put every one of its values among the values sent: check the byte
    # pattern of each row for which that holds (a handful of rows of round values, if any)
    rows = np.concatenate([steps.x_client, np.nan_to_num(steps.y_client)], axis=1).astype(np.float32)
    candidates = rows[np.isin(rows, values).all(axis=1)]
    if len(candidates):
        blob = b"".join(encode(env) for _, env in sent)
        assert not [r for r in candidates if r.astype("<f4").tobytes() in blob]
    # the causal vectors' sizes follow from the layout, the policies and the architecture, never the rows
    sizes: dict[str, set[int]] = {"causal_sums": set(), "causal_grad": set()}
    for _, env in updates:
        if env.payload["phase"] in sizes:
            sizes[env.payload["phase"]].add(int(np.asarray(env.tensors["values"]).size))
    n_out = twin.layout.n_model_outputs
    assert sizes["causal_sums"] == {len(twin.layout.scenarios) * 2 * (1 + 2 * n_out)}  # scenarios x policies x sums
    assert len(sizes["causal_grad"]) == 1


def test_a_site_counts_no_policy_group_of_fewer_than_min_agents_agents(two_regimes: Any, fitted: Any) -> None:
    """The k-agent rule in the causal rounds: a (scenario, policy) group of a site's rows over fewer
    than its ``min_agents`` effective agents contributes nothing (count, sums and gradient all 0);
    the others contribute their rows."""
    df, _, parts = two_regimes
    twin = fitted[0]
    k = 8
    sizes = _group_agents(df)
    assert (sizes < k).any() and (sizes >= k).any()
    policies = sorted(df[POLICY_COLUMN].unique())
    for name, part in parts.items():
        site = SiteCausal(build_steps(part, twin.layout), twin.layout, policies, k, OPTIONS.to_dict(), 0)
        theta = CausalAggregate(twin.layout, OPTIONS.to_dict(), 0, policies).vector()
        counts = site.sums(theta).reshape(len(twin.layout.scenarios), len(policies), -1)[:, :, 0]
        for s, scen in enumerate(twin.layout.scenarios):
            for j, pol in enumerate(policies):
                small = sizes.get((name, scen, pol), 0.0) < k
                assert (counts[s, j] == 0) == small, (name, scen, pol)
        if not site.groups:
            assert not site.gradient(theta, np.ones(counts.size * (1 + 2 * twin.layout.n_model_outputs))).any()


def test_a_federated_causal_fit_is_refused_under_gaussian_dp(two_regimes: Any) -> None:
    """Its sums and gradients are not passed through DP's mechanism: refused, not run without it."""
    _, spec, parts = two_regimes
    with pytest.raises(InputError, match="Gaussian DP"):
        fit_federated(parts, spec, options=OPTIONS, strategy="dp_gaussian", min_agents=MIN_AGENTS)


def test_the_federated_causal_twin_saves_and_loads_as_data(fitted: Any, tmp_path: Any) -> None:
    twin = fitted[0]
    again = Twin.load(twin.save(tmp_path / "twin"))
    assert sorted(p.name for p in (tmp_path / "twin").rglob("client_*.causal.npz"))
    x = np.zeros((3, twin.layout.n_client_inputs), np.float32)
    for s, c in twin.members[0].clients.items():
        np.testing.assert_array_equal(c.mean(x), again.members[0].clients[s].mean(x))


@pytest.mark.parametrize("regimes, expected", [(2, "causal"), (1, "bc")])
def test_auto_is_decided_from_the_policies_the_sites_logged(two_regimes: Any, regimes: int, expected: str) -> None:
    """``response_model="auto"`` (``edgetwin fit --federated``'s default): two logged policies across
    the sites give the causal model, one gives MAIL-MMSG (here without adversarial rounds, which the
    twin's meta records as ``"bc"``); the twin's meta says which, as `Twin.fit`'s does."""
    df, spec, _ = two_regimes
    if regimes == 1:
        df = df[df[POLICY_COLUMN] == df[POLICY_COLUMN].iloc[0]]
    opts = FitOptions(**{**OPTIONS.to_dict(), "response_model": "auto", "adv_rounds": 0})
    broker = MemoryBroker()
    twin, rep = fit_federated(split_by_site(df), spec, bus=lambda name: InMemoryBus(broker, name=name),
                              options=opts, min_agents=MIN_AGENTS)  # fmt: skip
    assert twin.meta["response_model"] == expected
    phases = {r["phase"] for r in rep.rounds}
    assert ("causal_grad" in phases) == (expected == "causal")
    assert all(isinstance(c, CausalResponseModel) == (expected == "causal") for c in twin.members[0].clients.values())


def test_auto_is_mail_under_gaussian_dp() -> None:
    """docs/federation.md: under ``dp_gaussian`` the federated ``auto`` is MAIL-MMSG (the causal rounds'
    sums and gradients do not pass through DP's mechanism), decided before any round; ``causal``
    itself is refused there."""
    from edgetwin.emulator.cluster import cluster_spec
    from edgetwin.federation.twin.runner import TwinCoordinator

    spec, bus = cluster_spec(), InMemoryBus(MemoryBroker(), name="coordinator")
    auto = FitOptions.for_strategy("dp_gaussian", response_model="auto")
    assert TwinCoordinator(spec, ["a", "b"], bus, options=auto, strategy="dp_gaussian").options.response_model == "mail"
    with pytest.raises(InputError):
        TwinCoordinator(spec, ["a", "b"], bus, options=FitOptions.for_strategy("dp_gaussian", response_model="causal"),
                        strategy="dp_gaussian")


def test_fit_defaults_to_auto_in_python_and_on_the_cli() -> None:
    """README: ``--response-model auto`` is the default of ``edgetwin fit`` and of `Twin.fit`."""
    import inspect

    from edgetwin.cli.twin import twin_fit

    assert inspect.signature(Twin.fit).parameters["response_model"].default == "auto"
    assert inspect.signature(twin_fit).parameters["response_model"].default == "auto"
