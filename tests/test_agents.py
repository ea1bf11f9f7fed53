"""MA-FL agents (ESA / COA / GCA) and whole federations on the in-process bus.

The NATS robustness tests (killed ESA, server restart, Byzantine clients, bad frames over the
wire) are in test_federation_nats.py.
"""

from __future__ import annotations

import asyncio
import json
import time
from functools import cache

import numpy as np
import pytest
import torch

from edgetwin.cli import main
from edgetwin.contract.errors import InputError
from edgetwin.edge.bus import Subjects
from edgetwin.edge.messages import Envelope
from edgetwin.federation.attacks import Attack
from edgetwin.federation.compression import DampedErrorFeedbackCodec, UpdateCodec
from edgetwin.federation.intents import resolve_intents
from edgetwin.federation.learners import ForecastLearner, make_learner, site_series
from edgetwin.federation.runner import (
    FederationConfig,
    build_federation,
    build_tree,
    make_federation_config,
    rounds_to_fraction,
    run_federation,
    run_federation_async,
)
from edgetwin.federation.sites import SiteSpec, heterogeneous_sites

torch.set_num_threads(1)


@cache
def _data(name: str, seed: int) -> tuple[np.ndarray, np.ndarray]:
    site = next(s for s in heterogeneous_sites(16, seed=0) if s.name == name)
    return site_series(site)


def learners_for(cfg: FederationConfig, wrap=None) -> list:
    """Forecast learners on cached site data (simulating a site's days once per test session)."""
    out = []
    for s in cfg.site_specs():
        ln = ForecastLearner(
            s, data=_data(s.name, 0), **{k: v for k, v in cfg.learner.items() if k != "kind"}
        )
        out.append(wrap(s, ln) if wrap else ln)
    return out


def fed_config(**kw) -> FederationConfig:
    base = dict(
        sites=4,
        rounds=6,
        clusters=2,
        strategy="fedavg",
        global_strategy="fedavg",
        compression=False,
        timeout_s=20.0,
        seed=0,
    )
    base.update(kw)
    return make_federation_config(**base)


# ------------------------------------------------------------------------------ intents
def test_resolve_intents_prices_the_oversubscribed_site_and_grants_by_bid():
    intents = {
        "a": {
            "headroom": 0.0,
            "migrations": [
                {"service": "a/1", "to": "c", "load": 4.0, "bid": 0.9},
                {"service": "a/2", "to": "cloud", "load": 2.0, "bid": 0.5},
            ],
        },
        "b": {"headroom": 1.0, "migrations": [{"service": "b/1", "to": "c", "load": 4.0, "bid": 1.2}]},
        "c": {"headroom": 5.0, "migrations": []},
    }
    res = resolve_intents(intents, base_price=1.0, sensitivity=2.0)
    # c is asked for 8 vCPU with 5 free: the higher bid (b) wins, a is refused
    assert [m["service"] for m in res.accepted if m["to"] == "c"] == ["b/1"]
    assert [m["service"] for m in res.rejected] == ["a/1"]
    assert res.congestion["c"] == pytest.approx(8.0 / 5.0)
    assert res.prices["c"] == pytest.approx(1.0 + 2.0 * 1.6)
    # an uncontested site keeps the base price; the cloud always takes the load, at a premium
    assert res.prices["a"] == pytest.approx(1.0) and res.prices["b"] == pytest.approx(1.0)
    assert any(m["service"] == "a/2" for m in res.accepted) and res.prices["cloud"] > res.prices["b"]


def test_heterogeneous_sites_differ_and_refuse_bad_shapes():
    sites = heterogeneous_sites(8, clusters=2, seed=1)
    assert {s.cluster for s in sites} == {"cluster-0", "cluster-1"}
    assert len({json.dumps(s.scenario_weights, sort_keys=True) for s in sites}) == 4
    assert len({s.seed for s in sites}) == 8
    with pytest.raises(InputError, match="clusters"):
        heterogeneous_sites(2, clusters=3)
    with pytest.raises(InputError, match="subject token"):
        SiteSpec(name="site.1")


