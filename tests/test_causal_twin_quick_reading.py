"""The causal-twin quick page's Reading (hand-written into results.json's ``reading``) says what its JSON says."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QUICK = ROOT / "docs/benchmarks/causal_twin/quick"


def test_the_reading_is_the_run() -> None:
    doc = json.loads((QUICK / "results.json").read_text())
    page = " ".join((QUICK / "README.md").read_text().split())
    reading = " ".join(doc["reading"].split())
    assert reading in page  # the page shows the JSON's reading
    nf, res = doc["noise_floor"], doc["results"]
    assert f"a policy's day-to-day sd is {nf['day_sd_over_policy_spread']:.1f}x the spread of their means" in page
    assert f"rank the policies at rho {nf['spearman_median']:.2f} against each other" in page
    assert f"mean relative error of {100 * nf['mean_rel_error_median']:.0f} %" in page
    g = {m: res["c3"][m]["generated"] for m in ("causal", "today", "supervised")}
    assert (f"the causal twin rho {g['causal']['spearman']:.2f}, mean relative error "
            f"{100 * g['causal']['mean_rel_error']:.0f} %; today's MAIL twin {g['today']['spearman']:.2f} / "
            f"{100 * g['today']['mean_rel_error']:.0f} %; the supervised baseline {g['supervised']['spearman']:.2f} / "
            f"{100 * g['supervised']['mean_rel_error']:.0f} %") in page  # fmt: skip
    # "smaller than MAIL's on c3 and larger on a, b, c1 and c2"
    err = {log: {m: res[log][m]["generated"]["mean_rel_error"] for m in ("causal", "today")} for log in res}
    assert err["c3"]["causal"] < err["c3"]["today"]
    assert all(err[log]["causal"] > err[log]["today"] for log in ("a", "b", "c1", "c2"))
    reals = [p["real"] for p in doc["policies"]["c3/causal"]]
    span = max(reals) - min(reals)
    c = g["causal"]
    assert (f"holds {100 * c['coverage_90']:.0f} % of c3's 12 real values (plain bootstrap "
            f"{100 * c['coverage_90_plain']:.0f} %) at a median width of {c['median_width']:.2f} reward units") in page
    assert f"{c['median_width'] / span:.1f}x the spread of the 12 policies' real values ({span:.2f})" in page
    assert f"{doc['config']['minutes']:.0f} min" in page
