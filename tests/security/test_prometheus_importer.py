"""The Prometheus importer against a hostile server (issue 45, item 9), and behind real auth.

A server (or a proxy in front of it) chooses what edgetwin reads: a body of any size, a redirect to
anywhere, an answer dripped one byte at a time, values of any type, an error body of megabytes, JSON
nested a hundred thousand deep. Each case here is a small stdlib HTTP server playing that part, and
``edgetwin logs import prometheus`` must end with exit 2 and one line naming what it refused — no
traceback, no unbounded memory or time. The auth cases run a real Prometheus (Debian's package)
behind its own ``--web.config.file``: TLS with a test CA and basic auth, as operators deploy it.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from conftest import cli_in_process

REPO = Path(__file__).resolve().parents[2]
DAY0 = 1767225600  # 2026-01-01T00:00:00Z
ENV = {"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"}


@pytest.fixture(scope="module")
def mapping(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A one-column import mapping (any query: the hostile server answers what it likes)."""
    d = tmp_path_factory.mktemp("map")
    path = d / "m.toml"
    path.write_text('step = "15m"\n[keys]\nagent = "agent"\n[columns."action.offload"]\nquery = "q"\n')
    return path


class Hostile:
    """A loopback HTTP server whose every POST is answered by ``respond(handler)``; counts bytes sent."""

    def __init__(self, respond: Callable[[BaseHTTPRequestHandler], None]) -> None:
        self.sent = 0
        self.headers: list[dict[str, str]] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def do_POST(self) -> None:  # noqa: N802 (the stdlib's name)
                owner.headers.append(dict(self.headers.items()))
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    respond(self)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def send(self, h: BaseHTTPRequestHandler, data: bytes) -> None:
        h.wfile.write(data)
        h.wfile.flush()
        self.sent += len(data)

    def __enter__(self) -> Hostile:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(autouse=True)
def _no_proxy_nor_debug(monkeypatch: pytest.MonkeyPatch) -> None:
    """`run_import` runs in this process: no proxy of the caller's environment between the importer
    and the loopback server, no ``EDGETWIN_DEBUG`` traceback (the command's own process had ``ENV``)."""
    for var in ("http_proxy", "https_proxy", "all_proxy", "no_proxy", "EDGETWIN_DEBUG"):
        monkeypatch.delenv(var, raising=False)
        monkeypatch.delenv(var.upper(), raising=False)


def run_import(mapping: Path, out: Path, url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """``edgetwin logs import prometheus`` through the console script's entry (`edgetwin.cli.main`)
    in this process: its exit code and what it printed, as a finished process's.

    In process: what these cases check is the importer's refusal (exit 2, one line), and a fresh
    interpreter per case cost ~1 s of CPU each (21 runs); the real-Prometheus test below still runs
    the command as its own process (``python -m edgetwin.cli``), refusals included."""
    argv = ["logs", "import", "prometheus", "--mapping", str(mapping), "--out", str(out), "--start", str(DAY0),
            "--end", str(DAY0 + 3600), "--url", url, "--retries", "0", *extra]  # fmt: skip
    return cli_in_process(argv)


def refused_in_one_line(done: subprocess.CompletedProcess[str]) -> str:
    """Exit 2, no traceback, and the error as one (short) line; returns that line."""
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr, done.stderr[-2000:]
    lines = [ln for ln in done.stderr.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1, done.stderr[-2000:]
    assert len(lines[0]) < 600, len(lines[0])
    return lines[0]


def header(h: BaseHTTPRequestHandler, code: int = 200, **fields: str) -> None:
    h.send_response(code)
    for k, v in {"Content-Type": "application/json", **fields}.items():
        h.send_header(k, v)
    h.end_headers()


def answer(result: object) -> bytes:
    return json.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}}).encode()


# ------------------------------------------------------------------------------------ size
def test_a_huge_declared_body_is_refused_before_it_is_read(mapping: Path, tmp_path: Path) -> None:
    def respond(h: BaseHTTPRequestHandler) -> None:
        header(h, **{"Content-Length": str(1_500_000_000)})
        srv.send(h, b'{"status": "success", ' + b" " * 65536)

    with Hostile(respond) as srv:
        line = refused_in_one_line(run_import(mapping, tmp_path / "o.parquet", srv.url))
    assert "1,500,000,000 bytes, over the" in line and "--max-answer-mb" in line


