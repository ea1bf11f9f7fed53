"""Aggregation strategies on synthetic updates: the math, robustness, privacy, secrecy, config."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import torch

from edgetwin.contract.errors import InputError
from edgetwin.federation.aggregation import (
    AttentionAggregator,
    ClientSampler,
    ClientUpdate,
    ClusteredFedAvg,
    CoordinateMedian,
    FedAvg,
    FedAvgM,
    GaussianDP,
    Krum,
    NormClipping,
    QuorumNotMet,
    RDPAccountant,
    RoundCollector,
    SecureAggregator,
    StalenessAware,
    TrimmedMean,
    attention_weights,
    flatten,
    gaussian_epsilon_exact,
    make_aggregator,
    secure_sum,
    unflatten,
)
from edgetwin.federation.aggregation.secure import decode_fixed, shamir_combine, shamir_split
from edgetwin.federation.hierarchy import build_hierarchy

torch.set_num_threads(1)
D = 40


def _updates(deltas, samples=None, base_round=0):
    samples = samples if samples is not None else [1.0] * len(deltas)
    return [ClientUpdate(f"site-{i}", np.asarray(d, np.float32), float(n), base_round) for i, (d, n) in enumerate(zip(deltas, samples, strict=True))]


# ------------------------------------------------------------------------------ FedAvg family
def test_fedavg_is_the_sample_weighted_mean_of_client_models():
    rng = np.random.default_rng(0)
    g = rng.normal(size=D).astype(np.float32)
    models = rng.normal(size=(5, D))
    n = np.array([10, 1, 5, 30, 4], float)
    res = FedAvg().aggregate(_updates(models - g, n), g)
    np.testing.assert_allclose(res.params, (n @ models) / n.sum(), atol=1e-5)
    uni = FedAvg(weighting="uniform").aggregate(_updates(models - g, n), g)
    np.testing.assert_allclose(uni.params, models.mean(axis=0), atol=1e-5)


def test_fedavgm_momentum_math():
    rng = np.random.default_rng(1)
    g0 = np.zeros(D, np.float32)
    d1, d2 = rng.normal(size=(3, D)), rng.normal(size=(3, D))
    agg = FedAvgM(momentum=0.9)
    x1 = agg.aggregate(_updates(d1), g0).params
    np.testing.assert_allclose(x1, d1.mean(0), atol=1e-5)  # v1 = mean delta
    x2 = agg.aggregate(_updates(d2), x1).params
    np.testing.assert_allclose(x2, x1 + 0.9 * d1.mean(0) + d2.mean(0), atol=1e-5)
    # the velocity survives a state round trip
    again = FedAvgM(0.9)
    again.load_state_dict(agg.state_dict())
    np.testing.assert_allclose(again.velocity, agg.velocity)


def test_staleness_discounts_late_updates_and_drops_too_old():
    g = np.zeros(D, np.float32)
    fresh = ClientUpdate("a", np.ones(D, np.float32), 1.0, base_round=5)
    late = ClientUpdate("b", -np.ones(D, np.float32), 1.0, base_round=2)  # 3 rounds late
    agg = StalenessAware(FedAvg(), exponent=0.5, max_staleness=4)
    res = agg.aggregate([fresh, late], g, round=5)
    # (1 + 3)^-0.5 = 0.5: (1 - 0.5) / 2
    np.testing.assert_allclose(res.params, 0.25, atol=1e-6)
    assert res.info["staleness"] == {"a": 0, "b": 3}
    ancient = ClientUpdate("c", 100 * np.ones(D, np.float32), 1.0, base_round=0)
    res = agg.aggregate([fresh, ancient], g, round=5)
    assert res.info["dropped_stale"] == ["c"]
    np.testing.assert_allclose(res.params, 1.0, atol=1e-6)


def test_partial_participation_is_seeded_and_in_range():
    clients = [f"site-{i}" for i in range(50)]
    s = ClientSampler((0.6, 0.8), seed=7)
    rounds = [s.sample(clients, r) for r in range(20)]
    assert all(30 <= len(p) <= 40 for p in rounds)
    assert rounds == [ClientSampler((0.6, 0.8), seed=7).sample(clients, r) for r in range(20)]
    assert len({tuple(p) for p in rounds}) > 15
    for bad in (0.0, 1.2, (0.9, 0.5), (-0.1, 0.5)):
        with pytest.raises(InputError, match="participation"):
            ClientSampler(bad)


# ------------------------------------------------------------------------------ robustness
def _byzantine_round(attack: str, seed: int = 0):
    rng = np.random.default_rng(seed)
    mu = rng.normal(size=D)
    honest = mu + 0.1 * rng.normal(size=(8, D))
    byz = np.stack([-10.0 * mu, -10.0 * mu]) if attack == "scaled" else 10.0 * rng.normal(size=(2, D))
    deltas = np.concatenate([honest, byz])  # 20 % Byzantine
    return mu, _updates(deltas, samples=[1.0] * 10)


@pytest.mark.parametrize("attack", ["scaled", "random"])
def test_robust_rules_resist_twenty_percent_byzantine_where_fedavg_does_not(attack):
    mu, ups = _byzantine_round(attack)
    g = np.zeros(D, np.float32)
    err = {}
    for name, agg in {
        "fedavg": FedAvg(),
        "median": CoordinateMedian(),
        "trimmed": TrimmedMean(beta=0.2, byzantine_fraction=0.2),
        "krum": Krum(f=2, num_clients=10),
        "multi_krum": Krum(f=2, m=5, num_clients=10),
        "norm_clip": NormClipping(),
    }.items():
        err[name] = np.linalg.norm(agg.aggregate(ups, g).params - mu) / np.linalg.norm(mu)
    assert err["fedavg"] > 1.0, err
    for name in ("median", "trimmed", "krum", "multi_krum"):
        assert err[name] < 0.25, (name, err)
    assert err["norm_clip"] < 0.5, err  # clipping bounds the damage, does not remove it


def test_krum_selects_honest_updates():
    _, ups = _byzantine_round("scaled", seed=3)
    res = Krum(f=2, m=5).aggregate(ups, np.zeros(D, np.float32))
    assert not {"site-8", "site-9"} & set(res.info["selected"])


def test_configurations_that_cannot_work_are_refused():
    with pytest.raises(InputError, match="2f \\+ 3"):
        Krum(f=2, num_clients=6)
    with pytest.raises(QuorumNotMet):
        Krum(f=2).aggregate(_updates(np.zeros((6, D))), np.zeros(D, np.float32))
    with pytest.raises(InputError, match="Byzantine"):
        TrimmedMean(beta=0.1, byzantine_fraction=0.2)
    for robust in ("median", "trimmed_mean", "krum", "attention", "clustered"):
        with pytest.raises(InputError, match="secure aggregation"):
            SecureAggregator(make_aggregator(robust))
    base = {"name": "c0", "members": [f"s{i}" for i in range(6)]}
    with pytest.raises(InputError, match="2f \\+ 3"):
        build_hierarchy({**base, "strategy": {"name": "krum", "f": 2}})
    # 7 members but a 0.6 participation closes rounds with 5 < 2f + 3 = 7
    with pytest.raises(InputError, match="2f \\+ 3"):
        build_hierarchy({"name": "c0", "members": [f"s{i}" for i in range(7)], "participation": 0.6,
                         "strategy": {"name": "krum", "f": 2}})
    with pytest.raises(InputError, match="secure aggregation"):
        build_hierarchy({**base, "strategy": "median", "secure": True})
    with pytest.raises(InputError, match="participation"):
        build_hierarchy({**base, "participation": 1.5})
    with pytest.raises(InputError, match="Byzantine"):
        build_hierarchy({**base, "strategy": {"name": "trimmed_mean", "beta": 0.1, "byzantine_fraction": 0.3}})
    with pytest.raises(InputError, match="two groups"):
        build_hierarchy({"name": "g", "children": [{"name": "a", "members": ["s1"]}, {"name": "b", "members": ["s1"]}]})
    with pytest.raises(InputError, match="unknown strategy"):
        build_hierarchy({**base, "strategy": "fedprox"})
    with pytest.raises(InputError, match="quorum"):
        build_hierarchy({**base, "participation": 0.5, "quorum": 5})


# ------------------------------------------------------------------------------ secure aggregation
def test_shamir_threshold_reconstruction():
    from edgetwin.federation.aggregation.secure import _Rand

    secret = 2**255 + 12345
    shares = shamir_split(secret, 5, 3, _Rand(0))
    assert shamir_combine(shares[:3]) == secret
    assert shamir_combine([shares[4], shares[1], shares[2]]) == secret
    assert shamir_combine(shares[:2]) != secret


@pytest.mark.parametrize("dropped", [(), ("site-2",), ("site-0", "site-4")])
def test_secure_sum_is_exact_and_masked_vectors_reveal_nothing(dropped):
    rng = np.random.default_rng(5)
    inputs = {f"site-{i}": rng.normal(size=D) for i in range(6)}
    total, tr = secure_sum(inputs, threshold=3, drop_after_sharing=dropped, seed=11)
    expected = sum(v for k, v in inputs.items() if k not in dropped)
    np.testing.assert_allclose(total, expected, atol=1e-5)
    assert tr.dropped == sorted(dropped)
    for cid, masked in tr.masked.items():
        seen = decode_fixed(masked, 24)
        raw = inputs[cid]
        # what the server holds per client is noise of magnitude ~2^39, uncorrelated with the input
        assert np.median(np.abs(seen)) > 1e6 * np.abs(raw).max()
        assert abs(np.corrcoef(seen, raw)[0, 1]) < 0.6


def test_secure_fedavg_equals_plain_fedavg_with_and_without_dropout():
    rng = np.random.default_rng(6)
    g = rng.normal(size=D).astype(np.float32)
    deltas = rng.normal(size=(5, D))
    n = [3.0, 1.0, 2.0, 5.0, 4.0]
    ups = _updates(deltas, n)
    sec = SecureAggregator(FedAvg(), seed=1).aggregate(ups, g, round=2)
    np.testing.assert_allclose(sec.params, FedAvg().aggregate(ups, g).params, atol=1e-5)
    sec = SecureAggregator(FedAvg(), seed=1).aggregate(ups, g, round=3, dropped=["site-1"])
    survivors = [u for u in ups if u.client_id != "site-1"]
    np.testing.assert_allclose(sec.params, FedAvg().aggregate(survivors, g).params, atol=1e-5)
    assert sec.info["dropped"] == ["site-1"]


def test_secure_aggregation_with_staleness_discount():
    g = np.zeros(D, np.float32)
    ups = [ClientUpdate("a", np.ones(D, np.float32), 1.0, 5), ClientUpdate("b", -np.ones(D, np.float32), 1.0, 2),
           ClientUpdate("c", np.ones(D, np.float32), 1.0, 5)]
    plain = StalenessAware(FedAvg(), exponent=0.5).aggregate(ups, g, round=5)
    sec = SecureAggregator(StalenessAware(FedAvg(), exponent=0.5), seed=0).aggregate(ups, g, round=5)
    np.testing.assert_allclose(sec.params, plain.params, atol=1e-5)
    root = build_hierarchy({"name": "c0", "members": ["a", "b", "c"], "secure": True, "seed": 1,
                            "staleness": {"exponent": 0.5}})
    np.testing.assert_allclose(root.aggregate({u.client_id: u for u in ups}, g, round=5).params, plain.params, atol=1e-5)


def test_secure_aggregation_refuses_too_many_dropouts():
    inputs = {f"s{i}": np.ones(4) for i in range(4)}
    with pytest.raises(InputError, match="threshold"):
        secure_sum(inputs, threshold=3, drop_after_sharing=["s0", "s1"], seed=0)


# ------------------------------------------------------------------------------ differential privacy
def test_dp_noise_scale_matches_z_times_c_over_n():
    k, d = 10, 20_000
    dp = GaussianDP(clip_norm=0.5, noise_multiplier=2.0, seed=3)
    g = np.zeros(d, np.float32)
    res = dp.aggregate(_updates(np.zeros((k, d))), g)
    assert np.std(res.params) == pytest.approx(2.0 * 0.5 / k, rel=0.03)
    assert res.info["noise_std_of_mean"] == pytest.approx(0.1)
    # clipping: a huge update contributes at most C / n
    big = np.zeros((k, d))
    big[0, 0] = 1e6
    res = GaussianDP(clip_norm=0.5, noise_multiplier=1e-6).aggregate(_updates(big), g)
    assert res.params[0] == pytest.approx(0.05, rel=1e-3) and res.info["clipped"] == 1


def test_dp_epsilon_monotone_and_consistent_with_exact_gaussian():
    eps = []
    for z in (0.5, 0.8, 1.0, 2.0, 4.0):
        acc = RDPAccountant()
        acc.step(z, 1.0, num_steps=50)
        e = acc.epsilon(1e-5)
        exact = gaussian_epsilon_exact(z, 50, 1e-5)
        assert exact <= e <= 1.3 * exact + 0.05, (z, e, exact)  # RDP is an upper bound, and tight-ish
        eps.append(e)
    assert all(a > b for a, b in zip(eps, eps[1:], strict=False))
    acc = RDPAccountant()
    by_round = []
    for _ in range(5):
        acc.step(1.0, 0.7)
        by_round.append(acc.epsilon(1e-5))
    assert all(a < b for a, b in zip(by_round, by_round[1:], strict=False))
    full = RDPAccountant()
    full.step(1.0, 1.0, num_steps=5)
    assert by_round[-1] < full.epsilon(1e-5)  # sampling amplifies privacy
    dp = GaussianDP(noise_multiplier=1.0, sampling_rate=0.7)
    g = np.zeros(D, np.float32)
    for r in range(5):
        info = dp.aggregate(_updates(np.ones((4, D)) * 0.01), g, round=r).info
    assert info["epsilon"] == pytest.approx(by_round[-1])


# ------------------------------------------------------------------------------ personalisation
def test_attention_attends_to_similar_clients():
    rng = np.random.default_rng(8)
    a, b, c = rng.normal(size=(3, 500))
    theta = np.stack([a, a + 0.05 * rng.normal(size=500), b, c])  # clients 0 and 1 share an environment
    w = attention_weights(theta, num_heads=4, d_model=64, seed=0)
    np.testing.assert_allclose(w.sum(axis=1), 1.0, atol=1e-9)
    assert w[0, 1] > 3 * max(w[0, 2], w[0, 3]) and w[1, 0] > 3 * max(w[1, 2], w[1, 3])
    np.testing.assert_allclose(w, attention_weights(theta, num_heads=4, d_model=64, seed=0))
    assert np.allclose(attention_weights(theta, temperature=100.0), 0.25, atol=0.02)  # hot -> uniform


def test_attention_aggregator_follows_algorithm_1():
    rng = np.random.default_rng(9)
    g = np.zeros(100, np.float32)
    theta = rng.normal(size=(4, 100))
    agg = AttentionAggregator(seed=0)
    ids = ["c1", "c1b", "c2", "c3"]
    res = agg.aggregate([ClientUpdate(i, t.astype(np.float32)) for i, t in zip(ids, theta, strict=True)], g)
    w = np.array(res.info["attention"])
    for k, cid in enumerate(ids):  # eq. 21
        np.testing.assert_allclose(res.personalized[cid], w[k] @ theta, atol=1e-4)
    np.testing.assert_allclose(res.params, np.mean([res.personalized[i] for i in ids], axis=0), atol=1e-5)  # eq. 22
    # participants continue from their personalised critic, others from psi_G
    np.testing.assert_allclose(agg.model_for("c2", res.params), res.personalized["c2"])
    np.testing.assert_allclose(agg.model_for("new", res.params), res.params)


def test_clustered_fl_separates_opposite_regimes():
    rng = np.random.default_rng(10)
    direction = rng.normal(size=D)
    deltas = np.concatenate([direction + 0.1 * rng.normal(size=(3, D)), -direction + 0.1 * rng.normal(size=(3, D))])
    res = ClusteredFedAvg(threshold=0.5).aggregate(_updates(deltas), np.zeros(D, np.float32))
    assert sorted(map(sorted, res.info["clusters"])) == [["site-0", "site-1", "site-2"], ["site-3", "site-4", "site-5"]]
    np.testing.assert_allclose(res.personalized["site-0"], deltas[:3].mean(0), atol=1e-5)
    np.testing.assert_allclose(res.personalized["site-5"], deltas[3:].mean(0), atol=1e-5)


# ------------------------------------------------------------------------------ hierarchy
def test_hierarchy_of_fedavg_equals_flat_fedavg_and_skips_groups_without_quorum():
    cfg = {
        "aggregation": {
            "name": "global",
            "quorum": 1,
            "children": [
                {"name": "region-0", "children": [
                    {"name": "c0", "members": ["s0", "s1", "s2"]},
                    {"name": "c1", "members": ["s3", "s4"], "quorum": 2},
                ]},
                {"name": "c2", "members": ["s5", "s6"], "quorum": 2},
            ],
        }
    }
    root = build_hierarchy(cfg)
    assert [n.level for n in root.walk()] == ["global", "region", "cluster", "cluster", "cluster"]
    assert root.sites() == [f"s{i}" for i in range(7)]
    rng = np.random.default_rng(11)
    g = rng.normal(size=D).astype(np.float32)
    n = rng.integers(1, 20, size=7).astype(float)
    deltas = rng.normal(size=(7, D))
    ups = {f"s{i}": ClientUpdate(f"s{i}", deltas[i].astype(np.float32), n[i]) for i in range(7)}
    res = root.aggregate(ups, g)
    np.testing.assert_allclose(res.params, g + (n @ deltas) / n.sum(), atol=1e-5)
    assert res.info["num_samples"] == pytest.approx(n.sum())
    del ups["s6"]  # c2 misses its quorum: the global round goes on with region-0 (s0..s4)
    res = root.aggregate(ups, g)
    assert "skipped" in res.info["children"]["c2"]
    np.testing.assert_allclose(res.params, g + (n[:5] @ deltas[:5]) / n[:5].sum(), atol=1e-5)


# ------------------------------------------------------------------------------ flatten
def test_flatten_round_trips_torch_state_dicts_and_numpy():
    net = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    vec, layout = flatten(net.state_dict())
    assert vec.shape == (sum(p.numel() for p in net.parameters()),) and vec.dtype == np.float32
    back = unflatten(vec + 1.0, layout)
    net.load_state_dict(back)
    np.testing.assert_allclose(flatten(net.state_dict())[0], vec + 1.0)
    arrays = {"w": np.ones((2, 2)), "b": np.zeros(3)}
    v, lay = flatten(arrays)
    np.testing.assert_array_equal(unflatten(v, lay)["w"], arrays["w"])
    with pytest.raises(InputError, match="missing"):
        lay.flatten({"w": np.ones((2, 2))})
    with pytest.raises(InputError, match="shape"):
        lay.unflatten(np.zeros(6))


# ------------------------------------------------------------------------------ quorum
def _run(coro, timeout=10.0):
    return asyncio.run(asyncio.wait_for(coro, timeout))


def test_round_collector_complete_quorum_grace_and_timeout():
    ids = ["a", "b", "c", "d"]

    async def complete():
        rc = RoundCollector(1, ids, quorum=3, grace_s=5.0, timeout_s=5.0)
        waiter = asyncio.create_task(rc.wait())
        for i in ids:
            await asyncio.sleep(0)
            assert rc.submit(ClientUpdate(i, np.zeros(2, np.float32)))
        return await waiter

    out = _run(complete())
    assert out.reason == "complete" and out.quorum_met and out.missing == []

    async def quorum_then_grace():
        rc = RoundCollector(2, ids, quorum=3, grace_s=0.05, timeout_s=30.0)
        for i in ids[:3]:
            rc.submit(ClientUpdate(i, np.zeros(2, np.float32)))
        assert not rc.submit(ClientUpdate("a", np.zeros(2, np.float32)))  # duplicate
        assert not rc.submit(ClientUpdate("zz", np.zeros(2, np.float32)))  # not asked
        out = await rc.wait()
        assert not rc.submit(ClientUpdate("d", np.zeros(2, np.float32), base_round=2))  # late
        return out, rc

    out, rc = _run(quorum_then_grace())
    assert out.reason == "quorum+grace" and out.missing == ["d"] and out.quorum_met
    assert out.refused == {"duplicate": 1, "unknown": 1} and rc.late[0][1].client_id == "d"

    async def below_quorum():
        rc = RoundCollector(3, ids, quorum=3, grace_s=0.0, timeout_s=0.1)
        rc.submit(ClientUpdate("a", np.zeros(2, np.float32)))
        return await rc.wait()

    out = _run(below_quorum())
    assert out.reason == "timeout" and not out.quorum_met and out.missing == ["b", "c", "d"]
    with pytest.raises(InputError, match="quorum"):
        RoundCollector(0, ids, quorum=5)


def test_round_collector_stops_waiting_for_clients_that_report_a_failure():
    """A failure counts toward closing the round: with the others in it closes as complete (no
    grace), and once the quorum is out of reach it closes at once, long before its timeout."""
    ids = ["a", "b", "c", "d"]

    async def one_fails():
        rc = RoundCollector(1, ids, quorum=3, grace_s=600.0, timeout_s=600.0)
        waiter = asyncio.create_task(rc.wait())
        await asyncio.sleep(0)
        assert rc.fail("b") and not rc.fail("b") and not rc.fail("zz")
        for i in ("a", "c", "d"):
            rc.submit(ClientUpdate(i, np.zeros(2, np.float32)))
        assert not rc.submit(ClientUpdate("b", np.zeros(2, np.float32)))  # it said it failed
        return await waiter

    out = _run(one_fails())
    assert out.reason == "complete" and out.quorum_met and out.failed == ["b"] and out.missing == ["b"]

    async def too_many_fail():
        rc = RoundCollector(2, ids, quorum=3, grace_s=600.0, timeout_s=600.0)
        waiter = asyncio.create_task(rc.wait())
        rc.submit(ClientUpdate("a", np.zeros(2, np.float32)))
        await asyncio.sleep(0)
        rc.fail("c")
        await asyncio.sleep(0)
        assert not waiter.done()  # 3 of 4 are still possible
        rc.fail("d")
        return await waiter

    out = _run(too_many_fail(), timeout=5.0)  # a timeout here means it waited for its 600 s
    assert out.reason == "failed" and not out.quorum_met and out.failed == ["c", "d"]
