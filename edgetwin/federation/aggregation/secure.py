"""Secure aggregation: the server learns only the sum of the clients' updates.

The protocol of Bonawitz et al. 2017 ("Practical Secure Aggregation", seed 003 ref. [2]), with
double masking, semi-honest server:

0. *Advertise keys*: each client makes two X25519 key pairs, ``c`` (to encrypt shares to each
   other through the server) and ``s`` (to agree pairwise mask seeds), and sends the public keys.
1. *Share keys*: each client Shamir-splits (t-of-n over GF(2^521 - 1)) its ``s`` private key and a
   fresh self-mask seed ``b``, and sends every other client its two shares, AES-GCM encrypted under
   their ``c`` agreement key: the server routes ciphertexts it cannot read.
2. *Masked input*: client u sends ``y_u = x_u + PRG(b_u) + sum_{v>u} PRG(s_uv) - sum_{v<u} PRG(s_uv)``
   (mod 2^64, ``x_u`` in fixed point). The pairwise masks cancel in the sum; each ``y_u`` alone is
   uniformly random.
3. *Unmask*: the server says who dropped after step 1. Each survivor returns its share of ``b_v``
   for every survivor v and of ``s_sk_u`` for every dropped u. From ``t`` shares the server removes
   the self masks and, for dropped clients, recomputes their pairwise masks with the survivors and
   removes those: the sum of the survivors' inputs is exact (to the fixed-point step) even though a
   client vanished mid-round. A client's ``b`` and ``s`` shares are never both revealed.

The client and server halves only exchange bytes and integers, so they run unchanged across the
bus; `secure_sum` runs all of it in one process. ``seed`` makes the keys deterministic (tests and
benchmarks only; None draws them from the OS, as deployments must).
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from edgetwin.contract.errors import InputError
from edgetwin.federation.aggregation.base import (
    AggregateResult,
    Aggregator,
    ClientUpdate,
    LinearAggregator,
    check_updates,
)

__all__ = [
    "FIELD_PRIME",
    "AdvertisedKeys",
    "SecAggClient",
    "SecAggServer",
    "SecureAggregator",
    "SecureSumTranscript",
    "secure_sum",
    "shamir_combine",
    "shamir_split",
]

FIELD_PRIME = 2**521 - 1  # a Mersenne prime above every 256-bit secret
_RAW = serialization.Encoding.Raw, serialization.PublicFormat.Raw


# ------------------------------------------------------------------------------ Shamir
def shamir_split(secret: int, n: int, t: int, rand: Any) -> list[tuple[int, int]]:
    """``n`` shares ``(x, y)``, x = 1..n, of ``secret``; any ``t`` reconstruct it, fewer reveal nothing."""
    if not 1 <= t <= n:
        raise InputError(f"threshold must be in [1, n={n}], got {t}", where="threshold")
    if not 0 <= secret < FIELD_PRIME:
        raise InputError("secret outside the field", where="secret")
    coeffs = [secret] + [rand.randbelow(FIELD_PRIME) for _ in range(t - 1)]
    shares = []
    for x in range(1, n + 1):
        y = 0
        for c in reversed(coeffs):  # Horner
            y = (y * x + c) % FIELD_PRIME
        shares.append((x, y))
    return shares


def shamir_combine(shares: Sequence[tuple[int, int]]) -> int:
    """The secret from ``t`` or more distinct shares (Lagrange interpolation at 0)."""
    xs = [x for x, _ in shares]
    if len(set(xs)) != len(xs):
        raise InputError("duplicate share indices", where="shares")
    secret = 0
    for i, (xi, yi) in enumerate(shares):
        num, den = 1, 1
        for j, xj in enumerate(xs):
            if j != i:
                num = num * (-xj) % FIELD_PRIME
                den = den * (xi - xj) % FIELD_PRIME
        secret = (secret + yi * num * pow(den, -1, FIELD_PRIME)) % FIELD_PRIME
    return secret


# ------------------------------------------------------------------------------ helpers
class _Rand:
    """Randomness for keys: the OS (``seed=None``) or a seeded generator (tests only)."""

    def __init__(self, seed: int | None) -> None:
        self._rng = None if seed is None else np.random.default_rng(seed)

    def bytes(self, n: int) -> bytes:
        return secrets.token_bytes(n) if self._rng is None else self._rng.bytes(n)

    def randbelow(self, m: int) -> int:
        nbytes = (m.bit_length() + 7) // 8 + 8  # extra bytes make the modulo bias negligible
        return int.from_bytes(self.bytes(nbytes), "big") % m


def _kdf(shared: bytes, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(shared)


def _prg(seed: bytes, dim: int) -> np.ndarray:
    """(dim,) uint64 pseudo-random mask expanded from a 32-byte seed (PCG64)."""
    return np.random.PCG64(int.from_bytes(seed, "big")).random_raw(dim).astype(np.uint64)


def _pub(key: X25519PrivateKey) -> bytes:
    return key.public_key().public_bytes(*_RAW)


def _priv_int(key: X25519PrivateKey) -> int:
    return int.from_bytes(
        key.private_bytes(serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()), "big"
    )


def _priv_from_int(v: int) -> X25519PrivateKey:
    return X25519PrivateKey.from_private_bytes(v.to_bytes(32, "big"))


def encode_fixed(x: np.ndarray, scale_bits: int) -> np.ndarray:
    """Fixed-point (D,) uint64 of a float vector: ``round(x * 2^scale_bits)`` mod 2^64."""
    return np.round(np.asarray(x, np.float64) * 2.0**scale_bits).astype(np.int64).view(np.uint64)


def decode_fixed(v: np.ndarray, scale_bits: int) -> np.ndarray:
    """Inverse of `encode_fixed` (values read as signed 64-bit)."""
    return v.view(np.int64).astype(np.float64) / 2.0**scale_bits


@dataclass(frozen=True)
class AdvertisedKeys:
    """Step 0 message: a client's two X25519 public keys (32 bytes each)."""

    client_id: str
    c_pk: bytes
    s_pk: bytes