# ------------------------------------------------------------------------------ federations
def test_hierarchical_fedavg_equals_flat_and_learns():
    """Sample-weighted FedAvg is associative: site -> cluster -> global gives the flat average."""
    hier = fed_config(hierarchy=True)
    flat = fed_config(hierarchy=False)
    a = run_federation(hier, learners=learners_for(hier), progress=False)
    b = run_federation(flat, learners=learners_for(flat), progress=False)
    assert [r["reason"] for r in a.rounds] == ["complete"] * 6
    assert np.allclose(a.reward_curve, b.reward_curve, atol=1e-4)
    assert a.reward_curve[-1] > a.reward_curve[0] + 1.0  # forecast skill rises from a random network
    # bytes are counted per level: sites -> clusters, clusters -> global, and models down
    for row in a.bytes_per_round:
        assert row["site"] > 0 and row["cluster"] > 0 and row["down"] > 0
    assert "cluster" not in b.bytes_per_round[0]
    # every site trained every round from the round's model (nothing late, nothing stale)
    assert all(len(a.site_curve(s)) == 6 for s in a.sites)
    assert all(r["base"] == r["round"] for recs in a.sites.values() for r in recs)
    # intents reached the COAs and were settled every round
    assert all(r["intents"]["n"] == 2 for r in a.groups["cluster-0"])


def test_same_seed_same_result():
    kw = dict(rounds=3, participation=0.75, compression=True, hierarchy=False)
    a = run_federation(c := fed_config(**kw), learners=learners_for(c), progress=False)
    b = run_federation(d := fed_config(**kw), learners=learners_for(d), progress=False)
    assert a.reward_curve == b.reward_curve
    parts = [r["participants"] for r in a.rounds]
    assert parts == [r["participants"] for r in b.rounds] and all(len(p) == 3 for p in parts)
    assert a.final_rewards == b.final_rewards


def test_compression_cuts_the_uplink():
    dense = run_federation(c := fed_config(rounds=2), learners=learners_for(c), progress=False)
    comp = run_federation(
        d := fed_config(rounds=2, compression=True), learners=learners_for(d), progress=False
    )
    d_site = np.mean([r["site"] for r in dense.bytes_per_round])
    c_site = np.mean([r["site"] for r in comp.bytes_per_round])
    assert c_site < 0.5 * d_site


def test_damped_error_feedback_codec():
    codec = DampedErrorFeedbackCodec(topk=0.25, quantize_bits=None, residual_decay=0.5)
    x = np.array([4.0, 3.0, 2.0, 1.0], np.float32)
    assert np.allclose(UpdateCodec.decode(codec.encode("a", x)), [4, 0, 0, 0])
    assert np.allclose(codec.residual("a"), [0, 3, 2, 1])
    # the residual is halved before it is added to the next update
    assert np.allclose(UpdateCodec.decode(codec.encode("a", np.zeros(4, np.float32))), [0, 1.5, 0, 0])
    with pytest.raises(InputError, match="residual_decay"):
        DampedErrorFeedbackCodec(residual_decay=1.5)


def test_compressed_federation_converges_close_to_dense():
    dense = run_federation(
        c := fed_config(rounds=20, hierarchy=False), learners=learners_for(c), progress=False
    )
    comp = run_federation(
        d := fed_config(rounds=20, hierarchy=False, compression=True),
        learners=learners_for(d),
        progress=False,
    )
    final = np.mean(comp.reward_curve[-5:])
    assert final >= np.mean(dense.reward_curve[-5:]) - 0.1
    # no swings once it has converged (plain error feedback oscillates here, see DampedErrorFeedbackCodec)
    assert min(comp.reward_curve[12:]) > final - 0.2, comp.reward_curve


def test_personalised_attention_sends_each_site_its_own_model():
    cfg = fed_config(rounds=3, hierarchy=False, strategy="attention")
    res = run_federation(cfg, learners=learners_for(cfg), progress=False)
    assert all(r["aggregated"] for r in res.rounds)
    # after a round with personalisation every site gets its own model: one message per site
    single = run_federation(
        c := fed_config(rounds=3, hierarchy=False), learners=learners_for(c), progress=False
    )
    assert res.bytes_per_round[1]["down"] > 3 * single.bytes_per_round[1]["down"]


