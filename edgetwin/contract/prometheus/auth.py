"""How edgetwin reaches a Prometheus that sits behind authentication: the HTTP client config.

A production Prometheus is rarely open: it sits behind basic auth (its own ``--web.config.file``),
a reverse proxy that wants a bearer token, and TLS with the operator's own CA. Prometheus' tools
describe that in one place, the *HTTP client config* (``promtool --http.config.file``, the
``http_config`` of a scrape job); ``edgetwin logs import prometheus --http-config FILE`` reads the
same keys, written as TOML (edgetwin reads no YAML)::

    [basic_auth]
    username = "edgetwin"
    password_file = "/etc/edgetwin/prometheus.password"   # or password = "..." (kept in the file)

    [authorization]                 # or the older top-level bearer_token_file = "..."
    type = "Bearer"                 # the default
    credentials_file = "/etc/edgetwin/prometheus.token"

    [tls_config]
    ca_file = "/etc/ssl/operator-ca.pem"
    cert_file = "/etc/edgetwin/client.pem"   # client certificate (mutual TLS), with key_file
    key_file = "/etc/edgetwin/client.key"

Secrets are read from files (a password on a command line lands in the shell's history and in
``ps``). ``insecure_skip_verify = true`` is refused: a server whose certificate is not checked
could be anyone, and the log it answers would train the twin; give its CA as ``ca_file`` instead.
Unknown keys are refused by name, so a misspelt ``pasword_file`` is not silently an open request.
"""

from __future__ import annotations

import base64
import ssl
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgetwin.contract.errors import InputError

__all__ = ["HTTPClientConfig"]

_KEYS: dict[str, set[str]] = {
    "": {"basic_auth", "authorization", "bearer_token_file", "tls_config"},
    "basic_auth": {"username", "password", "password_file"},
    "authorization": {"type", "credentials", "credentials_file"},
    "tls_config": {"ca_file", "cert_file", "key_file", "insecure_skip_verify"},
}
#: The longest secret file read (bytes): a token or password is short; a 1 GB "token" is an error.
_MAX_SECRET = 64 * 1024


@dataclass(frozen=True)
class HTTPClientConfig:
    """Credentials and TLS trust for requests to one server.

    Attributes:
        headers: request headers carrying the credentials (``Authorization``); empty for none.
        ca_file, cert_file, key_file: PEM files (the server's CA; a client certificate and key).
            The server's certificate is checked against the URL's host name.
    """

    headers: dict[str, str] = field(default_factory=dict)
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None

    @property
    def has_credentials(self) -> bool:
        """True when requests carry a secret (a redirect must then stay on the same server)."""
        return bool(self.headers) or self.cert_file is not None

    def ssl_context(self) -> ssl.SSLContext:
        """A verifying TLS context: the system's CAs, or ``ca_file`` only; the client certificate."""
        ctx = ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
        if self.cert_file is not None:
            ctx.load_cert_chain(str(self.cert_file), str(self.key_file) if self.key_file else None)
        return ctx

    @classmethod
    def load(cls, path: str | Path) -> HTTPClientConfig:
        """Read the TOML file (relative paths inside it are relative to it).

        Raises:
            InputError: naming the file and key: unreadable, not TOML, an unknown key, a value of
                the wrong type, a missing or unreadable secret or PEM file, both a secret and its
                file, ``insecure_skip_verify``, or two kinds of credentials at once.
        """
        p = Path(path)
        where = str(p)
        try:
            doc = tomllib.loads(p.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as e:
            raise InputError(f"cannot read the HTTP client config ({getattr(e, 'strerror', None) or e})", where) from None
        except tomllib.TOMLDecodeError as e:
            raise InputError(f"not TOML ({e})", where) from None
        _check_keys(doc, "", where)
        base = p.parent
        headers: dict[str, str] = {}
        basic = doc.get("basic_auth")
        if basic is not None:
            user = _string(basic, "username", "basic_auth", where)
            password = _secret(basic, "password", "password_file", "basic_auth", base, where)
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            headers["Authorization"] = f"Basic {token}"
        bearer_file = doc.get("bearer_token_file")
        authz = doc.get("authorization")
        if bearer_file is not None:
            authz = {"type": "Bearer", "credentials_file": bearer_file} if authz is None else None
            if authz is None:
                raise InputError("give either [authorization] or bearer_token_file, not both", f"{where}: bearer_token_file")
        if authz is not None:
            if headers:
                raise InputError("give one kind of credentials: [basic_auth] or [authorization], not both", f"{where}: authorization")
            kind = authz.get("type", "Bearer")
            if not isinstance(kind, str) or not kind.isalnum():
                raise InputError(f"type must be an HTTP auth scheme such as 'Bearer', got {kind!r}", f"{where}: authorization.type")
            secret = _secret(authz, "credentials", "credentials_file", "authorization", base, where)
            headers["Authorization"] = f"{kind} {secret}"
        tls = doc.get("tls_config") or {}
        if tls.get("insecure_skip_verify"):
            raise InputError(
                "insecure_skip_verify is refused: a server whose certificate is not checked could be anyone; "
                "give its CA as ca_file",
                f"{where}: tls_config.insecure_skip_verify",
            )
        files = {k: _pem(tls, k, base, where) for k in ("ca_file", "cert_file", "key_file")}
        if files["key_file"] is not None and files["cert_file"] is None:
            raise InputError("key_file needs cert_file (the client certificate)", f"{where}: tls_config.key_file")
        return cls(headers, files["ca_file"], files["cert_file"], files["key_file"])


def _check_keys(doc: dict[str, Any], table: str, where: str) -> None:
    for key, value in doc.items():
        name = f"{table}.{key}" if table else key
        if key not in _KEYS[table]:
            raise InputError(f"unknown key {name!r} (known: {', '.join(sorted(_KEYS[table]))})", where)
        if not table and key in _KEYS:
            if not isinstance(value, dict):
                raise InputError(f"[{key}] must be a table", f"{where}: {key}")
            _check_keys(value, key, where)


def _string(table: dict[str, Any], key: str, name: str, where: str) -> str:
    value = table.get(key)
    if not isinstance(value, str) or not value or any(c in value for c in "\r\n"):
        raise InputError(f"must be a non-empty one-line string, got {value!r}", f"{where}: {name}.{key}")
    return value


def _secret(table: dict[str, Any], inline: str, file_key: str, name: str, base: Path, where: str) -> str:
    """The secret given inline or (better) in a file; exactly one of the two."""
    if (inline in table) == (file_key in table):
        raise InputError(f"give exactly one of {inline} and {file_key}", f"{where}: {name}")
    if inline in table:
        return _string(table, inline, name, where)
    path = base / _string(table, file_key, name, where)
    try:
        with path.open("rb") as f:
            raw = f.read(_MAX_SECRET + 1)
    except OSError as e:
        raise InputError(f"cannot read the secret ({e.strerror or e})", str(path)) from None
    if len(raw) > _MAX_SECRET:
        raise InputError(f"a secret file longer than {_MAX_SECRET:,} bytes", str(path))
    try:
        secret = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise InputError("the secret is not UTF-8 text", str(path)) from None
    if not secret or any(c in secret for c in "\r\n"):
        raise InputError("the secret file must hold one non-empty line", str(path))
    return secret


def _pem(table: dict[str, Any], key: str, base: Path, where: str) -> Path | None:
    if key not in table:
        return None
    path = base / _string(table, key, "tls_config", where)
    if not path.is_file():
        raise InputError("no such file", f"{where}: tls_config.{key} = {path}")
    return path
