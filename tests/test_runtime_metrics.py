"""The edge runtime's /metrics: decisions per policy version, latency, KPIs per arm, the KPI watch,
rollbacks; read by prometheus-client's parser over HTTP, and scraped by a real Prometheus server."""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest
from conftest import free_port
from prometheus_client.parser import text_string_to_metric_families
from prometheus_server import PrometheusServer, binaries
from test_runtime import SPEC, ConstantPolicy, obs_batch, promote, publish
from typer.testing import CliRunner

from edgetwin.edge.kpi_watch import KPIGuard, KPIMargin
from edgetwin.edge.metrics import instrument, serve_metrics
from edgetwin.edge.registry import FileRegistry
from edgetwin.edge.runtime import EdgeRuntime
from edgetwin.edge.signing import Signer, TrustStore, save_public_key

SITE = "s1"


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``{(sample name, sorted labels): value}`` of a /metrics page, parsed by prometheus-client."""
    with urllib.request.urlopen(url, timeout=5) as r:
        text = r.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def sample(page: dict, name: str, **labels: str) -> float:
    want = {**labels, "site": SITE}
    hits = [v for (n, lab), v in page.items() if n == name and all(dict(lab).get(k) == v for k, v in want.items())]
    assert len(hits) == 1, (name, labels, [k for k in page if k[0] == name])
    return hits[0]


def test_metrics_page_follows_decisions_kpis_swaps_and_rollbacks(tmp_path: Path) -> None:
    signer = Signer.generate()
    reg = FileRegistry(tmp_path / "registry")
    publish(reg, tmp_path, ConstantPolicy(SPEC, [0.5, 1.0, 0.3]), "v1", signer)
    publish(reg, tmp_path, ConstantPolicy(SPEC, [0.2, 1.0, 0.3]), "v2", signer)
    promote(reg, "v1")
    guard = KPIGuard(margins=(KPIMargin("kpi.x", max_regression=0.1),), window=3, grace=0, patience=1, baseline="previous")
    rt = EdgeRuntime(SITE, reg, TrustStore([signer.public_key]), kpi_guard=guard, poll_interval=60)
    metrics = instrument(rt)
    server, _ = serve_metrics(metrics, free_port())
    url = f"http://127.0.0.1:{server.server_port}/metrics"
    try:
        with rt.running_in_thread():
            obs = obs_batch(6)
            for _ in range(4):
                rt.decide(obs)
            for _ in range(3):
                rt.report_kpis({"kpi.x": 1.0})
            page = scrape(url)
            assert sample(page, "edgetwin_decisions_total", policy="v1", arm="fleet") == 4
            assert sample(page, "edgetwin_decision_rows_total", policy="v1", arm="fleet") == 24
            assert sample(page, "edgetwin_decision_latency_seconds_count", policy="v1", arm="fleet") == 4
            assert sample(page, "edgetwin_decision_latency_seconds_sum", policy="v1", arm="fleet") > 0
            assert sample(page, "edgetwin_kpi", policy="v1", arm="fleet", kpi="kpi.x") == 1.0
            assert sample(page, "edgetwin_kpi_reports_total", policy="v1", arm="fleet") == 3
            assert sample(page, "edgetwin_policy_info", policy="v1", scope=f"site/{SITE}") == 1
            assert sample(page, "edgetwin_kpi_watch_state", policy="v1", state="judging") == 1
            assert sample(page, "edgetwin_kpi_watch_state", policy="v1", state="accepted") == 0
            assert sample(page, "edgetwin_kpi_watch_baseline", policy="v1", kpi="kpi.x") == 1.0
            # another arm reports beside the fleet, under its own policy (the canary test drives them)
            metrics.observe_kpis({"kpi.x": 1.4}, policy="v2", arm="candidate")
            metrics.observe_decision("v2", 2, 0.001, arm="candidate")
            page = scrape(url)
            assert sample(page, "edgetwin_kpi", policy="v2", arm="candidate", kpi="kpi.x") == 1.4
            assert sample(page, "edgetwin_decisions_total", policy="v2", arm="candidate") == 1
            # a hot swap to v2, then v2's KPIs regress: the runtime rolls back to v1
            promote(reg, "v2")
            asyncio.run_coroutine_threadsafe(rt.refresh(), rt._loop).result(30)  # type: ignore[arg-type]
            rt.decide(obs)
            for _ in range(4):
                rt.report_kpis({"kpi.x": 5.0})
            page = scrape(url)
            assert sample(page, "edgetwin_decisions_total", policy="v2", arm="fleet") == 1
            assert sample(page, "edgetwin_policy_swaps_total") == 2
            assert sample(page, "edgetwin_rollbacks_total") == 1
            assert sample(page, "edgetwin_policy_info", policy="v1", scope=f"site/{SITE}") == 1
            assert sample(page, "edgetwin_registry_reachable") == 1
    finally:
        server.shutdown()


def test_a_canary_reports_its_arms_side_by_side(tmp_path: Path) -> None:
    """A canary on the emulated cluster through the runtime: decisions and KPIs per arm and policy,
    the candidate's beside the control's, as a judge reads them."""
    from test_canary import CLUSTER, GUARDED, _site
    from test_canary import SPEC as CSPEC

    from edgetwin.edge.canary import CanaryConfig
    from edgetwin.edge.canary_slice import CanarySlice
    from edgetwin.emulator.cluster import EdgeCluster, check_actions
    from edgetwin.emulator.population import SCENARIOS
    from edgetwin.loop.fleet import _rows

    reg, trust, loader = _site(tmp_path)
    em = EdgeCluster(CLUSTER)
    obs = em.reset(seed=5)
    scen = np.array(SCENARIOS, dtype=object)[em.scenario]
    sites = np.array(em.site_names, dtype=object)[em.home]
    config = CanaryConfig("cand", CanarySlice(sites=("edge-ams", "edge-fra"), seed=0), 23.0, GUARDED, pre_ticks=0)
    rt = EdgeRuntime("edge", reg, trust, kpi_guard=None, poll_interval=3600, loader=loader, spec=CSPEC)
    metrics = instrument(rt)
    with rt.running_in_thread():
        asyncio.run_coroutine_threadsafe(rt.start_canary(config), rt._loop).result(30)  # type: ignore[arg-type]
        canary = rt.canary
        assert canary is not None
        arms = canary.router.arms(em.agent_ids.tolist(), sites.tolist(), scen.tolist())
        for t in range(3):
            d = rt.decide_for(obs, em.agent_ids, sites, scen)
            actions = check_actions(d.actions, em.n)
            new_obs, reward, _, info = em.step(actions)
            rows = _rows(em, 0, t, obs, actions, info, reward, d.policy, d.propensity, arms != "fleet")
            rt.canary_report(rows)
            obs = new_obs
    page = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(metrics.exposition().decode())
        for s in fam.samples
    }

    def get(name: str, **labels: str) -> float:
        hits = [v for (n, lab), v in page.items() if n == name and all(dict(lab).get(k) == x for k, x in labels.items())]
        assert len(hits) == 1, (name, labels)
        return hits[0]

    for arm, policy in (("candidate", "cand"), ("control", "current"), ("fleet", "current")):
        assert get("edgetwin_decisions_total", policy=policy, arm=arm) == 3
        assert get("edgetwin_decision_rows_total", policy=policy, arm=arm) == 3 * int((arms == arm).sum())
    last = rows[rows["policy"] == "cand"]
    in_cand = np.isin(rows["agent"].astype(str), em.agent_ids[arms == "candidate"].astype(str))
    assert get("edgetwin_kpi", policy="cand", arm="candidate", kpi="kpi.slo_violation") == pytest.approx(
        float(rows.loc[in_cand, "kpi.slo_violation"].mean()))
    assert len(last) == int(in_cand.sum())
    assert get("edgetwin_kpi_reports_total", policy="current", arm="control") == 3


def test_a_real_prometheus_scrapes_edgetwin_serve(tmp_path: Path) -> None:
    """`edgetwin serve --metrics-port` in this process, scraped every second by a real server."""
    binaries()  # skip with the reason when the prometheus binary is absent
    signer = Signer.generate()
    reg = FileRegistry(tmp_path / "registry")
    publish(reg, tmp_path, ConstantPolicy(SPEC, [0.5, 1.0, 0.3]), "v1", signer)
    promote(reg, "v1")
    (tmp_path / "keys").mkdir()
    save_public_key(signer.public_key, tmp_path / "keys" / "publisher.pub.pem")
    port = free_port()
    from edgetwin.cli import app

    with PrometheusServer(tmp_path, tmp_path / "tsdb", scrape=[("edgetwin", f"127.0.0.1:{port}")]) as prom:
        import threading

        result: dict = {}

        def serve() -> None:
            result["res"] = CliRunner().invoke(app, [
                "serve", "--site", SITE, "--registry", str(tmp_path / "registry"), "--trust", str(tmp_path / "keys"),
                "--cache-dir", str(tmp_path / "cache"), "--metrics-port", str(port), "--duration", "8", "--json",
            ])  # fmt: skip

        th = threading.Thread(target=serve, daemon=True)
        th.start()
        deadline = time.monotonic() + 60
        got: list = []
        while time.monotonic() < deadline and not got:
            got = prom.query('edgetwin_policy_info{site="s1",policy="v1"}')
            time.sleep(0.3)
        assert got, "Prometheus never scraped the runtime's /metrics"
        assert prom.query('up{job="edgetwin"}')[0]["value"][1] == "1"
        state = prom.query('edgetwin_kpi_watch_state{site="s1"} == 1')
        assert {r["metric"]["state"] for r in state} <= {"idle", "judging", "off"}
        th.join(timeout=60)
    res = result["res"]
    assert res.exit_code == 0, res.output
    status = json.loads(res.output[res.output.index("{"):])
    assert status["version"] == "v1"
    assert np.isfinite(float(got[0]["value"][1]))


def test_serve_metrics_port_in_use_is_one_line_exit_2(tmp_path: Path) -> None:
    import socket

    signer = Signer.generate()
    reg = FileRegistry(tmp_path / "registry")
    publish(reg, tmp_path, ConstantPolicy(SPEC, [0.5, 1.0, 0.3]), "v1", signer)
    promote(reg, "v1")
    (tmp_path / "keys").mkdir()
    save_public_key(signer.public_key, tmp_path / "keys" / "publisher.pub.pem")
    from edgetwin.cli import app
    from edgetwin.contract.errors import InputError

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        res = CliRunner().invoke(app, [
            "serve", "--site", SITE, "--registry", str(tmp_path / "registry"), "--trust", str(tmp_path / "keys"),
            "--cache-dir", str(tmp_path / "cache"), "--metrics-port", str(busy.getsockname()[1]), "--duration", "0.2",
        ])  # fmt: skip
    assert isinstance(res.exception, InputError) and "--metrics-port" in str(res.exception)


pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