class _Slow:
    """A real learner whose training takes ``delay_s`` longer in some rounds (a straggler)."""

    def __init__(self, inner, slow_calls: set[int], delay_s: float) -> None:
        self.inner, self.slow_calls, self.delay_s, self.calls = inner, slow_calls, delay_s, 0
        self.num_samples = inner.num_samples

    def train(self):
        self.calls += 1
        if self.calls in self.slow_calls:
            time.sleep(self.delay_s)
        return self.inner.train()

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_straggler_round_closes_on_quorum_and_its_late_update_is_discounted():
    cfg = fed_config(
        rounds=10,
        hierarchy=False,
        quorum=3,
        grace_s=0.2,
        timeout_s=8.0,
        model_wait_s=0.5,
        staleness={"exponent": 1.0, "max_staleness": 9},
    )
    slow = "site-3"
    lns = learners_for(cfg, wrap=lambda s, ln: _Slow(ln, {2}, 1.0) if s.name == slow else ln)
    t0 = time.perf_counter()
    res = run_federation(cfg, learners=lns, progress=False)
    r1 = res.rounds[1]
    assert r1["reason"] == "quorum+grace" and r1["missing"] == [slow]
    assert r1["elapsed_s"] < cfg.aggregation["timeout_s"]
    late = [r for r in res.rounds if slow in r["late"]]
    assert late, "the straggler's update never arrived"
    rec = late[0]
    assert rec["late"][slow] >= 1
    others = [w for c, w in rec["weights"].items() if c != slow]
    # (1 + staleness)^-1 with equal sample counts: half (or less) of an on-time site's weight
    assert rec["weights"][slow] <= 0.5 * min(others) + 1e-6
    # it skipped the rounds opened while it was busy, then trained on time again
    assert all(r["base"] == r["round"] for r in res.sites[slow] if r["round"] > rec["round"])
    assert any(slow in r["on_time"] for r in res.rounds[rec["round"] + 1 :])
    assert time.perf_counter() - t0 < 60


def test_malformed_and_oversized_frames_are_rejected_and_counted_in_a_running_federation():
    cfg = fed_config(rounds=3)

    async def scenario():
        fed = await build_federation(cfg, "memory", learners=learners_for(cfg))
        coa = next(c for c in fed.coas if c.node.name == "cluster-0")
        frames = [b"not a frame", b"ET\x01\xff\xff\xff\x7f{", b"ET\x09\x02\x00\x00\x00{}", b"\0" * (2 << 20)]
        for f in frames:  # at the COA (intents) and at its ESAs (models, round control)
            for subject in (
                Subjects.intent("cluster-0", "site-0"),
                Subjects.model("cluster", "cluster-0"),
                Subjects.round("cluster", "cluster-0"),
            ):
                await coa.bus.publish_raw(subject, f)
        try:
            recs = await fed.gca.run(cfg.rounds)
        finally:
            for a in [*fed.esas, *fed.coas, fed.gca]:
                await a.stop()
        rejected: dict[str, int] = {}
        for b in fed.buses:
            for k, v in b.stats.rejected.items():
                rejected[k] = rejected.get(k, 0) + v
        return recs, rejected, sum(b.stats.handler_errors for b in fed.buses)

    recs, rejected, errors = asyncio.run(scenario())
    assert len(recs) == 3 and all(r.aggregated and r.reason == "complete" for r in recs)
    # the COA (intents) and the two ESAs of cluster-0 (models, round control) rejected every bad
    # frame they were sent: 5 deliveries per frame
    assert rejected == {"malformed": 10, "unknown_version": 5, "oversized": 5}
    assert errors == 0


def test_a_wrong_size_or_non_finite_update_is_refused_without_costing_the_round():
    cfg = fed_config(rounds=2, hierarchy=False)

    async def scenario():
        fed = await build_federation(cfg, "memory", learners=learners_for(cfg))
        d = fed.gca.params.size
        group = fed.gca.node.name
        bad = [np.full(d, np.nan, np.float32), np.zeros(d + 3, np.float32)]
        for sender, vec in zip(["esa/site-0", "esa/site-1"], bad, strict=True):
            env = Envelope(
                "model_update",
                sender,
                0,
                {
                    "level": "site",
                    "group": group,
                    "num_samples": 10,
                    "base_round": 0,
                    "run": cfg.run,
                    "codec": {"codec": "dense", "size": int(vec.size)},
                },
                tensors={"values": vec},
            )
            # sent by the site itself (a faulty site): on the authenticated bus nobody else can
            esa = next(a for a in fed.esas if a.name == sender)
            await esa.bus.publish_durable(Subjects.update("site", group), env)
        try:
            recs = await fed.gca.run(cfg.rounds)
        finally:
            for a in [*fed.esas, *fed.coas, fed.gca]:
                await a.stop()
        return recs, fed.gca.refused

    recs, refused = asyncio.run(scenario())
    assert all(r.aggregated for r in recs)
    # the wrong-size one is refused on receipt; the NaN one (site-0's own, signed by it) took its slot
    # in round 0 and is refused at aggregation: the round goes on with the others
    assert refused["non_finite"] == 1 and refused["wrong_size"] == 1
    assert sorted(recs[0].weights) == ["site-1", "site-2", "site-3"]