# ------------------------------------------------------------------------------ client
class SecAggClient:
    """One client's half of the protocol.

    Args:
        client_id: its id; the roster is ordered by id.
        dim: length of the vectors summed.
        threshold: t, shares needed to reconstruct (at least 2; more than half the roster
            prevents a server from splitting clients into two sets it could unmask separately).
        session: round identifier mixed into every key derivation (masks never repeat).
        scale_bits: fixed-point precision (2^-scale_bits).
        seed: deterministic keys (tests only); None: from the OS.
    """

    def __init__(self, client_id: str, dim: int, threshold: int, session: str = "0", scale_bits: int = 24,
                 seed: int | None = None) -> None:
        self.client_id, self.dim, self.threshold, self.session, self.scale_bits = client_id, dim, threshold, session, scale_bits
        self._rand = _Rand(seed)
        self._c = X25519PrivateKey.from_private_bytes(self._rand.bytes(32))
        self._s = X25519PrivateKey.from_private_bytes(self._rand.bytes(32))
        self._b = self._rand.bytes(32)
        self.roster: dict[str, AdvertisedKeys] = {}
        self.held_shares: dict[str, dict[str, tuple[int, int]]] = {}  # owner -> {"b": share, "s": share}

    def advertise_keys(self) -> AdvertisedKeys:
        """Step 0."""
        return AdvertisedKeys(self.client_id, _pub(self._c), _pub(self._s))

    def _channel(self, other: AdvertisedKeys) -> AESGCM:
        shared = self._c.exchange(X25519PublicKey.from_public_bytes(other.c_pk))
        return AESGCM(_kdf(shared, b"edgetwin-secagg-channel|" + self.session.encode()))

    def share_keys(self, roster: Mapping[str, AdvertisedKeys]) -> dict[str, bytes]:
        """Step 1: encrypted shares of ``s_sk`` and ``b`` for every other client in the roster."""
        if self.client_id not in roster:
            raise InputError(f"{self.client_id!r} is not in the roster", where="roster")
        if len(roster) < self.threshold:
            raise InputError(f"roster of {len(roster)} is below the threshold {self.threshold}", where="roster")
        self.roster = dict(sorted(roster.items()))
        ids = list(self.roster)
        n = len(ids)
        s_shares = shamir_split(_priv_int(self._s), n, self.threshold, self._rand)
        b_shares = shamir_split(int.from_bytes(self._b, "big"), n, self.threshold, self._rand)
        out = {}
        for i, v in enumerate(ids):
            body = json.dumps({"from": self.client_id, "to": v, "s": list(s_shares[i]), "b": list(b_shares[i])}).encode()
            if v == self.client_id:
                self.held_shares[v] = {"s": s_shares[i], "b": b_shares[i]}
                continue
            nonce = self._rand.bytes(12)
            aad = f"{self.client_id}->{v}".encode()
            out[v] = nonce + self._channel(self.roster[v]).encrypt(nonce, body, aad)
        return out

    def receive_shares(self, inbox: Mapping[str, bytes]) -> None:
        """Decrypt the shares other clients sent this client (routed by the server)."""
        for sender, ct in inbox.items():
            if sender not in self.roster:
                raise InputError(f"share from {sender!r}, who is not in the roster", where="inbox")
            aad = f"{sender}->{self.client_id}".encode()
            body = json.loads(self._channel(self.roster[sender]).decrypt(ct[:12], ct[12:], aad))
            if body["from"] != sender or body["to"] != self.client_id:
                raise InputError(f"share from {sender!r} is addressed to someone else", where="inbox")
            self.held_shares[sender] = {"s": tuple(body["s"]), "b": tuple(body["b"])}

    def pairwise_mask(self, other: str) -> np.ndarray:
        """PRG(s_uv) for the pair (this client, other)."""
        shared = self._s.exchange(X25519PublicKey.from_public_bytes(self.roster[other].s_pk))
        seed = _kdf(shared, b"edgetwin-secagg-mask|" + self.session.encode())
        return _prg(seed, self.dim)

    def masked_input(self, x: np.ndarray, inbox: Mapping[str, bytes]) -> np.ndarray:
        """Step 2: (dim,) uint64 ``y_u``; ``x`` (dim,) float is this client's (weighted) update."""
        x = np.asarray(x, dtype=np.float64)
        if x.shape != (self.dim,) or not np.all(np.isfinite(x)):
            raise InputError(f"input must be a finite ({self.dim},) vector, got shape {x.shape}", where=self.client_id)
        limit = 2.0 ** (62 - self.scale_bits) / max(1, len(self.roster))
        if np.abs(x).max(initial=0.0) >= limit:
            raise InputError(f"input magnitude above {limit:.3g} would overflow the fixed-point sum", where=self.client_id)
        self.receive_shares(inbox)
        y = encode_fixed(x, self.scale_bits) + _prg(self._b, self.dim)
        for v in self.roster:
            if v == self.client_id:
                continue
            m = self.pairwise_mask(v)
            y = y + m if self.client_id < v else y - m  # uint64 arithmetic wraps mod 2^64
        return y

    def unmask(self, survivors: Sequence[str], dropped: Sequence[str]) -> dict[str, tuple[str, tuple[int, int]]]:
        """Step 3: ``owner -> ("b" | "s", share)``: b-shares of survivors, s-shares of the dropped."""
        if set(survivors) & set(dropped):
            raise InputError("a client cannot be both a survivor and dropped", where="unmask")
        out: dict[str, tuple[str, tuple[int, int]]] = {}
        for u in survivors:
            if u in self.held_shares:
                out[u] = ("b", self.held_shares[u]["b"])
        for u in dropped:
            if u in self.held_shares:
                out[u] = ("s", self.held_shares[u]["s"])
        return out


