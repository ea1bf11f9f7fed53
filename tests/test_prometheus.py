"""Logs from Prometheus: the mapping, the offline dump path, and a round trip through a real server.

The round trip: the emulated cluster's log -> OpenMetrics -> ``promtool tsdb create-blocks-from
openmetrics`` -> a real ``prometheus`` on a loopback port -> ``/api/v1/query_range`` with the mapping
-> the same log (rows, columns, values) -> a twin fits on it. Without the binaries those tests skip
(``apt-get install -y prometheus``; ``.ci/run`` installs it) and the offline path is still tested.
"""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import tomli_w
from conftest import cli_in_process
from prometheus_server import PrometheusServer, backfill

from edgetwin.contract.errors import InputError
from edgetwin.contract.policy import RandomPolicy
from edgetwin.contract.prometheus.exposition import write_openmetrics
from edgetwin.contract.prometheus.http import PrometheusHTTP
from edgetwin.contract.prometheus.importer import import_prometheus
from edgetwin.contract.prometheus.mapping import Mapping
from edgetwin.contract.spec import TwinSpec
from edgetwin.contract.validate import load_valid_log
from edgetwin.emulator.cluster import ClusterConfig
from edgetwin.emulator.logs import generate_logs, write_openmetrics_logs

REPO = Path(__file__).resolve().parents[1]
DAY0 = 1767225600  # 2026-01-01T00:00:00Z
KEYS = ["episode", "t", "agent", "scenario", "site"]


@pytest.fixture(scope="module")
def cluster_log(tmp_path_factory: pytest.TempPathFactory) -> tuple[pd.DataFrame, TwinSpec, Path, Path]:
    """Two emulated days (16 ticks of 15 min each) of 10 service groups, as a table and as OpenMetrics."""
    log, spec = generate_logs(ClusterConfig(n_agents=10, steps=16), episodes=2, policy="random", seed=3)
    d = tmp_path_factory.mktemp("om")
    dump, mapping = write_openmetrics_logs(log, spec, d / "cluster.om", start=DAY0)
    return log, spec, dump, mapping


def assert_same_log(imported: pd.DataFrame, original: pd.DataFrame, spec: TwinSpec) -> None:
    """Same rows, columns and values; the importer's episodes are days, the emulator's numbers."""
    days = sorted(imported["episode"].unique())
    assert days == [f"2026-01-0{i + 1}" for i in range(original["episode"].nunique())]
    got = imported.assign(episode=imported["episode"].map({d: i for i, d in enumerate(days)}))
    want = original.copy()
    extra = [c for c in ("policy", "propensity") if c in original.columns]
    cols = KEYS + extra[:1] + [f.name for f in spec.features] + ["reward"] + extra[1:]
    assert set(got.columns) == set(cols)
    got = got.astype({"episode": np.int64}).sort_values(["episode", "t", "agent"]).reset_index(drop=True)
    want = want.astype({"episode": np.int64}).sort_values(["episode", "t", "agent"]).reset_index(drop=True)
    assert len(got) == len(want)
    keys = KEYS + extra[:1]
    pd.testing.assert_frame_equal(got[keys], want[keys], check_dtype=False)
    values = cols[len(keys):]
    np.testing.assert_allclose(got[values].to_numpy(float), want[values].to_numpy(float), rtol=1e-12, atol=0)


def write_mapping(path: Path, data: dict) -> Path:
    path.write_text(tomli_w.dumps(data))
    return path


# ------------------------------------------------------------------------------------ offline
def test_openmetrics_dump_round_trips_offline(cluster_log, tmp_path: Path) -> None:
    log, spec, dump, mapping = cluster_log
    res = import_prometheus(mapping, tmp_path / "back.parquet", start="2026-01-01T00:00:00Z",
                            end="2026-01-03T00:00:00Z", from_file=dump)  # fmt: skip
    assert res.spec_written and res.report.usable and res.report.n_quarantined == 0
    assert_same_log(pd.read_parquet(tmp_path / "back.parquet"), log, spec)
    # the spec skeleton carries the emulator spec's features (kinds, bounds, scope) and its step
    skeleton = TwinSpec.load(res.spec_path)
    assert skeleton.features == spec.features and skeleton.step_seconds == spec.step_seconds == 900
    assert res.series["state.latency_ms"] == 20  # 10 groups x 2 days (new service groups each day)


