"""Authenticated bus messages: every envelope signed by its sender's Ed25519 key, checked on receipt.

A bus client with a `MessageAuth` (``bus.auth``) signs each envelope it sends with the key of the
envelope's ``sender`` (it must hold that key: a client speaks only for the identities it owns; a
client shared by several agents owns several), and accepts an envelope only when its ``sender`` is
in the `Keyring` and the signature verifies under that sender's public key; anything else is
rejected before a handler sees it (``bus.stats.rejected["unauthenticated"]``). So on an
authenticated bus ``env.sender`` *is* who sent it, and a handler's role check ("tasks come from the
coordinator", "an update for site X comes from X") is a comparison of names.

What is signed: the header (kind, sender, round, time, id, payload, tensor table) and every tensor
byte (`edgetwin.edge.messages.signing_payload`), so neither the claimed sender nor a number can be
changed in transit. A replayed message is the same message (same id: JetStream and the receivers'
round bookkeeping already treat it as a duplicate).

Keys: one PEM pair per identity, in a keys directory an operator can copy around (`write_keys`,
`FederationKeys.load`): ``<identity>.key.pem`` (private, mode 0600, only on the machine that runs
that identity) and ``<identity>.pub.pem`` (public, on every machine). An identity containing ``/``
(``esa/site-3``) is stored with ``--`` in its place. The in-process default
(`FederationKeys.generate`) makes fresh keys for every party of one process.

Why Ed25519 signatures in the message rather than NATS accounts with per-subject permissions:
the same check then works on the in-process bus, on NATS, through a JetStream replay and across
a relay, and the receiver learns *who* spoke, not only that someone allowed on a subject did
(with subject permissions, every site that may publish updates may publish one naming another
site). Per-site NATS credentials remain useful as a second wall (docs/bus.md).
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from edgetwin.contract.errors import InputError
from edgetwin.edge.messages import Envelope, MessageRejected
from edgetwin.edge.signing import Signer, load_public_key, save_private_key, save_public_key

__all__ = ["INSECURE_FLAG", "KEYS_ENV", "FederationKeys", "Keyring", "MessageAuth", "auth_from_env", "identity_file",
           "leaves_process", "refuse_without_keys", "require_auth", "write_keys"]

log = logging.getLogger("edgetwin.edge.message_auth")

_IDENTITY = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-/]{0,127}")


def identity_file(identity: str) -> str:
    """The file stem of ``identity`` in a keys directory (``/`` becomes ``--``)."""
    if not _IDENTITY.fullmatch(identity) or "--" in identity:
        raise InputError(f"identity {identity!r} is not a name (letters, digits, _ . - /; no '--')", where="identity")
    return identity.replace("/", "--")


@dataclass
class Keyring:
    """Public keys by identity (the envelope ``sender`` they speak for)."""

    keys: dict[str, Ed25519PublicKey] = field(default_factory=dict)

    def get(self, identity: str) -> Ed25519PublicKey | None:
        return self.keys.get(identity)

    def __contains__(self, identity: object) -> bool:
        return identity in self.keys

    @classmethod
    def from_dir(cls, directory: str | Path) -> Keyring:
        """Every ``*.pub.pem`` of ``directory``; raises `InputError` naming it if there is none."""
        d = Path(directory)
        if not d.is_dir():
            raise InputError("no such keys directory", where=str(d))
        keys = {f.name.removesuffix(".pub.pem").replace("--", "/"): load_public_key(f) for f in sorted(d.glob("*.pub.pem"))}
        if not keys:
            raise InputError("no public keys (*.pub.pem) in the keys directory", where=str(d))
        return cls(keys)


@dataclass
class MessageAuth:
    """One bus client's signing keys (the identities it speaks for) and the keyring it trusts.

    Set as ``bus.auth``: `edgetwin.edge.bus.base.Bus` signs on every send and verifies on every
    receipt (`sign_for`, `verify`).
    """

    keyring: Keyring
    own: dict[str, Signer] = field(default_factory=dict)

    def sign_for(self, sender: str) -> Signer:
        """The key ``sender``'s envelopes are signed with; `InputError` when this client lacks it."""
        s = self.own.get(sender)
        if s is None:
            raise InputError(f"this bus client holds no key for sender {sender!r} (it holds {sorted(self.own)})",
                             where="message_auth")
        return s

    def verify(self, env: Envelope) -> None:
        """Raise `MessageRejected` (``unauthenticated``) unless ``env`` is signed by its sender's key."""
        pub = self.keyring.get(env.sender)
        if pub is None:
            raise MessageRejected("unauthenticated", f"sender {env.sender!r} has no key in the keyring")
        if env.signature is None or env.signed_payload is None:
            raise MessageRejected("unauthenticated", f"unsigned {env.kind} from {env.sender!r}")
        try:
            pub.verify(env.signature, env.signed_payload)
        except InvalidSignature:
            raise MessageRejected("unauthenticated", f"{env.kind} claiming sender {env.sender!r} is not signed by its key") from None