# ------------------------------------------------------------------------------ server
class SecAggServer:
    """The server's half: routes ciphertexts, sums masked inputs, removes masks from shares.

    Args:
        dim: vector length.
        threshold: t (as the clients').
        session: round identifier (as the clients').
        scale_bits: fixed-point precision (as the clients').
    """

    def __init__(self, dim: int, threshold: int, session: str = "0", scale_bits: int = 24) -> None:
        if threshold < 2:
            raise InputError(f"secure aggregation needs a threshold >= 2, got {threshold}", where="threshold")
        self.dim, self.threshold, self.session, self.scale_bits = dim, threshold, session, scale_bits
        self.roster: dict[str, AdvertisedKeys] = {}
        self.shared: set[str] = set()
        self.masked: dict[str, np.ndarray] = {}

    def collect_keys(self, adverts: Sequence[AdvertisedKeys]) -> dict[str, AdvertisedKeys]:
        """Step 0: the roster broadcast to all clients."""
        roster = {a.client_id: a for a in adverts}
        if len(roster) < self.threshold:
            raise InputError(f"{len(roster)} clients advertised keys, below the threshold {self.threshold}", where="secure aggregation")
        self.roster = dict(sorted(roster.items()))
        return self.roster

    def route_shares(self, outboxes: Mapping[str, Mapping[str, bytes]]) -> dict[str, dict[str, bytes]]:
        """Step 1: ``recipient -> {sender: ciphertext}``; senders become the set U2."""
        self.shared = set(outboxes)
        if len(self.shared) < self.threshold:
            raise InputError(f"{len(self.shared)} clients shared keys, below the threshold", where="secure aggregation")
        inboxes: dict[str, dict[str, bytes]] = {v: {} for v in self.shared}
        for sender, box in outboxes.items():
            for recipient, ct in box.items():
                if recipient in inboxes:
                    inboxes[recipient][sender] = ct
        return inboxes

    def collect_masked(self, masked: Mapping[str, np.ndarray]) -> tuple[list[str], list[str]]:
        """Step 2: ``(survivors, dropped)``; clients that shared keys but sent no input dropped."""
        unknown = set(masked) - self.shared
        if unknown:
            raise InputError(f"masked inputs from clients that did not share keys: {sorted(unknown)}", where="secure aggregation")
        self.masked = {k: np.asarray(v, dtype=np.uint64) for k, v in masked.items()}
        survivors = sorted(self.masked)
        if len(survivors) < self.threshold:
            raise InputError(f"only {len(survivors)} masked inputs, below the threshold {self.threshold}", where="secure aggregation")
        return survivors, sorted(self.shared - set(self.masked))

    def finalize(self, responses: Mapping[str, Mapping[str, tuple[str, tuple[int, int]]]]) -> np.ndarray:
        """Step 3: the (dim,) float64 sum of the survivors' inputs."""
        survivors, dropped = sorted(self.masked), sorted(self.shared - set(self.masked))
        if len(responses) < self.threshold:
            raise InputError(f"{len(responses)} unmasking responses, below the threshold {self.threshold}", where="secure aggregation")
        shares: dict[str, dict[str, list[tuple[int, int]]]] = {}
        for resp in responses.values():
            for owner, (kind, share) in resp.items():
                shares.setdefault(owner, {}).setdefault(kind, []).append(cast(tuple[int, int], tuple(share)))
        total = np.zeros(self.dim, dtype=np.uint64)
        for y in self.masked.values():
            total = total + y
        for u in survivors:
            got = shares.get(u, {}).get("b", [])
            if len(got) < self.threshold:
                raise InputError(f"only {len(got)} shares of {u!r}'s self mask", where="secure aggregation")
            b = shamir_combine(got[: self.threshold]).to_bytes(32, "big")
            total = total - _prg(b, self.dim)
        for u in dropped:
            got = shares.get(u, {}).get("s", [])
            if len(got) < self.threshold:
                raise InputError(f"only {len(got)} shares of dropped {u!r}'s mask key", where="secure aggregation")
            s_u = _priv_from_int(shamir_combine(got[: self.threshold]))
            for v in survivors:
                shared = s_u.exchange(X25519PublicKey.from_public_bytes(self.roster[v].s_pk))
                m = _prg(_kdf(shared, b"edgetwin-secagg-mask|" + self.session.encode()), self.dim)
                # v added +m if v < u else -m: take it back out.
                total = total - m if v < u else total + m
        return decode_fixed(total, self.scale_bits)