def test_missing_label_rows_are_quarantined_and_counted(cluster_log, tmp_path: Path) -> None:
    log, spec, _, mapping = cluster_log
    bad = log.copy()
    dump = tmp_path / "lacking.om"
    write_openmetrics(bad, dump, start=DAY0, step_seconds=900, columns=["action.price"])
    text = dump.read_text()
    victim = bad["agent"].iloc[0]
    # that agent's action.price series lost its `site` label (an exporter that forgot it)
    text = text.replace(f'edgetwin_action_price{{agent="{victim}",site="', f'edgetwin_action_price{{agent="{victim}",zone="')
    rest = tmp_path / "rest.om"
    cols = [f.name for f in spec.features if f.name != "action.price"] + ["reward"]
    cols += [c for c in ("propensity",) if c in bad.columns]
    write_openmetrics(bad, rest, start=DAY0, step_seconds=900, columns=cols)
    dump.write_text(rest.read_text().replace("# EOF\n", "") + text)
    res = import_prometheus(mapping, tmp_path / "x.parquet", start=DAY0, end=DAY0 + 2 * 86400, from_file=dump)
    (miss,) = res.missing
    assert (miss.column, miss.key, miss.label, miss.series, miss.rows) == ("action.price", "site", "site", 1, 16)
    # the victim's 16 rows lack action.price (NaN), the 16 unkeyed rows have an empty site: both quarantined
    r = res.report
    assert r.usable and r.n_quarantined == 32 and r.n_usable == len(log) - 16
    assert r.n_usable + r.n_quarantined == r.n_rows == len(res.table)
    assert r.find("empty_label", "site") or any(p.column == "site" for p in r.quarantine)
    assert (tmp_path / "x.quarantine.csv").is_file()
    assert "without label 'site'" in res.summary()


def test_several_series_per_agent_is_a_mapping_error(cluster_log, tmp_path: Path) -> None:
    log, _, _, _ = cluster_log
    dump = tmp_path / "pods.om"
    two = pd.concat([log.assign(pod="a"), log.assign(pod="b")])
    # two pods per service group: the label `pod` is not in the mapping
    write_openmetrics(two.drop(columns=["pod"]).assign(policy=two["pod"].to_numpy()), dump, start=DAY0,
                      step_seconds=900, columns=["action.price"])  # fmt: skip
    m = write_mapping(tmp_path / "m.toml", {"keys": {"agent": "agent", "site": "site", "scenario": "scenario"},
                                            "columns": {"action.price": {"query": "edgetwin_action_price"}}})  # fmt: skip
    with pytest.raises(InputError, match=r'columns\."action\.price".*several series for agent .*policy') as e:
        import_prometheus(m, tmp_path / "x.parquet", start=DAY0, end=DAY0 + 86400, step="15m", from_file=dump)
    assert str(m) in str(e.value)


@pytest.mark.parametrize(
    ("mapping", "match"),
    [
        ({"keys": {"agent": "a"}, "columns": {"state.x": {"query": "x"}, "latency": {"query": "y"}}},
         r'columns\."latency": not a contract column'),
        ({"keys": {"agent": "a"}, "columns": {"action.x": {"query": ""}}}, r'columns\."action\.x": `query`'),
        ({"keys": {"agent": "a"}, "columns": {"action.x": {"query": "x", "lo": 1}}}, r"unknown keys \['lo'\]"),
        ({"keys": {"agent": "a"}, "columns": {"action.x": {"query": "x", "kind": "weird"}}}, r'columns\."action\.x".*kind'),
        ({"keys": {"site": "s"}, "columns": {"action.x": {"query": "x"}}}, r"keys\.agent: missing"),
        ({"keys": {"agent": "a", "episode": "week"}, "columns": {"action.x": {"query": "x"}}}, r"keys\.episode"),
        ({"keys": {"agent": "a"}, "columns": {"state.x": {"query": "x"}}}, r"no action\.\* column"),
        ({"keys": {"agent": "a"}, "columns": {"action.x": {"query": "x"}}, "step": "5 minutes"}, r"step: expected a duration"),
    ],
)
def test_bad_mappings_name_the_entry(tmp_path: Path, mapping: dict, match: str) -> None:
    path = write_mapping(tmp_path / "bad.toml", mapping)
    with pytest.raises(InputError, match=match) as e:
        Mapping.load(path)
    assert str(path) in str(e.value)


