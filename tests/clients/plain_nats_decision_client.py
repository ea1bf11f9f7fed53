"""A decision client the way a non-edgetwin platform writes one: plain nats-py and json, nothing else.

    python plain_nats_decision_client.py NATS_URL SUBJECT < cases.json > replies.json

``cases.json`` is a list of ``{"headers": {...} | null, "body": "<text sent as UTF-8>"}``; the
output is a list of ``{"headers": {...}, "body": <parsed JSON reply>}``, one per case, in order.
It refuses to run if anything from edgetwin got imported (the point is to show it is not needed).
"""

import asyncio
import json
import sys

import nats


async def main(url: str, subject: str) -> None:
    cases = json.load(sys.stdin)
    nc = await nats.connect(url)
    out = []
    try:
        for case in cases:
            msg = await nc.request(subject, case["body"].encode(), timeout=10, headers=case.get("headers"))
            out.append({"headers": dict(msg.headers or {}), "body": json.loads(msg.data)})
    finally:
        await nc.close()
    leaked = sorted(m for m in sys.modules if m == "edgetwin" or m.startswith("edgetwin."))
    if leaked:
        sys.exit(f"the plain client imported edgetwin modules: {leaked}")
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2]))
