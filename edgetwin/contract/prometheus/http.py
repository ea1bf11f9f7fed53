"""Reading range queries from a Prometheus server: ``/api/v1/query_range``, retried and chunked.

Plain HTTP through the standard library (``urllib``): the API is one form-encoded POST returning
JSON, and no client library that edgetwin already depends on speaks it (``prometheus-client`` is
the exposition side only); a dedicated API client would add a dependency for ~40 lines.

* **Chunking**: Prometheus refuses an answer of more than 11,000 points per series, so a long range
  is asked for in pieces of at most ``max_points`` steps (`Grid.chunks`), each an inclusive
  ``[start, end]`` on the grid, and the pieces are laid side by side.
* **Retries**: a connection error, a timeout, HTTP 429 or 5xx is tried again ``retries`` times with
  doubling pauses; then `PrometheusUnreachable`. A query the server rejects (HTTP 400/422, or
  ``status: error``) is not retried: `PrometheusQueryError` with the server's own message.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

import numpy as np

from edgetwin.contract.prometheus.grid import MAX_POINTS, Grid

#: One series over a grid: its labels and (n,) float64 values, NaN where it has none.
Series = tuple[dict[str, str], np.ndarray]


class PrometheusUnreachable(ConnectionError):
    """The server did not answer (after the retries)."""


class PrometheusQueryError(ValueError):
    """The server answered that the query is wrong (its ``errorType: error`` as the message)."""


class PrometheusHTTP:
    """A minimal ``/api/v1/query_range`` client.

    Args:
        url: the server's base URL, e.g. ``http://127.0.0.1:9090`` (a path prefix is kept).
        timeout: seconds per HTTP request.
        retries: extra attempts after a failure that may pass (connection, timeout, 429, 5xx).
        backoff: the first pause between attempts in seconds (doubled each time).
        max_points: steps per request (at most Prometheus' 11,000 points per series).
        headers: extra request headers (e.g. ``Authorization``).
    """

    def __init__(
        self,
        url: str,
        *,
        timeout: float = 60.0,
        retries: int = 3,
        backoff: float = 0.5,
        max_points: int = MAX_POINTS,
        headers: dict[str, str] | None = None,
    ) -> None:
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"expected an http(s)://host:port URL, got {url!r}")
        self.url = url.rstrip("/")
        self.timeout = float(timeout)
        self.retries = int(retries)
        self.backoff = float(backoff)
        self.max_points = min(int(max_points), MAX_POINTS)
        self.headers = dict(headers or {})
        self.requests = 0  # HTTP requests made (retries included): the benchmark reports it
        self._count_lock = threading.Lock()  # `series` may run in several threads at once

    def series(self, query: str, grid: Grid, on_chunk: Callable[[], None] | None = None) -> list[Series]:
        """Every series the query returns over the grid, one value per step (NaN where absent).

        Raises:
            PrometheusUnreachable: no answer after the retries.
            PrometheusQueryError: the server rejected the query, or answered something else than a
                range vector (a matrix).
        """
        by_labels: dict[tuple[tuple[str, str], ...], tuple[dict[str, str], np.ndarray]] = {}
        for k0, k1 in grid.chunks(self.max_points):
            t0 = grid.start + k0 * grid.step
            t1 = grid.start + (k1 - 1) * grid.step
            data = self._post("/api/v1/query_range", {"query": query, "start": _num(t0), "end": _num(t1), "step": _num(grid.step)})
            if data.get("resultType") != "matrix":
                raise PrometheusQueryError(f"expected a range vector (matrix), got {data.get('resultType')!r}")
            for item in data.get("result", []):
                labels = {str(k): str(v) for k, v in item.get("metric", {}).items()}
                key = tuple(sorted(labels.items()))
                if key not in by_labels:
                    by_labels[key] = (labels, np.full(grid.n, np.nan))
                values = item.get("values") or []
                if not values:
                    continue
                ts = np.fromiter((v[0] for v in values), dtype=np.float64, count=len(values))
                vs = np.array([v[1] for v in values], dtype=np.float64)  # "NaN", "+Inf" parse too
                idx = grid.index_of(ts)
                ok = (idx >= k0) & (idx < k1)
                by_labels[key][1][idx[ok]] = vs[ok]
            if on_chunk is not None:
                on_chunk()
        return list(by_labels.values())

    def _post(self, path: str, form: dict[str, str]) -> dict[str, Any]:
        body = urllib.parse.urlencode(form).encode()
        headers = {"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json", **self.headers}
        last = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            with self._count_lock:
                self.requests += 1
            req = urllib.request.Request(self.url + path, data=body, headers=headers, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                    doc = json.loads(resp.read())
            except urllib.error.HTTPError as e:
                if e.code in (400, 422):
                    raise PrometheusQueryError(_server_error(e)) from None
                last = f"HTTP {e.code} {e.reason}"
                if e.code == 429 or e.code >= 500:
                    continue
                raise PrometheusUnreachable(f"{last} from {self.url}{path}") from None
            except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
                reason = getattr(e, "reason", e)
                last = f"{type(reason).__name__}: {reason}" if str(reason) else type(reason).__name__
                continue
            except json.JSONDecodeError:
                raise PrometheusUnreachable(f"{self.url}{path} did not answer JSON (is it a Prometheus server?)") from None
            if not isinstance(doc, dict) or doc.get("status") != "success":
                err = doc.get("error", doc) if isinstance(doc, dict) else doc
                raise PrometheusQueryError(str(err))
            data = doc.get("data")
            if not isinstance(data, dict):
                raise PrometheusQueryError("the answer has no data")
            return data
        raise PrometheusUnreachable(f"no answer from {self.url} after {self.retries + 1} attempts ({last})")


def _server_error(e: urllib.error.HTTPError) -> str:
    try:
        doc = json.loads(e.read())
        return f"{doc.get('errorType', 'error')}: {doc.get('error', '')}".strip()
    except Exception:  # not JSON: the status line says enough
        return f"HTTP {e.code} {e.reason}"


def _num(x: float) -> str:
    """A time or step as the API reads it: seconds, exact for whole numbers."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))
