"""The edge runtime's ``/metrics``: what Prometheus, Grafana and a Kayenta-style canary judge read.

`instrument(runtime)` attaches a `RuntimeMetrics` to an `edgetwin.edge.runtime.EdgeRuntime`; the
runtime calls narrow hooks (`RuntimeMetrics.observe_decision` around each decision and
`observe_routed` around each decision routed by a canary's arms, `observe_kpis` for each live KPI
report, `observe_canary_rows` for each tick of a canary's log), and everything else is read from
``runtime.status()`` when Prometheus scrapes (a custom collector: no state is copied, so nothing can
drift from what the runtime itself reports). `serve_metrics` exposes the registry over HTTP
(``edgetwin serve --metrics-port``), with prometheus-client's own server.

Families (every one carries ``site``):

| family | type | labels | what |
|---|---|---|---|
| ``edgetwin_decisions_total`` | counter | ``policy``, ``arm`` | decision calls answered, per policy version and slice |
| ``edgetwin_decision_rows_total`` | counter | ``policy``, ``arm`` | rows (service groups) decided |
| ``edgetwin_decision_latency_seconds`` | histogram | ``policy``, ``arm`` | time in the policy and shield per call |
| ``edgetwin_kpi`` | gauge | ``policy``, ``arm``, ``kpi`` | the last reported value of each live KPI |
| ``edgetwin_kpi_reports_total`` | counter | ``policy``, ``arm`` | live KPI reports received |
| ``edgetwin_policy_info`` | gauge (1) | ``policy``, ``scope``, ``revision`` | the version served now |
| ``edgetwin_kpi_watch_state`` | gauge (one-hot) | ``policy``, ``state`` | ``off``, ``idle``, ``judging`` or ``accepted`` |
| ``edgetwin_kpi_watch_reports`` | gauge | ``policy`` | reports the watch has seen for the served version |
| ``edgetwin_kpi_watch_baseline`` | gauge | ``policy``, ``kpi`` | the baseline the watch compares against |
| ``edgetwin_kpi_watch_window_mean`` | gauge | ``policy``, ``kpi`` | the watch's current window mean |
| ``edgetwin_rollbacks_total`` | counter | | KPI-triggered rollbacks |
| ``edgetwin_policy_swaps_total`` | counter | | hot swaps |
| ``edgetwin_policy_refused_total`` | counter | | versions refused (signature, integrity, contract) |
| ``edgetwin_registry_reachable`` | gauge | | 1 reachable, 0 not (absent before the first call) |
| ``edgetwin_canary_commands_accepted_total`` | counter | | signed canary starts run (`edgetwin.edge.canary_command`) |
| ``edgetwin_canary_commands_refused_total`` | counter | ``reason`` | canary commands refused: ``unsigned``, ``untrusted_key``, ``bad_signature``, ``invalid``, ``unknown_version``, ``digest_mismatch``, ``not_current``, ``busy``, ``finished``, ``unknown_run`` |
| ``edgetwin_decisions_unrouted_total`` | counter | | decision calls during a canary that named no service groups (served by the current policy) |
| ``edgetwin_reports_rejected_total`` | counter | ``kind``, ``reason`` | ``kpi_report`` / ``canary_outcome`` messages not used (``unauthenticated``, ``other_site``, ``no_run``, ``invalid``, ``duplicate``) |
| ``edgetwin_kpis_undeclared_total`` | counter | | reported KPI names no spec or guard declares (dropped: never a series) |
| ``edgetwin_canary_unjoined_total`` | counter | ``side`` | ``decisions`` without an outcome row, ``outcomes`` without a decision |

Only KPIs the served policy's spec (or the runtime's) declares, or the guard watches, become
``edgetwin_kpi`` series; the label values of the counters above come from fixed lists (never from a
message), so no sender can grow the page.

**Arms** are the runtime's own (`edgetwin.edge.canary`): ``fleet`` is what the site serves outside
any canary slice; inside a slice each service group is randomized to ``candidate`` (the version
under test) or ``control`` (the current version), for the whole canary. A canary judge compares
the same family across the two arms of the slice — e.g. Kayenta's control scope
``{site="s", arm="control"}`` against the experiment scope ``{site="s", arm="candidate"}`` on
``edgetwin_kpi{kpi="kpi.slo_violation"}`` (the tick's mean over the arm's rows), or on
``histogram_quantile(0.99, sum by (le, arm) (rate(edgetwin_decision_latency_seconds_bucket[5m])))``.
"""

from __future__ import annotations

import threading
import warnings
from collections import Counter as Tally
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from edgetwin.edge.runtime import EdgeRuntime

__all__ = ["ARMS", "LATENCY_BUCKETS", "RuntimeMetrics", "instrument", "serve_metrics"]

#: The arms a runtime reports under: outside a canary slice, and its two randomized arms inside one.
ARMS: tuple[str, ...] = ("fleet", "control", "candidate")
#: Decision latency buckets in seconds: 50 us .. 2.5 s, dense where an edge decision lives (< 10 ms).
LATENCY_BUCKETS: tuple[float, ...] = (
    0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)  # fmt: skip
