"""docs/bus.md's "Metrics" table is the runtime's /metrics page: every family, its type and labels.

tests/test_runtime_metrics.py checks the values a scrape shows; nothing read the page's table, so a
family renamed, retyped or relabelled in `edgetwin/edge/metrics.py` left the table behind. Here a
runtime serving a policy under a KPI watch answers decisions and KPI reports, and its exposition is
parsed with prometheus-client's parser: each row's families are on the page with the row's type, every
family carries `site`, and a family with samples carries exactly `site` plus the row's labels (and a
histogram's `le`); the stated bucket range is `LATENCY_BUCKETS`'.
"""

from __future__ import annotations

import re
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families
from test_runtime import SPEC, ConstantPolicy, obs_batch, promote, publish

from edgetwin.edge.kpi_watch import KPIGuard, KPIMargin
from edgetwin.edge.metrics import LATENCY_BUCKETS, instrument
from edgetwin.edge.registry import FileRegistry
from edgetwin.edge.runtime import EdgeRuntime
from edgetwin.edge.signing import Signer, TrustStore

ROOT = Path(__file__).resolve().parents[1]
BUS = (ROOT / "docs" / "bus.md").read_text()


def _rows() -> list[tuple[list[str], str, set[str]]]:
    """(families, type, labels) of each row of the page's table."""
    start = BUS.index("| family | type | labels | what |")
    out = []
    for line in BUS[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        fam, kind, labels, _ = (c.strip() for c in line.strip().strip("|").split("|", 3))
        out.append((re.findall(r"`(\w+)`", fam), kind.split()[0], set(re.findall(r"`(\w+)`", labels))))
    return out


def _exposition(tmp_path: Path) -> dict[str, tuple[str, set[frozenset[str]]]]:
    """family name (as the page writes it: counters with ``_total``) -> (type, label-name sets of its samples)."""
    signer = Signer.generate()
    reg = FileRegistry(tmp_path / "registry")
    publish(reg, tmp_path, ConstantPolicy(SPEC, [0.5, 1.0, 0.3]), "v1", signer)
    promote(reg, "v1")
    guard = KPIGuard(margins=(KPIMargin("kpi.x", max_regression=0.1),), window=3, grace=0, patience=1, baseline="previous")
    rt = EdgeRuntime("s1", reg, TrustStore([signer.public_key]), kpi_guard=guard, poll_interval=60)
    metrics = instrument(rt)
    with rt.running_in_thread():
        for _ in range(2):
            rt.decide(obs_batch(4))
        for _ in range(3):
            rt.report_kpis({"kpi.x": 1.0})
        text = metrics.exposition().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        if fam.name.endswith("_created"):  # prometheus-client's creation time of a counter or histogram, not a family
            continue
        name = f"{fam.name}_total" if fam.type == "counter" else fam.name
        out[name] = (fam.type, {frozenset(s.labels) - {"le"} for s in fam.samples})
    return out


def test_the_metrics_table_is_the_exposition(tmp_path: Path) -> None:
    rows = _rows()
    assert len(rows) >= 15 and "Every family carries `site`." in BUS
    page = _exposition(tmp_path)
    documented = {f for fams, _, _ in rows for f in fams}
    assert documented == set(page), (sorted(documented - set(page)), sorted(set(page) - documented))
    seen = 0
    for families, kind, labels in rows:
        for family in families:
            got_type, label_sets = page[family]
            assert got_type == kind, (family, got_type, kind)
            for got in label_sets:
                assert got == {"site", *labels}, (family, sorted(got), sorted(labels))
            seen += bool(label_sets)
    assert seen >= 10  # most families had samples to check their labels on
    lo, hi = re.search(r"\((\d+) µs \.\. ([\d.]+) s buckets\)", BUS).groups()  # type: ignore[union-attr]
    assert (round(min(LATENCY_BUCKETS) * 1e6), max(LATENCY_BUCKETS)) == (int(lo), float(hi))
