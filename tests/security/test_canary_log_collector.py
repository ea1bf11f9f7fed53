"""The canary-log collector attributes a segment by who sent it and decodes it within bounds (issue 45, items 2 and 5).

2. A site publishing on its own subject shipped a ``canary_log`` segment whose payload named another
   site: the collector kept the forgery under the victim's name and dropped the victim's real
   segment as a duplicate.
5. A segment of 516 KB on the wire decoded to 800 MB: the declared row count and uncompressed size
   are checked before anything is decoded.
"""

from __future__ import annotations

import asyncio
import io

import numpy as np
import pandas as pd

from edgetwin.edge.bus import Received
from edgetwin.edge.canary import CanaryLogCollector, canary_log_subject
from edgetwin.edge.messages import Envelope


def _segment(rows: pd.DataFrame, site: str, run: str, seq: int, sender: str) -> Envelope:
    buf = io.BytesIO()
    rows.to_parquet(buf, index=False)
    return Envelope(kind="canary_log", sender=sender, payload={"site": site, "canary": run, "seq": seq},
                    tensors={"parquet": np.frombuffer(buf.getvalue(), dtype=np.uint8)}, msg_id=f"{run}-{seq}")  # fmt: skip


def _deliver(c: CanaryLogCollector, subject_site: str, env: Envelope) -> None:
    asyncio.run(c.handle(Received(canary_log_subject(subject_site), env, None, 0)))


def test_a_segment_naming_another_site_is_refused_and_the_real_one_is_kept() -> None:
    c = CanaryLogCollector()
    forged = pd.DataFrame({"agent": ["g1"], "t": [0], "kpi.x": [999.0]})
    real = pd.DataFrame({"agent": ["g1"], "t": [0], "kpi.x": [1.0]})
    # site B, on its own subject, ships a segment that names site A's run first
    _deliver(c, "edge-b", _segment(forged, "edge-a", "run-1", 0, "runtime/edge-b"))
    _deliver(c, "edge-a", _segment(real, "edge-a", "run-1", 0, "runtime/edge-a"))
    assert c.refused == {"forged": 1} and c.duplicates == 0
    assert c.log("edge-a", "run-1")["kpi.x"].tolist() == [1.0]
    assert c.log("edge-b", "run-1").empty
    # another sender for a run whose segments came from edge-a's runtime: refused, not mixed in
    _deliver(c, "edge-a", _segment(forged, "edge-a", "run-1", 1, "runtime/intruder"))
    assert c.refused["sender"] == 1 and c.seqs("edge-a", "run-1") == [0]
    # an operator who names each site's runtime: nobody else speaks for that site
    named = CanaryLogCollector(senders={"edge-a": "runtime/edge-a"})
    _deliver(named, "edge-a", _segment(forged, "edge-a", "run-2", 0, "runtime/edge-b"))
    assert named.refused == {"sender": 1} and named.log("edge-a", "run-2").empty


def test_a_parquet_bomb_is_refused_before_it_is_decoded() -> None:
    c = CanaryLogCollector(max_rows=100_000, max_bytes=4 * 2**20)
    bomb = pd.DataFrame({"agent": np.zeros(2_000_000, dtype=np.int64), "kpi.x": np.zeros(2_000_000)})
    env = _segment(bomb, "edge-a", "run-1", 0, "runtime/edge-a")
    assert env.tensors["parquet"].nbytes < 200_000  # small on the wire, 32 MB decoded
    _deliver(c, "edge-a", env)
    assert c.refused == {"oversized": 1} and c.seqs("edge-a", "run-1") == []
    junk = Envelope(kind="canary_log", sender="runtime/edge-a", payload={"site": "edge-a", "canary": "run-1", "seq": 1},
                    tensors={"parquet": np.frombuffer(b"PAR1 not parquet", dtype=np.uint8)}, msg_id="run-1-1")  # fmt: skip
    _deliver(c, "edge-a", junk)
    assert c.refused == {"oversized": 1, "malformed": 1}
    # within the bounds, the same collector keeps an ordinary segment
    _deliver(c, "edge-a", _segment(pd.DataFrame({"agent": ["g"], "kpi.x": [0.5]}), "edge-a", "run-1", 2, "runtime/edge-a"))
    assert c.seqs("edge-a", "run-1") == [2]
