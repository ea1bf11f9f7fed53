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
* **Bounds** (the server may be hostile, or a proxy in front of it may be): ``timeout`` bounds the
  whole request — connecting, the headers and every byte of the body — not each socket read (one
  byte every 2 s would otherwise keep a 5 s timeout reading forever); the answer is read up to
  ``max_bytes`` and refused beyond (a 1.5 GB answer is never held), parsed by the bounded JSON
  reader (`edgetwin.contract.json_bounds`: no depth bomb), and every part of it is type-checked
  before use (`PrometheusAnswerRefused` names the part). A redirect is followed only to http(s),
  never from https to http, and — when the request carries credentials — only to the same server.
  A server's error body is read up to 64 KiB and shown as one line of at most 300 characters.
* **Authentication**: `edgetwin.contract.prometheus.auth.HTTPClientConfig` (basic auth, a bearer
  token, TLS with the operator's CA and a client certificate), as Prometheus' own tools take it.
"""

from __future__ import annotations

import math
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

import numpy as np

from edgetwin.contract.json_bounds import loads_bounded
from edgetwin.contract.prometheus.auth import HTTPClientConfig
from edgetwin.contract.prometheus.grid import MAX_POINTS, Grid

#: The largest answer read by default (bytes). One chunk of 11,000 steps is ~0.3 MB per series; the
#: default admits ~800 series per request, and a larger fleet raises it (``--max-answer-mb``) or
#: asks fewer steps per request (``--max-points``).
MAX_ANSWER_BYTES = 256 * 1024 * 1024
#: The most of a server's error body read, and the most of it shown (characters, one line).
_ERROR_BODY_BYTES, _ERROR_SHOWN = 64 * 1024, 300

#: One series over a grid: its labels and (n,) float64 values, NaN where it has none.
Series = tuple[dict[str, str], np.ndarray]


class PrometheusUnreachable(ConnectionError):
    """The server did not answer (after the retries)."""


class PrometheusQueryError(ValueError):
    """The server answered that the query is wrong (its ``errorType: error`` as the message)."""


class PrometheusAnswerRefused(PrometheusQueryError):
    """The answer is not one edgetwin reads: too large, too deep, a part of the wrong type, or a
    redirect to where the request must not go. Never retried."""


class PrometheusHTTP:
    """A minimal ``/api/v1/query_range`` client.

    Args:
        url: the server's base URL, e.g. ``http://127.0.0.1:9090`` (a path prefix is kept).
        timeout: seconds per HTTP request, all of it (connect, headers, body).
        retries: extra attempts after a failure that may pass (connection, timeout, 429, 5xx).
        backoff: the first pause between attempts in seconds (doubled each time).
        max_points: steps per request (at most Prometheus' 11,000 points per series).
        headers: extra request headers.
        auth: credentials and TLS trust (`HTTPClientConfig`); its headers win over ``headers``.
        max_bytes: the largest answer read (bytes); a larger one is refused, never held.
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
        auth: HTTPClientConfig | None = None,
        max_bytes: int = MAX_ANSWER_BYTES,
    ) -> None:
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ValueError(f"expected an http(s)://host:port URL, got {url!r}")
        if parsed.username or parsed.password:
            raise ValueError("credentials in the URL are refused (they end up in logs): give them with --http-config")
        self.url = url.rstrip("/")
        self.timeout = float(timeout)
        self.retries = int(retries)
        self.backoff = float(backoff)
        self.max_points = min(int(max_points), MAX_POINTS)
        self.max_bytes = int(max_bytes)
        self.auth = auth or HTTPClientConfig()
        self.headers = {**dict(headers or {}), **self.auth.headers}
        self._opener = urllib.request.build_opener(
            urllib.request.HTTPSHandler(context=self.auth.ssl_context()),
            _GuardedRedirects(self.url, same_origin=self.auth.has_credentials),
        )
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
                raise PrometheusQueryError(f"expected a range vector (matrix), got {_shown(data.get('resultType'))}")
            for labels, ts, vs in _matrix(data.get("result")):
                key = tuple(sorted(labels.items()))
                if key not in by_labels:
                    by_labels[key] = (labels, np.full(grid.n, np.nan))
                if not len(ts):
                    continue
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
                raw = self._read(req)
            except urllib.error.HTTPError as e:
                if e.code in (400, 422):
                    raise PrometheusQueryError(_server_error(e)) from None
                last = f"HTTP {e.code} {_one_line(str(e.reason))}"
                if e.code == 429 or e.code >= 500:
                    continue
                raise PrometheusUnreachable(f"{last} from {self.url}{path}") from None
            except PrometheusAnswerRefused:
                raise
            except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
                reason = getattr(e, "reason", e)
                last = _one_line(f"{type(reason).__name__}: {reason}" if str(reason) else type(reason).__name__)
                continue
            try:
                doc = loads_bounded(raw, max_bytes=self.max_bytes)
            except ValueError as e:
                if isinstance(e, UnicodeDecodeError) or type(e).__name__ == "JSONDecodeError":
                    raise PrometheusUnreachable(f"{self.url}{path} did not answer JSON (is it a Prometheus server?)") from None
                raise PrometheusAnswerRefused(f"the answer from {self.url}{path}: {e}") from None
            if not isinstance(doc, dict) or doc.get("status") != "success":
                err = doc.get("error", doc) if isinstance(doc, dict) else doc
                raise PrometheusQueryError(_shown(err))
            data = doc.get("data")
            if not isinstance(data, dict):
                raise PrometheusQueryError("the answer has no data")
            return data
        raise PrometheusUnreachable(f"no answer from {self.url} after {self.retries + 1} attempts ({last})")

    def _read(self, req: urllib.request.Request) -> bytes:
        """The answer's body, read within ``timeout`` in all and at most ``max_bytes`` long.

        Raises:
            TimeoutError: the deadline passed (retried like any timeout).
            PrometheusAnswerRefused: the body is longer than ``max_bytes`` (declared or read).
            urllib.error.HTTPError, urllib.error.URLError: as ``urlopen``.
        """
        deadline = time.monotonic() + self.timeout
        with self._opener.open(req, timeout=self.timeout) as resp:
            declared = resp.headers.get("Content-Length")
            if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
                raise PrometheusAnswerRefused(_too_large(int(declared), self.max_bytes))
            chunks: list[bytes] = []
            size = 0
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"the answer took longer than {self.timeout:g} s in all")
                _socket_timeout(resp, remaining)
                chunk = resp.read1(1 << 16)
                if not chunk:
                    return b"".join(chunks)
                size += len(chunk)
                if size > self.max_bytes:
                    raise PrometheusAnswerRefused(_too_large(size, self.max_bytes, more=True))
                chunks.append(chunk)