def test_an_endless_body_is_cut_at_the_limit(mapping: Path, tmp_path: Path) -> None:
    """No Content-Length, 200 MB streamed: the client stops reading at --max-answer-mb (1 MB)."""
    block = b" " * (1 << 20)

    def respond(h: BaseHTTPRequestHandler) -> None:
        header(h)
        srv.send(h, b'{"status": "success", "data": {"resultType": "matrix", "result": [], "pad": "')
        for _ in range(200):
            srv.send(h, block)

    with Hostile(respond) as srv:
        line = refused_in_one_line(run_import(mapping, tmp_path / "o.parquet", srv.url, "--max-answer-mb", "1"))
        sent = srv.sent
    assert "over the 1,048,576 accepted (--max-answer-mb)" in line, line
    assert sent < 64 * len(block), f"the client kept reading: {sent:,} bytes sent"


# ------------------------------------------------------------------------------------ time
def test_a_dripped_answer_ends_at_the_timeout_of_the_whole_request(mapping: Path, tmp_path: Path) -> None:
    """One byte every 0.2 s never trips a per-read timeout of 1 s; the request's deadline does."""
    stop = threading.Event()

    def respond(h: BaseHTTPRequestHandler) -> None:
        header(h, **{"Content-Length": "1000"})
        for _ in range(1000):
            if stop.is_set():
                return
            srv.send(h, b" ")
            time.sleep(0.2)

    with Hostile(respond) as srv:
        done = run_import(mapping, tmp_path / "o.parquet", srv.url, "--timeout", "1")
        sent = srv.sent
        stop.set()
    line = refused_in_one_line(done)
    assert "cannot reach Prometheus" in line and ("longer than 1 s in all" in line or "timed out" in line), line
    assert sent < 100, f"the client kept reading a dripped answer: {sent} bytes"


# ------------------------------------------------------------------------------------ where
@pytest.mark.parametrize("location", ["ftp://127.0.0.1/answer.json", "file:///etc/passwd"])
def test_a_redirect_leaves_http_only_refused(mapping: Path, tmp_path: Path, location: str) -> None:
    with Hostile(lambda h: header(h, 302, Location=location)) as srv:
        line = refused_in_one_line(run_import(mapping, tmp_path / "o.parquet", srv.url))
    # ftp: our redirect guard; file: urllib's own (it follows http, https and ftp only)
    assert ("redirect to a" in line and "refused" in line) or "is not allowed" in line, line
    assert location.split(":")[0] in line