@dataclass
class FederationKeys:
    """Every party's public key and the private keys this process holds."""

    keyring: Keyring
    private: dict[str, Signer] = field(default_factory=dict)

    @classmethod
    def generate(cls, identities: Iterable[str]) -> FederationKeys:
        """Fresh keys for every identity (the in-process default: all parties in one process)."""
        private = {i: Signer.generate() for i in identities}
        return cls(Keyring({i: s.public_key for i, s in private.items()}), private)

    @classmethod
    def load(cls, directory: str | Path, own: Iterable[str] = ()) -> FederationKeys:
        """The keyring of ``directory`` and the private keys of the identities ``own``."""
        d = Path(directory)
        ring = Keyring.from_dir(d)
        private = {}
        for i in own:
            f = d / f"{identity_file(i)}.key.pem"
            if not f.exists():
                raise InputError(f"no private key for {i!r} in the keys directory", where=str(f))
            private[i] = Signer.from_pem(f)
        return cls(ring, private)

    def auth(self, *identities: str) -> MessageAuth:
        """A `MessageAuth` for a bus client that speaks for ``identities``."""
        missing = [i for i in identities if i not in self.private]
        if missing:
            raise InputError(f"no private key for {missing}", where="federation keys")
        return MessageAuth(self.keyring, {i: self.private[i] for i in identities})

    def add(self, identity: str) -> Signer:
        """A fresh key for one more identity (e.g. an agent built after the others)."""
        s = self.private[identity] = Signer.generate()
        self.keyring.keys[identity] = s.public_key
        return s


def write_keys(directory: str | Path, identities: Iterable[str], overwrite: bool = False) -> Path:
    """Generate a key pair per identity into ``directory`` (what an operator distributes: every
    ``*.pub.pem`` to every machine, each ``*.key.pem`` only to the machine of its identity)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    for i in identities:
        stem = identity_file(i)
        s = Signer.generate()
        save_private_key(s.private_key, d / f"{stem}.key.pem", overwrite=overwrite)
        save_public_key(s.public_key, d / f"{stem}.pub.pem", overwrite=overwrite)
    return d


#: the environment variable naming a keys directory, for agents started as their own processes
#: (``edgetwin agent``): set on every machine, it holds every ``*.pub.pem`` and that machine's
#: ``*.key.pem``
KEYS_ENV = "EDGETWIN_FEDERATION_KEYS"


def auth_from_env(*identities: str) -> MessageAuth | None:
    """`MessageAuth` for ``identities`` from the keys directory in `KEYS_ENV`; None when unset
    (`require_auth` then decides: refuse, or run unauthenticated when the user said so)."""
    d = os.environ.get(KEYS_ENV, "")
    if not d:
        return None
    return FederationKeys.load(d, identities).auth(*identities)


#: the one way to run a party of a federation without keys on a bus that leaves its process
#: (``edgetwin agent --insecure``; ``insecure=True`` from Python). A flag and not an environment
#: variable on purpose: it is visible in the command line of the very process it weakens, and a
#: variable exported once in a shell profile would silently switch authentication off everywhere.
INSECURE_FLAG = "--insecure"


def leaves_process(bus: object) -> bool:
    """Whether a bus spec reaches beyond this process: True for ``nats://``/``tls://`` URLs and for
    bus factories (what they connect to cannot be told), False for the in-process ``memory`` bus
    (its broker lives in this process: every party on it is code this process runs)."""
    return not (isinstance(bus, str) and (bus == "memory" or bus.startswith("memory://")))


def refuse_without_keys(who: str, bus: object, insecure: bool = False) -> None:
    """Raise `InputError` (exit 2, one line naming ``--keys``, `KEYS_ENV` and `INSECURE_FLAG`) when
    no keys directory is set, ``bus`` leaves the process and the user did not pass ``insecure``.
    Cheap and silent otherwise: the CLI calls it before any slow work (reading a log)."""
    if os.environ.get(KEYS_ENV, "") or insecure or not leaves_process(bus):
        return
    # the bus spec is not echoed: a nats:// URL may carry a password
    raise InputError(f"{who} needs a keys directory to talk over a bus outside this process: pass --keys DIR "
                     f"or set {KEYS_ENV} (make one with `edgetwin agent-keys`), or {INSECURE_FLAG} to run "
                     "unauthenticated", where="--keys")


def require_auth(*identities: str, bus: object, insecure: bool = False) -> MessageAuth | None:
    """The keys of a party run as its own process, or a refusal.

    From the keys directory in `KEYS_ENV` (``edgetwin agent --keys DIR`` sets it). Without one, on
    a bus that leaves the process (`leaves_process`) anyone who can reach the bus could speak for
    any party, so this refuses (`refuse_without_keys`) unless ``insecure`` (`INSECURE_FLAG`), which
    runs unauthenticated and says so in one warning line. On the in-process ``memory`` bus no key
    is needed: nothing outside the process can reach it. Returns None when running unauthenticated.
    """
    auth = auth_from_env(*identities)
    if auth is not None:
        return auth
    who = ", ".join(identities)
    refuse_without_keys(who, bus, insecure)
    if insecure:
        log.warning("%s runs unauthenticated (%s): anyone who reaches the bus can speak for any party (docs/bus.md)",
                    who, INSECURE_FLAG)
    return None