def test_byzantine_random_updates_break_fedavg_but_not_multi_krum_or_trimmed_mean():
    """20 % of the sites send Gaussian noise 100x the size of an honest update (the scaled attack
    over a real NATS server is in test_federation_nats.py)."""
    byz = {"site-0": {"kind": "random", "scale": 100.0}, "site-5": {"kind": "random", "scale": 100.0}}
    runs = [
        ("clean", "fedavg", {}),
        ("fedavg", "fedavg", byz),
        ("multi_krum", {"name": "multi_krum", "f": 2, "m": 6}, byz),
        ("trimmed_mean", {"name": "trimmed_mean", "beta": 0.2, "byzantine_fraction": 0.2}, byz),
    ]
    out = {}
    for name, strategy, attacks in runs:
        cfg = make_federation_config(
            sites=10,
            rounds=12,
            clusters=1,
            strategy=strategy,
            compression=False,
            hierarchy=False,
            attacks=attacks,
            timeout_s=20.0,
            seed=0,
        )
        res = run_federation(cfg, learners=learners_for(cfg), progress=False)
        out[name] = float(np.mean([v for k, v in res.final_rewards.items() if k not in byz]))
    clean = out["clean"]
    assert clean > 0.5
    for robust in ("multi_krum", "trimmed_mean"):
        assert abs(out[robust] - clean) <= 0.1 * clean, out
    assert out["fedavg"] < 0.9 * clean, out


# ------------------------------------------------------------------------------ configuration
def test_configurations_that_cannot_work_are_refused_at_start():
    with pytest.raises(InputError, match="2f \\+ 3"):
        build_tree(fed_config(hierarchy=False, strategy={"name": "krum", "f": 1}))
    cfg = fed_config()
    cfg.aggregation["timeout_s"] = 5.0  # the GCA would close before its clusters can answer
    with pytest.raises(InputError, match="parent"):
        build_tree(cfg)
    with pytest.raises(InputError, match="Byzantine"):
        build_tree(
            fed_config(
                hierarchy=False, strategy={"name": "trimmed_mean", "beta": 0.1, "byzantine_fraction": 0.2}
            )
        )
    with pytest.raises(InputError, match="unknown site"):
        build_tree(fed_config(attacks={"site-9": {"kind": "scaled"}}))
    with pytest.raises(InputError, match="learner kind"):
        make_learner({"kind": "transformer"}, heterogeneous_sites(1)[0])
    with pytest.raises(InputError, match="public_critic"):
        make_learner({"kind": "ppo", "algo": "ppo", "federate": "public_critic"}, heterogeneous_sites(1)[0])
    with pytest.raises(InputError, match="attack kind"):
        Attack(kind="alie")
    with pytest.raises(InputError, match="unknown keys"):
        FederationConfig.from_dict({"sites": [], "aggregation": {}, "bogus": 1})


def test_rounds_to_fraction():
    assert rounds_to_fraction([-3.0, -1.0, 0.5, 0.9, 1.0]) == 4  # -3 + 0.95 * 4 = 0.8
    assert rounds_to_fraction([1.0, 0.5]) is None
    assert rounds_to_fraction([]) is None


# ------------------------------------------------------------------------------ PPO learners
def test_dual_critic_learner_federates_only_the_public_critic():
    site = heterogeneous_sites(1, seed=0, n_agents=4, steps=12)[0]
    ln = make_learner(
        {
            "kind": "ppo",
            "algo": "dual_critic_ppo",
            "federate": "public_critic",
            "episodes_per_round": 1,
            "net_arch": [16, 16],
        },
        site,
    )
    p0 = ln.get_params()
    pol = ln.model.policy
    expected = sum(p.numel() for p in pol.public_critic.parameters())
    assert p0.shape == (expected,)
    actor_before = pol.action_net.weight.detach().clone()
    m = ln.train()
    assert np.isfinite(m["reward"]) and 0.0 <= m["alpha"] <= 1.0 and m["episodes"] == 1
    # installing a model: the old public critic moves to the local critic (Algorithm 1, lines 7-8)
    old_public = ln.get_params()
    new = (old_public + 0.5).astype(np.float32)
    ln.set_params(new)
    assert np.allclose(ln.get_params(), new)
    local = np.concatenate([v.numpy().ravel() for v in pol.local_critic_parameters().values()])
    assert np.allclose(local, old_public)
    assert not torch.equal(
        actor_before, pol.action_net.weight
    )  # the actor trained locally, untouched by set_params
    with pytest.raises(InputError):
        ln.set_params(np.zeros(3, np.float32))