class _GuardedRedirects(urllib.request.HTTPRedirectHandler):
    """Follows a redirect only to http(s), never down from https, and (with credentials) only to
    the same scheme, host and port: urllib's default follows ``ftp://`` too and re-sends the
    ``Authorization`` header to whichever host the redirect names."""

    def __init__(self, base: str, same_origin: bool) -> None:
        super().__init__()
        self.origin = urllib.parse.urlparse(base)
        self.same_origin = same_origin

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
        new = urllib.parse.urlparse(urllib.parse.urljoin(req.full_url, newurl))
        old = urllib.parse.urlparse(req.full_url)
        if new.scheme not in ("http", "https"):
            why = f"to a {new.scheme or 'relative'}:// URL (only http and https are followed)"
        elif old.scheme == "https" and new.scheme == "http":
            why = "from https down to plain http"
        elif self.same_origin and (new.scheme, new.netloc) != (self.origin.scheme, self.origin.netloc):
            why = f"to another server ({new.netloc}) while the request carries credentials"
        else:
            return super().redirect_request(req, fp, code, msg, headers, newurl)
        raise PrometheusAnswerRefused(f"HTTP {code} redirect {why} refused: {_shown(newurl)}")


def _socket_timeout(resp: Any, seconds: float) -> None:
    """Bound the next socket read by what is left of the request's deadline (http.client keeps
    the socket as ``resp.fp.raw._sock``; where it does not, the deadline is still checked between
    reads, so a request overruns by at most one read's ``timeout``)."""
    sock = getattr(getattr(getattr(resp, "fp", None), "raw", None), "_sock", None)
    if sock is not None:
        sock.settimeout(max(seconds, 1e-3))