@dataclass
class SecureSumTranscript:
    """What the server saw in `secure_sum` (for audits and tests)."""

    masked: dict[str, np.ndarray] = field(default_factory=dict)
    survivors: list[str] = field(default_factory=list)
    dropped: list[str] = field(default_factory=list)
    ciphertext_bytes: int = 0


def secure_sum(
    inputs: Mapping[str, np.ndarray],
    threshold: int | None = None,
    drop_after_sharing: Sequence[str] = (),
    session: str = "0",
    scale_bits: int = 24,
    seed: int | None = None,
) -> tuple[np.ndarray, SecureSumTranscript]:
    """Run the whole protocol in-process: ``(sum of the survivors' inputs, transcript)``.

    Args:
        inputs: client id -> (D,) float vector.
        threshold: t; default ``floor(n / 2) + 1``.
        drop_after_sharing: clients that vanish after step 1 (their input is not in the sum, their
            masks are recovered from the survivors' shares).
        session, scale_bits: see `SecAggClient`.
        seed: deterministic keys (tests); None: from the OS.
    """
    ids = sorted(inputs)
    n = len(ids)
    if n == 0:
        raise InputError("no inputs", where="secure aggregation")
    dim = int(np.asarray(inputs[ids[0]]).size)
    t = threshold if threshold is not None else n // 2 + 1
    server = SecAggServer(dim, t, session, scale_bits)
    rng = np.random.default_rng(seed) if seed is not None else None
    clients = {
        cid: SecAggClient(cid, dim, t, session, scale_bits, seed=None if rng is None else int(rng.integers(2**62)))
        for cid in ids
    }
    roster = server.collect_keys([c.advertise_keys() for c in clients.values()])
    outboxes = {cid: c.share_keys(roster) for cid, c in clients.items()}
    inboxes = server.route_shares(outboxes)
    dropped_set = set(drop_after_sharing)
    masked = {cid: c.masked_input(inputs[cid], inboxes[cid]) for cid, c in clients.items() if cid not in dropped_set}
    survivors, dropped = server.collect_masked(masked)
    responses = {v: clients[v].unmask(survivors, dropped) for v in survivors}
    total = server.finalize(responses)
    transcript = SecureSumTranscript(
        masked={k: v.copy() for k, v in masked.items()},
        survivors=survivors,
        dropped=dropped,
        ciphertext_bytes=sum(len(ct) for box in outboxes.values() for ct in box.values()),
    )
    return total, transcript