def test_pfrl_dm_federation_with_attention_on_ppo_sites():
    cfg = make_federation_config(
        sites=heterogeneous_sites(3, seed=0, n_agents=4, steps=12),
        rounds=2,
        hierarchy=False,
        strategy="attention",
        learner={
            "kind": "ppo",
            "algo": "dual_critic_ppo",
            "federate": "public_critic",
            "episodes_per_round": 1,
            "net_arch": [16, 16],
        },
        timeout_s=60.0,
        compression=False,
        seed=0,
    )
    res = asyncio.run(run_federation_async(cfg, progress=False))
    assert [r["reason"] for r in res.rounds] == ["complete", "complete"]
    assert all(np.isfinite(v) for v in res.final_rewards.values())
    att = res.rounds[-1]["info"]
    assert att["strategy"] == "attention" and att["n"] == 3


# ------------------------------------------------------------------------------ CLI
def test_cli_federate_json_and_bad_input(capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        main(
            [
                "federate",
                "--sites",
                "3",
                "--rounds",
                "2",
                "--no-compression",
                "--json",
                "--save-config",
                str(tmp_path / "fed.json"),
                "--plot",
                str(tmp_path / "fed.png"),
            ]
        )
    assert e.value.code == 0
    doc = json.loads(capsys.readouterr().out)
    assert len(doc["rounds"]) == 2 and set(doc["final_rewards"]) == {"site-0", "site-1", "site-2"}
    assert (tmp_path / "fed.png").stat().st_size > 0
    assert FederationConfig.load(tmp_path / "fed.json").rounds == 2
    for argv in (
        ["federate", "--sites", "2", "--clusters", "3"],
        ["federate", "--learner", "gpt"],
        ["federate", "--strategy", "{bad json"],
        ["agent", "boss", "--config", str(tmp_path / "fed.json")],
        ["federate", "--processes"],
    ):
        with pytest.raises(SystemExit) as e:
            main(argv)
        assert e.value.code == 2, argv
    assert "error" in capsys.readouterr().err


@pytest.mark.slow
def test_esa_trains_in_its_sites_twin_when_one_is_given(tmp_path):
    """A site with a twin directory trains its dual-critic PPO in the twin, not in the emulated cluster."""
    from edgetwin.emulator.cluster import ClusterConfig
    from edgetwin.emulator.logs import generate_logs
    from edgetwin.twin.twin import Twin

    site = heterogeneous_sites(1, seed=0, n_agents=8, steps=8)[0]
    log, spec = generate_logs(ClusterConfig(n_agents=16, steps=8), episodes=2, policy="random", seed=0)
    twin = Twin.fit(
        log,
        spec,
        members=1,
        seed=0,
        progress=False,
        population_model="empirical",
        bc_epochs=5,
        rounds=1,
        world_agents=16,
        n_steps=8,
        demo_batch_size=64,
    )
    twin.save(tmp_path / "twin")
    site.twin = str(tmp_path / "twin")
    ln = make_learner(
        {
            "kind": "ppo",
            "algo": "dual_critic_ppo",
            "federate": "public_critic",
            "episodes_per_round": 1,
            "net_arch": [16, 16],
        },
        site,
    )
    assert ln._cluster is None and ln.spec.observation_columns == spec.observation_columns
    m = ln.train()
    assert np.isfinite(m["reward"]) and m["episodes"] >= 1
    cfg = make_federation_config(
        sites=[site],
        rounds=1,
        hierarchy=False,
        strategy="attention",
        learner={
            "kind": "ppo",
            "algo": "dual_critic_ppo",
            "federate": "public_critic",
            "episodes_per_round": 1,
            "net_arch": [16, 16],
        },
        compression=False,
        timeout_s=120.0,
    )
    res = run_federation(cfg, learners=[ln], progress=False)
    assert res.rounds[0]["aggregated"]