def test_credentials_do_not_follow_a_redirect_to_another_server(mapping: Path, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    cfg = tmp_path / "http.toml"
    cfg.write_text('[authorization]\ncredentials_file = "token"\n')
    with Hostile(lambda h: header(h, 200)) as other:
        with Hostile(lambda h: header(h, 307, Location=other.url.replace("127.0.0.1", "localhost") + "/api/v1/query_range")) as srv:
            line = refused_in_one_line(run_import(mapping, tmp_path / "o.parquet", srv.url, "--http-config", str(cfg)))
        assert srv.headers[0].get("Authorization") == "Bearer s3cret"
        assert other.headers == []
    assert "to another server" in line


# ------------------------------------------------------------------------------------ what
@pytest.mark.parametrize(
    ("body", "named"),
    [
        (answer({"a": 1}), "result is dict, not a list of series"),
        (answer([{"metric": {"agent": "a"}, "values": [[DAY0, "abc"]]}]), 'result[0].values[0] is not a [time, "value"] pair'),
        (answer([{"metric": {"agent": "a"}, "values": [[DAY0]]}]), 'result[0].values[0] is not a [time, "value"] pair'),
        (answer([{"metric": {"agent": 7}, "values": []}]), "result[0].metric is not an object of string labels"),
        (answer(["x"]), "result[0] is str, not a series object"),
        (b"[" * 100_000 + b"]" * 100_000, "nested 100,000 levels deep"),
    ],
    ids=["dict-result", "abc-value", "missing-value", "int-label", "str-series", "deep"],
)
def test_an_answer_of_the_wrong_shape_is_named(mapping: Path, tmp_path: Path, body: bytes, named: str) -> None:
    def respond(h: BaseHTTPRequestHandler) -> None:
        header(h, **{"Content-Length": str(len(body))})
        srv.send(h, body)

    with Hostile(respond) as srv:
        line = refused_in_one_line(run_import(mapping, tmp_path / "o.parquet", srv.url))
    assert named in line, line
    assert "refused the server's answer" in line and "action.offload" in line


def test_a_megabyte_error_body_is_shown_as_one_short_line(mapping: Path, tmp_path: Path) -> None:
    body = b"<html>\n" + b"x" * 5_000_000

    def respond(h: BaseHTTPRequestHandler) -> None:
        header(h, 400, **{"Content-Length": str(len(body)), "Content-Type": "text/html"})
        srv.send(h, body)

    with Hostile(respond) as srv:
        line = refused_in_one_line(run_import(mapping, tmp_path / "o.parquet", srv.url))
    assert "the server rejected the query: HTTP 400" in line


def test_bearer_token_from_a_file_reaches_the_server(mapping: Path, tmp_path: Path) -> None:
    (tmp_path / "token").write_text("s3cret\n")
    cfg = tmp_path / "http.toml"
    cfg.write_text('bearer_token_file = "token"\n')

    def respond(h: BaseHTTPRequestHandler) -> None:
        ok = h.headers.get("Authorization") == "Bearer s3cret"
        body = answer([]) if ok else b'{"status": "error", "errorType": "unauthorized", "error": "no token"}'
        header(h, 200 if ok else 401, **{"Content-Length": str(len(body))})
        srv.send(h, body)

    with Hostile(respond) as srv:
        done = run_import(mapping, tmp_path / "o.parquet", srv.url, "--http-config", str(cfg))
        without = run_import(mapping, tmp_path / "p.parquet", srv.url)
    # the token got through: the (empty) answer is read, and the importer says what it lacks
    assert "the query returned no series" in refused_in_one_line(done)
    assert "HTTP 401" in refused_in_one_line(without)


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[basic_auth]\nusername = 'u'\npasword_file = 'p'\n", "unknown key 'basic_auth.pasword_file'"),
        ("[tls_config]\ninsecure_skip_verify = true\n", "insecure_skip_verify is refused"),
        ("[basic_auth]\nusername = 'u'\n", "give exactly one of password and password_file"),
        ("[authorization]\ncredentials_file = 'missing'\n", "missing: cannot read the secret"),
        ("[tls_config]\nca_file = 'nope.pem'\n", "tls_config.ca_file"),
        ("[basic_auth]\nusername = 'u'\npassword = 'p'\n[authorization]\ncredentials = 't'\n", "one kind of credentials"),
    ],
)
def test_bad_http_configs_are_named(mapping: Path, tmp_path: Path, text: str, named: str) -> None:
    cfg = tmp_path / "http.toml"
    cfg.write_text(text)
    line = refused_in_one_line(run_import(mapping, tmp_path / "o.parquet", "http://127.0.0.1:9", "--http-config", str(cfg)))
    assert named in line and ("http.toml" in line or "secret" in named), line