WATCH_STATES: tuple[str, ...] = ("off", "idle", "judging", "accepted")


class RuntimeMetrics:
    """The metrics of one runtime, in their own `CollectorRegistry` (several runtimes per process).

    Args:
        runtime: the runtime whose ``status()`` the scrape-time collector reads.
        registry: where the families are registered (default: a new one).
    """

    def __init__(self, runtime: EdgeRuntime, registry: CollectorRegistry | None = None) -> None:
        self.runtime = runtime
        self.site = runtime.site
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        labels = ["site", "policy", "arm"]
        self.decisions = Counter("edgetwin_decisions", "Decision calls answered", labels, registry=self.registry)
        self.rows = Counter("edgetwin_decision_rows", "Rows (service groups) decided", labels, registry=self.registry)
        self.latency = Histogram(
            "edgetwin_decision_latency_seconds", "Seconds in the policy and shield per decision call", labels,
            buckets=LATENCY_BUCKETS, registry=self.registry,
        )  # fmt: skip
        self.kpi = Gauge("edgetwin_kpi", "The last reported value of a live KPI", [*labels, "kpi"], registry=self.registry)
        self.kpi_reports = Counter("edgetwin_kpi_reports", "Live KPI reports received", labels, registry=self.registry)
        self.registry.register(_StatusCollector(runtime))
        self._lock = threading.Lock()

    def observe_decision(self, policy: str, rows: int, seconds: float, arm: str = "fleet") -> None:
        """One decision call: ``rows`` decided by ``policy`` in ``seconds`` (the runtime's hook)."""
        self.decisions.labels(self.site, policy, arm).inc()
        self.rows.labels(self.site, policy, arm).inc(rows)
        self.latency.labels(self.site, policy, arm).observe(seconds)

    def observe_routed(self, policy: Any, arms: Any, seconds: float) -> None:
        """One decision call routed by a canary (`EdgeRuntime.decide_for`): rows per (policy, arm),
        each group's decision counted once with the call's latency."""
        pol = np.asarray(policy, dtype=object).astype(str)
        arm = np.asarray(arms, dtype=object).astype(str)
        for (p, a), n in Tally(zip(pol.tolist(), arm.tolist(), strict=True)).items():
            self.observe_decision(p, n, seconds, arm=a)

    def observe_canary_rows(self, canary: Any, rows: Any) -> None:
        """One tick of a canary's log (`EdgeRuntime.canary_report`): the mean of each guarded KPI
        over each arm's rows, under the arm's policy (what a judge compares, tick by tick)."""
        kpis = [m.kpi for m in canary.config.margins]
        scen = rows["scenario"].astype(str).tolist() if "scenario" in rows.columns else None
        arms = np.asarray(canary.router.arms(rows["agent"].astype(str).tolist(), rows["site"].astype(str).tolist(), scen))
        policy = rows["policy"].astype(str).to_numpy()
        values = rows[kpis].to_numpy(dtype=np.float64)
        for a in ARMS:
            mask = arms == a
            if not mask.any():
                continue
            for p in sorted(set(policy[mask].tolist())):
                sel = mask & (policy == p)
                with np.errstate(invalid="ignore"), warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)  # a KPI all NaN on this arm: not reported
                    means = np.nanmean(values[sel], axis=0)
                self.observe_kpis({k: float(v) for k, v in zip(kpis, means, strict=True) if np.isfinite(v)}, p, arm=a)

    def observe_kpis(self, kpis: Mapping[str, float], policy: str, arm: str = "fleet") -> None:
        """One live KPI report of ``policy`` on ``arm`` (the runtime's hooks)."""
        with self._lock:  # the gauges of one report change together
            for name, value in kpis.items():
                self.kpi.labels(self.site, policy, arm, name).set(float(value))
            self.kpi_reports.labels(self.site, policy, arm).inc()

    def exposition(self) -> bytes:
        """The text exposition of every family (what a scrape of ``/metrics`` returns)."""
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