def test_range_step_and_source_errors(cluster_log, tmp_path: Path) -> None:
    _, _, dump, mapping = cluster_log
    kw = {"from_file": dump, "start": DAY0}
    with pytest.raises(InputError, match=r"--step: a step of 420 s does not divide"):
        import_prometheus(mapping, tmp_path / "x.parquet", end=DAY0 + 86400, step="7m", **kw)
    m = tomllib.loads(mapping.read_text())
    m["step"] = 420
    with pytest.raises(InputError, match=r"m\.toml: step: a step of 420 s does not divide"):
        import_prometheus(write_mapping(tmp_path / "m.toml", m), tmp_path / "x.parquet", end=DAY0 + 86400, **kw)
    with pytest.raises(InputError, match=r"--end .* must be after --start"):
        import_prometheus(mapping, tmp_path / "x.parquet", end=DAY0, **kw)
    # a range where the dump has nothing: the first query is named
    with pytest.raises(InputError, match=r'columns\."profile\.mean_task_s": the query returned no series'):
        import_prometheus(mapping, tmp_path / "x.parquet", from_file=dump, start=DAY0 - 86400, end=DAY0)
    # offline, a query must be a plain selector
    m = tomllib.loads(mapping.read_text())
    m["columns"]["action.price"]["query"] = "sum by (agent) (edgetwin_action_price)"
    with pytest.raises(InputError, match=r'columns\."action\.price": offline .* plain selector'):
        import_prometheus(write_mapping(tmp_path / "m2.toml", m), tmp_path / "x.parquet", end=DAY0 + 86400, **kw)


def test_episode_from_a_label_and_selector_matchers(tmp_path: Path) -> None:
    text = "".join(
        f'm_act{{svc="{a}",run="{r}",env="prod"}} {i * 10 + j} {DAY0 + 3600 * r0 + 60 * i}\n'
        for j, (a, r, r0) in enumerate([("x", "r1", 0), ("y", "r1", 0), ("x", "r2", 5)])
        for i in range(3)
    ) + 'm_act{svc="z",run="r1",env="test"} 1 ' + f"{DAY0}\n"
    dump = tmp_path / "d.prom"  # text exposition: timestamps in milliseconds
    dump.write_text("# TYPE m_act gauge\n" + "\n".join(
        f"{ln.rsplit(' ', 1)[0]} {int(ln.rsplit(' ', 1)[1]) * 1000}" for ln in text.splitlines()) + "\n")  # fmt: skip
    m = write_mapping(tmp_path / "m.toml", {"keys": {"agent": "svc", "site": {"value": "north"}, "episode": {"label": "run"}},
                                            "columns": {"action.a": {"query": 'm_act{env=~"pr.*",svc!="q"}'}}})  # fmt: skip
    res = import_prometheus(m, tmp_path / "x.csv", start=DAY0, end=DAY0 + 6 * 3600, step=60, from_file=dump)
    t = res.table
    assert sorted(t["episode"].unique()) == ["r1", "r2"] and set(t["site"]) == {"north"}
    # t counts from the episode's first step; a series that stops stays visible for the lookback
    # (5 min: Prometheus' instant-vector rule, which the server applies too) after its last sample
    r2 = t[t.episode == "r2"]
    assert r2["t"].tolist() == list(range(8)) and r2["action.a"].tolist() == [2.0, 12.0] + [22.0] * 6
    assert t[(t.episode == "r1") & (t.agent == "y")]["action.a"].tolist()[:3] == [1.0, 11.0, 21.0]
    assert "z" not in set(t["agent"])


