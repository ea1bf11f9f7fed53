"""Issue 45 item 2: a canary log segment is attributed by its authenticated sender, never by its
payload. A site that ships a segment naming another site (on its own subject or on the other's) is
refused, and the real segment is kept, not dropped as a duplicate."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

import numpy as np
import pandas as pd

from edgetwin.edge.bus import Received
from edgetwin.edge.canary import CanaryLogCollector, canary_log_subject, segment_envelope
from edgetwin.edge.message_auth import FederationKeys
from edgetwin.edge.messages import Envelope, decode, encode


def _segment(tmp: Path, rows: pd.DataFrame) -> Path:
    p = tmp / "seg-000001.parquet"
    buf = io.BytesIO()
    rows.to_parquet(buf, index=False)
    p.write_bytes(buf.getvalue())
    return p


def _delivered(env: Envelope, subject: str, keys: FederationKeys) -> Received:
    """``env`` as a collector receives it: signed by its sender's key, framed, decoded."""
    frame = encode(env, sign=keys.private[env.sender].sign)
    return Received(subject, decode(frame), None, len(frame))


def test_a_forged_segment_naming_another_site_is_refused_and_the_real_one_kept(tmp_path: Path) -> None:
    keys = FederationKeys.generate(["runtime/a", "runtime/b"])
    real_rows = pd.DataFrame({"agent": ["g1"], "kpi.slo": [0.1], "site": ["a"]})
    fake_rows = pd.DataFrame({"agent": ["g1"], "kpi.slo": [0.9], "site": ["a"]})
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    real = segment_envelope("a", "run1", _segment(tmp_path / "a", real_rows), sender="runtime/a")
    forged = segment_envelope("a", "run1", _segment(tmp_path / "b", fake_rows), sender="runtime/b")  # B names A
    # the forged segment's bus id differs from the real one's (JetStream cannot drop the real one)
    assert forged.msg_id != real.msg_id and real.msg_id.startswith("run1-a-1-")
    collector = CanaryLogCollector(keyring=keys.keyring)

    async def main() -> None:
        # B's key, B as sender, on B's subject and on A's: both refused, first, before A's real one
        await collector.handle(_delivered(forged, canary_log_subject("b"), keys))
        await collector.handle(_delivered(forged, canary_log_subject("a"), keys))
        # B signs as "runtime/a": the signature does not verify under A's key
        impostor = Envelope(kind="canary_log", sender="runtime/a", payload=forged.payload, tensors=forged.tensors)
        frame = encode(impostor, sign=keys.private["runtime/b"].sign)
        await collector.handle(Received(canary_log_subject("a"), decode(frame), None, len(frame)))
        await collector.handle(_delivered(real, canary_log_subject("a"), keys))

    asyncio.run(main())
    assert collector.refused == {"forged": 2, "unauthenticated": 1}
    assert collector.duplicates == 0
    kept = collector.log("a", "run1")
    assert kept["kpi.slo"].tolist() == [0.1]  # the real segment, not the forgery
    assert collector.log("b", "run1").empty


def test_without_a_keyring_the_sender_still_names_the_site(tmp_path: Path) -> None:
    """On a bus that authenticates (bus.auth) the collector needs no keyring: the sender it sees is
    verified, and it is the sender, not the payload, that names the site."""
    seg = _segment(tmp_path, pd.DataFrame({"agent": ["g"], "kpi.slo": [0.5]}))
    forged = segment_envelope("a", "run1", seg, sender="runtime/b")
    collector = CanaryLogCollector()
    asyncio.run(collector.handle(Received(canary_log_subject("b"), forged, None, 0)))
    assert collector.refused == {"forged": 1} and not collector.segments
    ok = segment_envelope("b", "run1", seg, sender="runtime/b")
    asyncio.run(collector.handle(Received(canary_log_subject("b"), ok, None, 0)))
    assert collector.seqs("b", "run1") == [1]
    assert np.isclose(collector.log("b", "run1")["kpi.slo"].iloc[0], 0.5)