class _StatusCollector(Collector):
    """Families read from ``runtime.status()`` at scrape time: the served version, the KPI watch,
    the runtime's counters."""

    def __init__(self, runtime: EdgeRuntime) -> None:
        self.runtime = runtime

    def describe(self) -> list[Any]:
        return []  # the families depend on the state: no fixed description (prometheus-client allows it)

    def collect(self) -> Iterator[Any]:
        st = self.runtime.status()
        site, version = str(st["site"]), st.get("version")
        info = GaugeMetricFamily("edgetwin_policy_info", "The policy version served now", labels=["site", "policy", "scope", "revision"])
        if version is not None:
            info.add_metric([site, str(version), str(st.get("scope")), str(st.get("revision"))], 1.0)
        yield info
        watch = st.get("kpi_watch")
        state = "off" if watch is None else "idle" if watch.get("version") is None else (
            "accepted" if watch.get("accepted") else "judging"
        )  # fmt: skip
        policy = str((watch or {}).get("version") or version or "")
        fam = GaugeMetricFamily("edgetwin_kpi_watch_state", "The KPI watch's state (one-hot)", labels=["site", "policy", "state"])
        for s in WATCH_STATES:
            fam.add_metric([site, policy, s], 1.0 if s == state else 0.0)
        yield fam
        if watch is not None:
            reports = GaugeMetricFamily("edgetwin_kpi_watch_reports", "KPI reports the watch has seen for the served version", labels=["site", "policy"])
            reports.add_metric([site, policy], float(watch.get("reports") or 0))
            yield reports
            for key, help_text, values in (
                ("baseline", "The baseline the KPI watch compares against", watch.get("baseline") or {}),
                ("window_mean", "The KPI watch's current window mean", _window_means(self.runtime)),
            ):
                g = GaugeMetricFamily(f"edgetwin_kpi_watch_{key}", help_text, labels=["site", "policy", "kpi"])
                for kpi, v in values.items():
                    g.add_metric([site, policy, str(kpi)], float(v))
                yield g
        stats = st.get("stats") or {}
        for name, key, help_text in (
            ("edgetwin_rollbacks", "rollbacks", "KPI-triggered rollbacks"),
            ("edgetwin_policy_swaps", "swaps", "Hot swaps of the served policy"),
            ("edgetwin_policy_refused", "refused", "Versions refused (signature, integrity, contract)"),
        ):
            c = CounterMetricFamily(name, help_text, labels=["site"])
            c.add_metric([site], float(stats.get(key, 0)))
            yield c
        yield from _canary_families(site, stats)
        reach = st.get("registry_reachable")
        g = GaugeMetricFamily("edgetwin_registry_reachable", "1 when the registry answered its last call", labels=["site"])
        if reach is not None:
            g.add_metric([site], 1.0 if reach else 0.0)
        yield g


_REFUSALS = ("unsigned", "untrusted_key", "bad_signature", "invalid", "unknown_version", "digest_mismatch",
             "not_current", "busy", "finished", "unknown_run")  # edgetwin.edge.canary_command.REFUSALS
_REPORT_KINDS = ("kpi_report", "canary_outcome")
_REPORT_REASONS = ("unauthenticated", "other_site", "no_run", "invalid", "duplicate")


def _canary_families(site: str, stats: Mapping[str, Any]) -> Iterator[Any]:
    """Canary commands, unrouted decisions, rejected reports and the join's leftovers (labels from
    fixed lists: a key a message could choose is never a label value)."""
    c = CounterMetricFamily("edgetwin_canary_commands_accepted", "Signed canary starts run", labels=["site"])
    c.add_metric([site], float(stats.get("canary_accepted", 0)))
    yield c
    refused = stats.get("canary_refused") or {}
    c = CounterMetricFamily("edgetwin_canary_commands_refused", "Canary commands refused", labels=["site", "reason"])
    for r in _REFUSALS:
        c.add_metric([site, r], float(refused.get(r, 0)))
    yield c
    c = CounterMetricFamily("edgetwin_decisions_unrouted", "Decision calls during a canary naming no service groups",
                            labels=["site"])  # fmt: skip
    c.add_metric([site], float(stats.get("unrouted", 0)))
    yield c
    rejected = stats.get("reports_rejected") or {}
    c = CounterMetricFamily("edgetwin_reports_rejected", "KPI and outcome reports not used", labels=["site", "kind", "reason"])
    for k in _REPORT_KINDS:
        for r in _REPORT_REASONS:
            c.add_metric([site, k, r], float(rejected.get(f"{k}:{r}", 0)))
    yield c
    c = CounterMetricFamily("edgetwin_kpis_undeclared", "Reported KPI names no spec or guard declares", labels=["site"])
    c.add_metric([site], float(stats.get("kpis_undeclared", 0)))
    yield c
    c = CounterMetricFamily("edgetwin_canary_unjoined", "Canary decisions / outcome rows without a partner", labels=["site", "side"])
    c.add_metric([site, "decisions"], float(stats.get("decisions_unjoined", 0)))
    c.add_metric([site, "outcomes"], float(stats.get("outcomes_unjoined", 0)))
    yield c


def _window_means(runtime: EdgeRuntime) -> dict[str, float]:
    watch = getattr(runtime, "watch", None)
    if watch is None:
        return {}
    try:
        return {str(k): float(v) for k, v in watch.window_means().items()}
    except Exception:  # a window still empty, or being written: nothing to report this scrape
        return {}


def instrument(runtime: EdgeRuntime, registry: CollectorRegistry | None = None) -> RuntimeMetrics:
    """Attach metrics to a runtime (its hooks start reporting at once) and return them."""
    metrics = RuntimeMetrics(runtime, registry)
    runtime.metrics = metrics
    return metrics


def serve_metrics(metrics: RuntimeMetrics, port: int, addr: str = "127.0.0.1") -> tuple[Any, threading.Thread]:
    """Serve ``/metrics`` of these metrics on ``addr:port`` in a daemon thread (prometheus-client's
    WSGI server); returns ``(server, thread)``: ``server.shutdown()`` stops it.

    Raises:
        OSError: the port cannot be bound.
    """
    from prometheus_client import start_http_server

    server, thread = start_http_server(port, addr=addr, registry=metrics.registry)
    return server, thread