class SecureAggregator(Aggregator):
    """A linear strategy (FedAvg, FedAvgM, Gaussian DP) fed only the securely aggregated sum.

    Each client masks ``[w_k * mix_k * delta_k, w_k]`` (its weighted update plus its weight), so
    the server learns ``sum_k w_k mix_k delta_k`` and ``sum_k w_k`` and nothing per client. With
    `GaussianDP` the clients clip before masking and the server adds the noise to the sum.

    Args:
        inner: a `LinearAggregator`; robust, clustering and attention rules need individual
            updates and are refused.
        threshold_fraction: t = max(2, ceil(fraction * n)); above 0.5 by default.
        seed: deterministic keys (tests and benchmarks); None: from the OS.
    """

    name = "secure"
    needs_individual_updates = False

    def __init__(self, inner: Aggregator, threshold_fraction: float = 0.6, seed: int | None = None) -> None:
        from edgetwin.federation.aggregation.fedavg import StalenessAware

        # A staleness discount is applied by each client to its own input before masking.
        self.staleness = inner if isinstance(inner, StalenessAware) else None
        linear = inner.inner if isinstance(inner, StalenessAware) else inner
        if linear.needs_individual_updates or not isinstance(linear, LinearAggregator):
            raise InputError(
                f"{inner.name!r} needs each client's update and cannot be combined with secure aggregation, "
                "which only reveals the sum (use fedavg, fedavgm or dp_gaussian)",
                where="strategy",
            )
        if not 0.0 < threshold_fraction <= 1.0:
            raise InputError(f"threshold_fraction must be in (0, 1], got {threshold_fraction}", where="threshold_fraction")
        self.inner: LinearAggregator = linear
        self.threshold_fraction, self.seed = float(threshold_fraction), seed
        self.last_transcript: SecureSumTranscript | None = None

    def threshold(self, n: int) -> int:
        return max(2, math.ceil(self.threshold_fraction * n))

    def aggregate(self, updates: Sequence[ClientUpdate], global_params: np.ndarray, round: int = 0,
                  dropped: Sequence[str] = ()) -> AggregateResult:
        """Aggregate through the protocol; ``dropped`` clients vanish after sharing their keys."""
        from edgetwin.federation.aggregation.privacy import GaussianDP

        g = np.asarray(global_params, dtype=np.float32)
        check_updates(updates, g.size)
        dropped_stale: list[str] = []
        if self.staleness is not None:
            st, kept = self.staleness, []
            for u in updates:
                age = round - u.base_round
                if st.max_staleness is not None and age > st.max_staleness:
                    dropped_stale.append(u.client_id)
                    continue
                kept.append(ClientUpdate(u.client_id, u.delta, u.num_samples, u.base_round, u.mix * st.discount(age)))
            updates = kept
        if len(updates) < 2:
            raise InputError("secure aggregation needs at least 2 clients", where="secure aggregation")
        inputs = {}
        for u in updates:
            d = np.asarray(u.delta, np.float64)
            if isinstance(self.inner, GaussianDP):
                inputs[u.client_id] = np.append(self.inner.clip(d * u.mix), 1.0)
            else:
                w_delta, w_norm = self.inner.client_weight(u)
                inputs[u.client_id] = np.append(w_delta * d, w_norm)
        seed = None if self.seed is None else self.seed * 1_000_003 + int(round)
        total, transcript = secure_sum(inputs, self.threshold(len(updates)), dropped, session=str(round), seed=seed)
        self.last_transcript = transcript
        count = len(transcript.survivors)
        res = self.inner.aggregate_sum(total[:-1], float(total[-1]), count, g, round)
        res.info.update({"secure": True, "survivors": transcript.survivors, "dropped": transcript.dropped,
                         "dropped_stale": dropped_stale})
        return res

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.inner.load_state_dict(state)