# ------------------------------------------------------------------------------------ a real Prometheus behind TLS and basic auth
def _test_ca(d: Path) -> tuple[Path, Path, Path]:
    """A CA and a server certificate for 127.0.0.1 signed by it (PEM files: ca, cert, key)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = dt.datetime.now(dt.UTC)
    ca_key, key = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "edgetwin test CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name).public_key(ca_key.public_key())
          .serial_number(1).not_valid_before(now - dt.timedelta(hours=1)).not_valid_after(now + dt.timedelta(days=1))
          .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True).sign(ca_key, hashes.SHA256()))  # fmt: skip
    cert = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")]))
            .issuer_name(ca_name).public_key(key.public_key()).serial_number(2)
            .not_valid_before(now - dt.timedelta(hours=1)).not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
            .sign(ca_key, hashes.SHA256()))  # fmt: skip
    paths = d / "ca.pem", d / "server.pem", d / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))  # fmt: skip
    return paths


@pytest.fixture
def secured_prometheus(tmp_path: Path) -> Iterator[tuple[str, Path, Path]]:
    """Debian's prometheus with TLS and basic auth (user ``edgetwin``), the emulator's log backfilled.

    Yields the https URL, the CA file and the import mapping.
    """
    bcrypt = pytest.importorskip("bcrypt", reason="bcrypt hashes the server's password (pip install bcrypt; in [test])")
    sys.path.insert(0, str(REPO / "tests"))
    from conftest import free_port
    from prometheus_server import backfill, binaries

    from edgetwin.emulator.cluster import ClusterConfig
    from edgetwin.emulator.logs import generate_logs, write_openmetrics_logs

    prom, _ = binaries()
    log, spec = generate_logs(ClusterConfig(n_agents=4, steps=8), episodes=1, policy="random", seed=3)
    dump, mapping = write_openmetrics_logs(log, spec, tmp_path / "cluster.om", start=DAY0)
    backfill(dump, tmp_path / "tsdb")
    ca, cert, key = _test_ca(tmp_path)
    hashed = bcrypt.hashpw(b"pa55word", bcrypt.gensalt(rounds=4)).decode()
    web = tmp_path / "web.yml"  # JSON is YAML
    web.write_text(json.dumps({"tls_server_config": {"cert_file": str(cert), "key_file": str(key)},
                               "basic_auth_users": {"edgetwin": hashed}}))  # fmt: skip
    (tmp_path / "prometheus.yml").write_text(json.dumps({"global": {"scrape_interval": "15s"}}))
    port = free_port()
    proc = subprocess.Popen(
        [prom, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
         f"--web.listen-address=127.0.0.1:{port}", f"--web.config.file={web}", "--storage.tsdb.retention.time=100y",
         "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("ab"),
    )  # fmt: skip
    try:
        import ssl
        import urllib.request

        ctx = ssl.create_default_context(cafile=str(ca))
        auth = "Basic " + base64.b64encode(b"edgetwin:pa55word").decode()
        deadline = time.monotonic() + 30
        while True:
            try:
                req = urllib.request.Request(f"https://127.0.0.1:{port}/-/ready", headers={"Authorization": auth})
                with urllib.request.urlopen(req, context=ctx, timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"prometheus did not start: {(tmp_path / 'prometheus.log').read_text()[-2000:]}")
            time.sleep(0.2)
        yield f"https://127.0.0.1:{port}", ca, mapping
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def test_import_from_a_real_prometheus_behind_tls_and_basic_auth(secured_prometheus, tmp_path: Path) -> None:
    url, ca, mapping = secured_prometheus
    (tmp_path / "password").write_text("pa55word\n")
    cfg = tmp_path / "http.toml"
    cfg.write_text(f'[basic_auth]\nusername = "edgetwin"\npassword_file = "password"\n[tls_config]\nca_file = "{ca}"\n')
    end = str(DAY0 + 8 * 15 * 60)
    base = ["--start", str(DAY0), "--end", end]

    def run(out: str, *extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "edgetwin.cli", "logs", "import", "prometheus", "--mapping", str(mapping),
             "--out", str(tmp_path / out), *base, "--url", url, "--retries", "0", "--json", *extra],
            capture_output=True, text=True, env=ENV, timeout=120,
        )  # fmt: skip

    ok = run("ok.parquet", "--http-config", str(cfg))
    assert ok.returncode == 0, ok.stderr[-2000:]
    assert json.loads(ok.stdout)["rows"] == 4 * 8
    # without the CA the server's certificate is not trusted; without the password it answers 401
    (tmp_path / "noca.toml").write_text('[basic_auth]\nusername = "edgetwin"\npassword_file = "password"\n')
    assert "CERTIFICATE_VERIFY_FAILED" in refused_in_one_line(run("a.parquet", "--http-config", str(tmp_path / "noca.toml")))
    (tmp_path / "wrong").write_text("guess\n")
    (tmp_path / "wrong.toml").write_text(f'[basic_auth]\nusername = "edgetwin"\npassword_file = "wrong"\n[tls_config]\nca_file = "{ca}"\n')
    assert "HTTP 401" in refused_in_one_line(run("b.parquet", "--http-config", str(tmp_path / "wrong.toml")))


def test_the_documented_http_config_reads(tmp_path: Path) -> None:
    """docs/log-format.md's example, as written there, with its files in place."""
    from edgetwin.contract.prometheus.auth import HTTPClientConfig

    text = (REPO / "docs" / "log-format.md").read_text()
    block = text.split("```toml\n# prometheus-http.toml\n", 1)[1].split("```", 1)[0]
    ca = tmp_path / "ca.pem"
    _test_ca(tmp_path)
    (tmp_path / "prometheus.password").write_text("pa55word\n")
    cfg = tmp_path / "prometheus-http.toml"
    cfg.write_text(block.replace("/etc/ssl/operator-ca.pem", str(ca)))
    got = HTTPClientConfig.load(cfg)
    assert got.headers["Authorization"] == "Basic " + base64.b64encode(b"edgetwin:pa55word").decode()
    assert got.ca_file == ca and got.ssl_context().verify_mode.name == "CERT_REQUIRED"