def _too_large(size: int, limit: int, more: bool = False) -> str:
    return (f"the answer is {'more than ' if more else ''}{size:,} bytes, over the {limit:,} accepted (--max-answer-mb); "
            "ask fewer steps per request (--max-points) or raise the limit")  # fmt: skip


def _matrix(result: Any) -> list[tuple[dict[str, str], np.ndarray, np.ndarray]]:
    """A range vector's series as ``(labels, (n,) times, (n,) values)``, every part type-checked.

    Raises:
        PrometheusAnswerRefused: naming the part (``result[3].values[7]``) that is not what the
            API documents: a list of ``{"metric": {name: value}, "values": [[time, "value"], ...]}``.
    """
    if not isinstance(result, list):
        raise PrometheusAnswerRefused(f"the answer's result is {type(result).__name__}, not a list of series")
    out = []
    for i, item in enumerate(result):
        where = f"the answer's result[{i}]"
        if not isinstance(item, dict):
            raise PrometheusAnswerRefused(f"{where} is {type(item).__name__}, not a series object")
        metric, values = item.get("metric", {}), item.get("values", [])
        if not isinstance(metric, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in metric.items()):
            raise PrometheusAnswerRefused(f"{where}.metric is not an object of string labels: {_shown(metric)}")
        if not isinstance(values, list):
            raise PrometheusAnswerRefused(f"{where}.values is {type(values).__name__}, not a list")
        try:  # the common case in C; the loop below only finds what to name
            ts = np.fromiter((p[0] for p in values), dtype=np.float64, count=len(values))
            vs = np.array([p[1] for p in values], dtype=np.float64)
            ok = vs.shape == ts.shape and bool(np.isfinite(ts).all())
        except (TypeError, ValueError, IndexError, KeyError):
            ok = False
        if not ok:
            for j, pair in enumerate(values):
                good = isinstance(pair, list) and len(pair) == 2 and isinstance(pair[0], (int, float)) and isinstance(pair[1], str)
                try:
                    good = good and math.isfinite(float(pair[0])) and isinstance(float(pair[1]), float)
                except ValueError:  # float("abc"); "NaN" and "+Inf" values parse
                    good = False
                if not good:
                    raise PrometheusAnswerRefused(f"{where}.values[{j}] is not a [time, \"value\"] pair: {_shown(pair)}")
            raise PrometheusAnswerRefused(f"{where}.values is not a list of [time, \"value\"] pairs")
        out.append((dict(metric), ts, vs))
    return out


def _server_error(e: urllib.error.HTTPError) -> str:
    """The server's ``errorType: error``, read from at most 64 KiB of its body, as one short line."""
    try:
        doc = loads_bounded(e.read(_ERROR_BODY_BYTES + 1), max_bytes=_ERROR_BODY_BYTES)
        if not isinstance(doc, dict):
            raise ValueError("not an object")
        return _shown(f"{doc.get('errorType', 'error')}: {doc.get('error', '')}".strip())
    except Exception:  # not JSON, too long, unreadable: the status line says enough
        return _shown(f"HTTP {e.code} {e.reason}")


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _shown(value: Any) -> str:
    """``value`` as one line of at most 300 characters (a server's words are data, not layout)."""
    text = _one_line(value if isinstance(value, str) else repr(value))
    return text if len(text) <= _ERROR_SHOWN else text[: _ERROR_SHOWN - 1] + "…"


def _num(x: float) -> str:
    """A time or step as the API reads it: seconds, exact for whole numbers."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))