def _cli(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``edgetwin ARGV`` in this process (`conftest.cli_in_process`), without proxies or debug
    tracebacks from the environment (the command as its own process is
    tests/security/test_prometheus_importer.py's real-Prometheus test)."""
    return cli_in_process(argv, ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY", "EDGETWIN_DEBUG"))


def test_cli_import_from_file_and_one_line_errors(cluster_log, tmp_path: Path) -> None:
    _, _, dump, mapping = cluster_log
    base = ["logs", "import", "prometheus", "--mapping", str(mapping),
            "--start", "2026-01-01T00:00:00Z", "--end", "2026-01-02T00:00:00Z"]  # fmt: skip
    ok = _cli([*base, "--out", str(tmp_path / "a.parquet"), "--from-file", str(dump), "--json"])
    assert ok.returncode == 0, ok.stderr
    assert '"n_quarantined": 0' in ok.stdout and (tmp_path / "a.spec.toml").is_file()
    bad = _cli([*base, "--out", str(tmp_path / "b.parquet"), "--url", "http://127.0.0.1:9", "--retries", "0"])
    assert bad.returncode == 2
    last = bad.stderr.strip().splitlines()[-1]
    assert last.startswith("error: --url: cannot reach Prometheus") and "Traceback" not in bad.stderr


# ------------------------------------------------------------------------------------ a real server
def test_round_trip_through_a_real_prometheus(cluster_log, tmp_path: Path) -> None:
    """Backfill the emulator's OpenMetrics, import it back over HTTP in chunks, fit a twin on it."""
    log, spec, dump, mapping = cluster_log
    backfill(dump, tmp_path / "tsdb")
    with PrometheusServer(tmp_path, tmp_path / "tsdb") as prom:
        client = PrometheusHTTP(prom.url, max_points=50)  # 192 steps: 4 chunks per query
        res = import_prometheus(mapping, tmp_path / "back.parquet", start="2026-01-01T00:00:00Z",
                                end="2026-01-03T00:00:00Z", client=client)  # fmt: skip
        assert client.requests == 4 * len(res.series)
        # PromQL, not only selectors: an aggregation by the key labels gives the same column
        m = tomllib.loads(mapping.read_text())
        m["columns"] = {c: e for c, e in m["columns"].items() if c.startswith(("action.", "state.latency"))}
        m["columns"]["state.latency_ms"]["query"] = "max by (agent, site, scenario) (edgetwin_state_latency_ms * 1)"
        agg = import_prometheus(write_mapping(tmp_path / "agg.toml", m), tmp_path / "agg.parquet",
                                start=DAY0, end=DAY0 + 2 * 86400, url=prom.url)  # fmt: skip
        # the server's own errors: a query it rejects, a query with no series, a wrong key label
        m["columns"]["state.latency_ms"]["query"] = "rate(edgetwin_state_latency_ms[5m]"
        with pytest.raises(InputError, match=r'agg2\.toml: columns\."state\.latency_ms": the server rejected the query: bad_data'):
            import_prometheus(write_mapping(tmp_path / "agg2.toml", m), tmp_path / "y.parquet", start=DAY0, end=DAY0 + 86400, url=prom.url)
        m["columns"]["state.latency_ms"]["query"] = "edgetwin_no_such_metric"
        with pytest.raises(InputError, match=r'columns\."state\.latency_ms": the query returned no series'):
            import_prometheus(write_mapping(tmp_path / "agg3.toml", m), tmp_path / "y.parquet", start=DAY0, end=DAY0 + 86400, url=prom.url)
    assert res.report.usable and res.report.n_quarantined == 0 and res.report.n_rows == len(log)
    assert_same_log(pd.read_parquet(tmp_path / "back.parquet"), log, spec)
    np.testing.assert_array_equal(agg.table["state.latency_ms"].to_numpy(), res.table["state.latency_ms"].to_numpy())

    from edgetwin.twin.twin import Twin

    table, got_spec, _ = load_valid_log(tmp_path / "back.parquet")
    twin = Twin.fit(table, got_spec, members=1, seed=0, progress=False, population_model="empirical",
                    bc_epochs=3, rounds=1, world_agents=8, n_steps=4, demo_batch_size=32)  # fmt: skip
    assert twin.spec.names("action") == spec.names("action")
    pop = twin.sample_population(5)
    assert len(pop) == 5 and {c for c in pop.columns if c.startswith("profile.")} <= set(spec.names("profile"))
    rolled = twin.rollout(RandomPolicy(got_spec, 0), episodes=1, seed=0, n_agents=5, steps=3)
    assert len(rolled) == 15 and np.isfinite(rolled[spec.names("response")].to_numpy()).all()


def docs_mapping() -> dict:
    """The worked example of docs/log-format.md, "Importing from Prometheus", as written there."""
    text = (REPO / "docs" / "log-format.md").read_text()
    block = text.split("```toml\n# queue.mapping.toml", 1)[1].split("\n", 1)[1].split("```", 1)[0]
    return tomllib.loads(block)


def test_the_documented_mapping_imports_from_a_real_prometheus(tmp_path: Path) -> None:
    """The docs' mapping (PromQL aggregations, label overrides, policy) on metrics as exporters write them."""
    mapping = Mapping.from_dict(docs_mapping(), source="docs")
    assert mapping.column_names[:3] == ["profile.arrival_rate", "profile.tier", "state.queue_len"]
    assert mapping.step == 300 and mapping.labels_policy
    # a day at 5 minutes of two services; two pods each; the scheduler labels by deployment and policy
    steps, rng = 288, np.random.default_rng(0)
    services = {"checkout": ("web", 1, "v1"), "nightly-etl": ("batch", 3, "v2")}
    fams: dict[str, list[str]] = {}
    truth = []
    for svc, (tier_name, tier, pol) in services.items():
        key = f'service="{svc}",cluster="north",tier="{tier_name}"'
        for k in range(steps):
            ts = DAY0 + 300 * k
            q = rng.integers(0, 50, 2)
            lat = rng.uniform(0.01, 0.5, 2)
            row = {"agent": svc, "t": k, "profile.arrival_rate": 12.5 if tier == 1 else 0.2, "profile.tier": tier,
                   "state.queue_len": float(q.sum()), "action.cpu_share": round(float(rng.uniform()), 3),
                   "action.admit": float(rng.integers(0, 2)), "response.offload": round(float(rng.uniform()), 3),
                   "kpi.latency_ms": 1000 * float(lat.mean()), "policy": pol}  # fmt: skip
            truth.append(row)
            add = fams.setdefault
            add("service_arrival_rate", []).append(f"service_arrival_rate{{{key}}} {row['profile.arrival_rate']} {ts}")
            add("service_tier", []).append(f"service_tier{{{key}}} {tier} {ts}")
            for p in range(2):
                add("queue_length", []).append(f'queue_length{{{key},pod="{p}"}} {q[p]} {ts}')
                add("request_latency_seconds", []).append(f'request_latency_seconds{{{key},pod="{p}"}} {float(lat[p])!r} {ts}')
            dep = f'deployment="{svc}",cluster="north",tier="{tier_name}",policy="{pol}"'
            add("scheduler_cpu_share", []).append(f"scheduler_cpu_share{{{dep}}} {row['action.cpu_share']} {ts}")
            add("scheduler_admit", []).append(f"scheduler_admit{{{dep}}} {row['action.admit']} {ts}")
            add("service_offload_ratio", []).append(f"service_offload_ratio{{{key}}} {row['response.offload']} {ts}")
    dump = tmp_path / "exporters.om"
    # OpenMetrics keeps each series' samples together (a stable sort by series keeps their time order)
    dump.write_text("".join(f"# TYPE {n} gauge\n" + "\n".join(sorted(lines, key=lambda ln: ln.rsplit(" ", 2)[0])) + "\n"
                            for n, lines in fams.items()) + "# EOF\n")  # fmt: skip
    path = write_mapping(tmp_path / "queue.mapping.toml", docs_mapping())
    backfill(dump, tmp_path / "tsdb")
    with PrometheusServer(tmp_path, tmp_path / "tsdb") as prom:
        res = import_prometheus(path, tmp_path / "queue.parquet", start="2026-01-01T00:00:00Z",
                                end="2026-01-02T00:00:00Z", url=prom.url)  # fmt: skip
    assert res.report.usable and res.report.n_quarantined == 0 and not res.missing
    got = res.table.sort_values(["agent", "t"]).reset_index(drop=True)
    want = pd.DataFrame(truth).sort_values(["agent", "t"]).reset_index(drop=True)
    assert (got["episode"] == "2026-01-01").all() and set(got["site"]) == {"north"}
    assert got["scenario"].tolist() == want["agent"].map({s: v[0] for s, v in services.items()}).tolist()
    assert got["policy"].tolist() == want["policy"].tolist()
    for col in mapping.column_names:
        np.testing.assert_allclose(got[col].to_numpy(float), want[col].to_numpy(float), rtol=1e-12, err_msg=col)
    spec = TwinSpec.load(tmp_path / "queue.spec.toml")
    assert spec.name == "queue-platform" and spec.step_seconds == 300 and spec.feature("profile.tier").values == (1, 2, 3)
    # offline, the aggregations cannot run: the entry is named
    with pytest.raises(InputError, match=r'columns\."state\.queue_len": offline'):
        import_prometheus(path, tmp_path / "off.parquet", start=DAY0, end=DAY0 + 86400, from_file=dump)


def test_http_client_retries_5xx_then_gives_up_in_one_line(tmp_path: Path) -> None:
    """A server that answers 503 (a Prometheus restarting, a proxy in front of it) is asked again."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from edgetwin.contract.prometheus.grid import Grid
    from edgetwin.contract.prometheus.http import PrometheusUnreachable

    plan: list[int] = [503, 200]
    seen: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
            seen.append(self.rfile.read(int(self.headers["Content-Length"])).decode())
            code = plan.pop(0) if plan else 503
            body = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
                {"metric": {"agent": "a"}, "values": [[DAY0, "1.5"], [DAY0 + 60, "NaN"], [DAY0 + 120, "2"]]}]}})
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body.encode() if code == 200 else b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        client = PrometheusHTTP(url, retries=2, backoff=0.01)
        ((labels, values),) = client.series("up", Grid(DAY0, 60, 3))
        assert client.requests == 2 and labels == {"agent": "a"}
        np.testing.assert_array_equal(values, [1.5, np.nan, 2.0])
        assert "query=up" in seen[0] and f"start={DAY0}" in seen[0] and "step=60" in seen[0]
        with pytest.raises(PrometheusUnreachable, match=r"after 3 attempts \(HTTP 503"):
            PrometheusHTTP(url, retries=2, backoff=0.01).series("up", Grid(DAY0, 60, 3))
    finally:
        server.shutdown()


def test_unreadable_mapping_and_dump_files_are_named(tmp_path: Path) -> None:
    bad = tmp_path / "m.toml"
    bad.write_bytes(b"keys = {agent = \xff}")
    with pytest.raises(InputError, match=r"m\.toml: not UTF-8"):
        Mapping.load(bad)
    bad.write_text("keys = [")
    with pytest.raises(InputError, match=r"m\.toml: not valid TOML"):
        Mapping.load(bad)
    with pytest.raises(InputError, match=r"nope\.toml: mapping file not found"):
        Mapping.load(tmp_path / "nope.toml")
    good = write_mapping(tmp_path / "g.toml", {"keys": {"agent": "a"}, "columns": {"action.x": {"query": "x"}}})
    dump = tmp_path / "d.om"
    dump.write_text("# TYPE x gauge\nx{a=\"1\"} 1\n# EOF\n")  # a scrape: no timestamps
    with pytest.raises(InputError, match=r"d\.om: sample x\{a=\"1\"\} has no timestamp"):
        import_prometheus(good, tmp_path / "o.parquet", start=DAY0, end=DAY0 + 60, step=60, from_file=dump)
    dump.write_text("x{a=\"1\" 1 1\n")
    with pytest.raises(InputError, match=r"d\.om: cannot parse it as Prometheus text exposition"):
        import_prometheus(good, tmp_path / "o.parquet", start=DAY0, end=DAY0 + 60, step=60, from_file=dump)
    with pytest.raises(InputError, match=r"o\.txt: unknown log format"):
        import_prometheus(good, tmp_path / "o.txt", start=DAY0, end=DAY0 + 60, step=60, url="http://127.0.0.1:9")
    with pytest.raises(InputError, match=r"--start: expected a time"):
        import_prometheus(good, tmp_path / "o.parquet", start="yesterday", end=DAY0 + 60, step=60, from_file=dump)


def test_policy_label_switch_gives_the_policy_column_and_lookback_overlap_is_refused(tmp_path: Path) -> None:
    """A decision series whose policy label changes mid-day: one agent, two series, in turn."""

    def dump(interval: int) -> Path:
        lines = [f'act{{svc="a",policy="{"v1" if k < 5 else "v2"}"}} {k} {DAY0 + interval * k}' for k in range(10)]
        lines.sort(key=lambda ln: ln.rsplit(" ", 2)[0])  # series by series (OpenMetrics)
        path = tmp_path / f"d{interval}.om"
        path.write_text("# TYPE act gauge\n" + "\n".join(lines) + "\n# EOF\n")
        return path

    m = write_mapping(tmp_path / "m.toml", {"keys": {"agent": "svc", "policy": "policy"},
                                            "columns": {"action.x": {"query": "act"}}})  # fmt: skip
    res = import_prometheus(m, tmp_path / "a.parquet", start=DAY0, end=DAY0 + 6000, step=600, from_file=dump(600))
    assert res.table["policy"].tolist() == ["v1"] * 5 + ["v2"] * 5 and res.table["action.x"].tolist() == list(range(10))
    # sampled every minute, the old series is still visible for the 5-minute lookback: refused, named
    with pytest.raises(InputError, match=r'columns\."action\.x": the query returns several series for agent \'a\''):
        import_prometheus(m, tmp_path / "b.parquet", start=DAY0, end=DAY0 + 600, step=60, from_file=dump(60))
    # two decision queries that disagree on who decided: refused, naming the later entry
    two = dump(600).read_text().replace("# EOF\n", "")
    (tmp_path / "two.om").write_text(two + two.replace("act", "act2").replace('policy="v1"', 'policy="v3"') + "# EOF\n")
    m2 = write_mapping(tmp_path / "m2.toml", {"keys": {"agent": "svc", "policy": "policy"},
                                              "columns": {"action.x": {"query": "act"}, "action.y": {"query": "act2"}}})  # fmt: skip
    with pytest.raises(InputError, match=r'columns\."action\.y": series for agent \'a\' name policy \'v3\' where .* \'v1\''):
        import_prometheus(m2, tmp_path / "c.parquet", start=DAY0, end=DAY0 + 6000, step=600, from_file=tmp_path / "two.om")


def test_logs_generate_writes_openmetrics_that_imports_back(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from edgetwin.cli import app

    runner = CliRunner()
    res = runner.invoke(app, ["logs", "generate", "--out", str(tmp_path / "g.parquet"), "--agents", "4", "--episodes", "2",
                              "--steps", "3", "--no-plot", "--openmetrics", str(tmp_path / "g.om"), "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["logs", "import", "prometheus", "--mapping", str(tmp_path / "g.mapping.toml"),
                              "--from-file", str(tmp_path / "g.om"), "--start", "2026-01-01", "--end", "2026-01-03",
                              "--out", str(tmp_path / "back.csv"), "--json"])  # fmt: skip
    assert res.exit_code == 0, res.output
    original = pd.read_parquet(tmp_path / "g.parquet")
    assert_same_log(pd.read_csv(tmp_path / "back.csv"), original, TwinSpec.load(tmp_path / "g.spec.toml"))
