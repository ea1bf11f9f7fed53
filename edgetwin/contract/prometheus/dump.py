"""Reading a metrics dump offline: an OpenMetrics or Prometheus text-exposition file with timestamps.

For operators who can export but not connect (``edgetwin logs import prometheus --from-file``). The
file is parsed by ``prometheus_client``'s own parsers (OpenMetrics when it ends with ``# EOF``, the
text format otherwise; its millisecond timestamps become seconds). A mapping's queries cannot be
evaluated without a PromQL engine, so offline a query must be a plain selector —
``name``, ``name{label="v", other=~"re.*", x!="y"}`` — and anything else is refused, naming the entry.

Sampling follows the server's instant-vector rule so that a dump and the server give the same table:
the value of a series at grid time ``T`` is its latest sample at or before ``T`` and no older than
the lookback (Prometheus' default ``--query.lookback-delta``, 5 minutes).
"""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import numpy as np

from edgetwin.contract.errors import InputError
from edgetwin.contract.prometheus.grid import Grid
from edgetwin.contract.prometheus.http import Series

#: Prometheus' default lookback (``--query.lookback-delta``): how old a sample may be and still count.
LOOKBACK_SECONDS = 300.0

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SELECTOR = re.compile(rf"^\s*(?P<name>{_NAME})?\s*(?:\{{(?P<matchers>.*)\}})?\s*$", re.S)
_MATCHER = re.compile(r'\s*(?P<label>[a-zA-Z_][a-zA-Z0-9_]*)\s*(?P<op>=~|!~|!=|=)\s*"(?P<value>(?:[^"\\]|\\.)*)"\s*(?:,|$)')


class Selector:
    """A parsed plain selector: a metric name and label matchers (``=``, ``!=``, ``=~``, ``!~``)."""

    def __init__(self, query: str, where: str) -> None:
        m = _SELECTOR.match(query)
        if m is None or (m.group("name") is None and not m.group("matchers")):
            raise InputError(
                f"offline (--from-file) a query must be a plain selector such as "
                f'name{{label="value"}}, evaluated without a PromQL engine; got {query!r} (import it from a server with --url)',
                where,
            )
        self.name = m.group("name")
        self.matchers: list[tuple[str, str, str | re.Pattern[str]]] = []
        text = (m.group("matchers") or "").strip()
        pos = 0
        while pos < len(text):
            mm = _MATCHER.match(text, pos)
            if mm is None or mm.end() == pos:
                raise InputError(f"cannot read the label matchers of {query!r} at {text[pos:]!r}", where)
            value = bytes(mm.group("value"), "utf-8").decode("unicode_escape")
            op = mm.group("op")
            if op in ("=~", "!~"):
                try:
                    self.matchers.append((mm.group("label"), op, re.compile(f"^(?:{value})$")))
                except re.error as e:
                    raise InputError(f"bad regular expression {value!r} in {query!r} ({e})", where) from None
            else:
                self.matchers.append((mm.group("label"), op, value))
            pos = mm.end()
        if self.name is None:
            names = [v for lab, op, v in self.matchers if lab == "__name__" and op == "="]
            if not names:
                raise InputError(f"offline a selector needs a metric name (name{{...}} or __name__=\"...\"), got {query!r}", where)
            self.name = str(names[0])

    def matches(self, labels: dict[str, str]) -> bool:
        for label, op, v in self.matchers:
            got = labels.get(label, "")
            if op == "=" and got != v:
                return False
            if op == "!=" and got == v:
                return False
            if op == "=~" and not v.match(got):  # type: ignore[union-attr]
                return False
            if op == "!~" and v.match(got):  # type: ignore[union-attr]
                return False
        return True


class MetricsDump:
    """Every sample of a dump, by metric name and series, ready to be sampled onto a grid.

    Args:
        path: the OpenMetrics / text-exposition file (``.gz`` is not supported: decompress it first).
        lookback: seconds a sample stays visible after its timestamp (the server's lookback delta).

    Raises:
        InputError: the file is missing or unreadable, does not parse, or has a sample without a
            timestamp (a single scrape cannot be laid on a time grid).
    """

    def __init__(self, path: str | Path, lookback: float = LOOKBACK_SECONDS) -> None:
        self.path = Path(path)
        self.lookback = float(lookback)
        if not self.path.is_file():
            raise InputError("metrics dump not found", str(self.path))
        try:
            text = self.path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise InputError(f"not UTF-8 text (byte {e.start + 1})", str(self.path)) from None
        except OSError as e:
            raise InputError(f"cannot read it ({e.strerror or e})", str(self.path)) from None
        openmetrics = text.rstrip().endswith("# EOF")
        if openmetrics:
            from prometheus_client.openmetrics.parser import text_string_to_metric_families
        else:
            from prometheus_client.parser import text_string_to_metric_families  # type: ignore[assignment]
        raw: dict[str, dict[tuple[tuple[str, str], ...], tuple[list[float], list[float]]]] = defaultdict(dict)
        try:
            for family in text_string_to_metric_families(text):
                for s in family.samples:
                    if s.timestamp is None:
                        raise InputError(
                            f"sample {s.name}{_labels_text(s.labels)} has no timestamp; a dump to import needs "
                            "one on every sample (a single scrape has no time axis)",
                            str(self.path),
                        )
                    when = float(s.timestamp)  # OpenMetrics: a Timestamp; text format: seconds already
                    labels = dict(s.labels)
                    labels["__name__"] = s.name
                    key = tuple(sorted(labels.items()))
                    bucket = raw[s.name].setdefault(key, ([], []))
                    bucket[0].append(when)
                    bucket[1].append(float(s.value))
        except InputError:
            raise
        except Exception as e:  # the parsers raise ValueError and others on malformed lines
            kind = "OpenMetrics" if openmetrics else "Prometheus text exposition"
            raise InputError(f"cannot parse it as {kind} ({type(e).__name__}: {e})", str(self.path)) from None
        self._series: dict[str, list[tuple[dict[str, str], np.ndarray, np.ndarray]]] = {}
        for name, by_key in raw.items():
            out = []
            for key, (ts_l, vs_l) in by_key.items():
                times, vals = np.asarray(ts_l, dtype=np.float64), np.asarray(vs_l, dtype=np.float64)
                order = np.argsort(times, kind="stable")
                out.append((dict(key), times[order], vals[order]))
            self._series[name] = out
        self.n_samples = sum(len(v[1]) for s in self._series.values() for v in s)

    @property
    def metric_names(self) -> list[str]:
        return sorted(self._series)

    def series(self, query: str, grid: Grid, where: str) -> list[Series]:
        """The series a plain-selector query selects, sampled on the grid (NaN where none is visible)."""
        sel = Selector(query, where)
        times = grid.times
        out: list[Series] = []
        for labels, ts, vs in self._series.get(sel.name or "", []):
            if not sel.matches(labels):
                continue
            i = np.searchsorted(ts, times, side="right") - 1
            ok = i >= 0
            ok[ok] &= ts[i[ok]] >= times[ok] - self.lookback
            values = np.full(grid.n, np.nan)
            values[ok] = vs[i[ok]]
            out.append((dict(labels), values))
        return out


def _labels_text(labels: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""
