"""Reports of what-if runs: JSON, Markdown, PNG plots and one self-contained HTML page.

`write_report(result, out_dir)` writes::

    whatif.json                 every number, its 90 % interval, member spread, out-of-support share
    whatif.md                   KPI tables per scenario (⚠ marks numbers resting on unsupported states)
    kpis_over_time_<s>.png      per-step means of the outputs, one line per policy, 10-90 % band
    kpi_changes.png             candidate vs baseline, relative change per KPI and scenario
    report.html                 all of the above in one file (PNGs inlined as base64)
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from edgetwin.twin.whatif import Scenario, WhatIfResult

FLAG = "⚠"


def _fmt(x: float | None, digits: int = 4) -> str:
    if x is None or not isinstance(x, int | float) or not math.isfinite(x):
        return (
            "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else ("+inf" if x > 0 else "-inf")
        )
    return f"{x:.{digits}g}"


def _pct(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return "n/a" if x is None or math.isnan(x) else ("+inf" if x > 0 else "-inf")
    return f"{100 * x:+.1f}%"


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("_") or "scenario"


def _json_default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    return str(o)


def notes(result: WhatIfResult) -> list[str]:
    """Caveats a reader needs next to the numbers."""
    s = result.settings
    out = [
        f"Intervals: {result.interval_method}; {len(s['members'])} ensemble member(s) x "
        f"{s['replicates']} replicate world(s) (mode: {s['mode']}); every policy and scenario ran on the "
        "same worlds and response noise, so differences are paired.",
        f"{FLAG} marks a number for which more than {100 * result.oos_tolerance:.0f} % of the agent-steps "
        "behind it lie outside the logs' support (nearest logged [profile, state, action] farther than "
        "the logs' own 99th-percentile neighbour distance): the twin extrapolates there.",
    ]
    ref = s.get("recorded_out_of_support")
    if ref is not None:
        out.append(
            f"The recorded episodes themselves have {100 * ref:.1f} % of their agent-steps outside the training "
            "logs' support (new agents, other days): shares near that come with the traffic, not the policy."
        )
    if len(s["members"]) < 2:
        out.append(
            "Only one ensemble member answered: the intervals do not include the twin's model uncertainty."
        )
    if s["mode"] == "replay":
        out.append(
            "Counterfactual replay: each recorded episode's agents, sites, profiles and first states come from "
            "the log; actions from the policy; responses and later states from the twin"
            + (f" (except {', '.join(s['exogenous'])}, taken from the log)." if s["exogenous"] else ".")
        )
    return out


#: what a report says of a KPI whose direction (higher or lower is better) nobody declared: the
#: gate guards only KPIs with a direction (`edgetwin.policies.gate`), so such a KPI is shown, not judged
NO_DIRECTION = "no direction declared (not guarded)"


def kpi_axis_label(name: str, better: str | None) -> str:
    """A KPI's label under the changes plot: its name and its direction (↑ / ↓ better), or
    `NO_DIRECTION` over two lines."""
    if better in ("higher", "lower"):
        return f"{name}\n({'↑' if better == 'higher' else '↓'} better)"
    return f"{name}\n(no direction declared,\nnot guarded)"


def markdown_html(md: str) -> str:
    """Markdown (a report's prose: paragraphs, lists, emphasis, code) as an HTML fragment, by
    markdown-it-py (CommonMark), raw HTML in the text escaped rather than passed through."""
    from markdown_it import MarkdownIt

    return str(MarkdownIt("commonmark", {"html": False}).render(md))


# ------------------------------------------------------------------------------------ markdown
def markdown(result: WhatIfResult, title: str = "What-if report") -> str:
    """KPI tables per scenario, the comparison when there is a baseline, and the notes."""
    lines = [f"# {title}", ""]
    s = result.settings
    lines.append(
        f"Spec `{s['spec']}` ({s['spec_hash']}), {s['mode']} mode, {s['steps']} steps of "
        f"{s['step_seconds']:g} s, seed {s['seed']}, policies: {', '.join(result.policies)}"
        + (f" (baseline `{result.baseline}`)" if result.baseline else "")
        + "."
    )
    lines.append("")
    for sc in result.scenarios:
        lines += _scenario_md(result, sc)
    lines.append("## Notes")
    lines.append("")
    lines += [f"- {n}" for n in notes(result)]
    lines.append("")
    return "\n".join(lines)


def _value(d: Mapping[str, Any]) -> str:
    flag = f" {FLAG}" if d.get("flagged") else ""
    return f"{_fmt(d['mean'])} [{_fmt(d['interval'][0], 3)}, {_fmt(d['interval'][1], 3)}]{flag}"


def _scenario_md(result: WhatIfResult, sc: Scenario) -> list[str]:
    lines = [f"## Scenario `{sc.name}`", ""]
    if sc.description:
        lines += [sc.description, ""]
    if sc.perturbations:
        lines += [f"- {p.describe()}" for p in sc.perturbations] + [""]
    elif not sc.description:
        lines += ["No perturbation.", ""]
    cols = ["KPI", "better", *result.policies]
    logged = bool(result.logged_kpis) and sc.is_nominal
    if logged:
        cols.insert(2, "as logged")
    cands = result.candidates
    cols += [f"{c} vs {result.baseline} ({result.interval_label})" for c in cands]
    lines.append("| " + " | ".join(cols) + " |")
    lines.append("|" + "|".join(["---"] * 2 + ["---:"] * (len(cols) - 2)) + "|")
    for k in result.kpis:
        row = [k.name + (f" ({k.unit})" if k.unit else ""), k.better or NO_DIRECTION]
        if logged:
            v = result.logged_kpis.get(k.name)
            row.append(_fmt(float(np.nanmean(v))) if v is not None and len(v) else "n/a")
        row += [_value(result.summary(p, sc.name, k.name)) for p in result.policies]
        for cand in cands:
            c = result.compare(sc.name, k.name, candidate=cand)
            verdict = ""
            if c["worsening"] is not None and math.isfinite(c["worsening"]):
                verdict = " worse" if c["worsening"] > 0 else (" better" if c["worsening"] < 0 else "")
                lo, hi = c["change_interval"]
                if verdict and lo <= 0 <= hi:  # the interval straddles no change
                    verdict += " (n.s.)"
            flag = f" {FLAG}" if c["flagged"] else ""
            row.append(
                f"{_pct(c['change'])} [{_pct(c['change_interval'][0])}, {_pct(c['change_interval'][1])}]{verdict}{flag}"
            )
        lines.append("| " + " | ".join(row) + " |")
    oos = ", ".join(
        f"{p} {100 * float(np.nanmean(result.cell(p, sc.name).oos)):.1f} %" for p in result.policies
    )
    lines += ["", f"Agent-steps outside the logs' support: {oos}.", ""]
    return lines


# ------------------------------------------------------------------------------------ plots
def _plt() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_timeline(result: WhatIfResult, scenario: str, path: str | Path) -> Path:
    """Per-step means of every output column (and the out-of-support share), one line per policy."""
    plt = _plt()
    sc = next(s for s in result.scenarios if s.name == scenario)
    first = result.cell(result.policies[0], scenario)
    columns = list(first.timeline)
    panels = [*columns, "out of support"]
    ncols = min(4, len(panels))
    nrows = int(np.ceil(len(panels) / ncols))
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.8 * ncols, 2.6 * nrows), squeeze=False, sharex=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for i, pol in enumerate(result.policies):
        cell = result.cell(pol, scenario)
        for ax, col in zip(axes.ravel(), panels, strict=False):
            arr = cell.oos_t if col == "out of support" else cell.timeline[col]
            flat = arr.reshape(-1, arr.shape[-1])  # (M*R, T)
            with np.errstate(all="ignore"):
                import warnings

                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", RuntimeWarning)
                    mean = np.nanmean(flat, axis=0)
                    if np.isnan(flat).any():
                        lo, hi = np.nanquantile(flat, 0.1, axis=0), np.nanquantile(flat, 0.9, axis=0)
                    else:  # the same values; nanquantile goes column by column in Python (~60x slower)
                        lo, hi = np.quantile(flat, [0.1, 0.9], axis=0)
            t = np.arange(len(mean))
            c = colors[i % len(colors)]
            ax.plot(t, mean, color=c, lw=1.3, label=pol)
            if flat.shape[0] > 1:
                ax.fill_between(t, lo, hi, color=c, alpha=0.15, lw=0)
    for ax, col in zip(axes.ravel(), panels, strict=False):
        # y given: no automatic title placement, which measures every tick label of the panel on each
        # draw (seconds per report); these panels have nothing above them, so it lands at 1.0 anyway
        ax.set_title(col, fontsize=9, y=1.0)
        ax.tick_params(labelsize=7)
        for p in sc.perturbations:
            if p.start is not None or p.end is not None:
                ax.axvspan(
                    p.start or 0,
                    p.end if p.end is not None else result.settings["steps"],
                    color="grey",
                    alpha=0.08,
                )
    for ax in axes.ravel()[len(panels) :]:
        ax.axis("off")
    for ax in axes[-1]:
        ax.set_xlabel("step", fontsize=8)
    axes.ravel()[0].legend(fontsize=7)
    fig.suptitle(f"scenario {scenario}: mean per step (band: 10-90 % over members x worlds)", fontsize=10)
    # fixed margins: tight_layout's text measurement costs seconds per figure on a busy machine
    fig.subplots_adjust(left=0.05, right=0.98, bottom=0.08, top=0.9, wspace=0.28, hspace=0.38)
    path = Path(path)
    fig.savefig(path, dpi=80)
    plt.close(fig)
    return path


def plot_changes(result: WhatIfResult, path: str | Path) -> Path | None:
    """Relative change (candidate vs baseline, 90 % interval) of every KPI, one group per scenario."""
    if result.baseline is None or result.candidate is None:
        return None
    plt = _plt()
    kpis = result.kpis
    fig, ax = plt.subplots(figsize=(min(16.0, 3.0 + 0.9 * len(kpis)), 4.2))
    width = 0.8 / len(result.scenarios)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    x = np.arange(len(kpis))
    for i, sc in enumerate(result.scenarios):
        cs = [result.compare(sc.name, k.name) for k in kpis]
        val = np.array([c["change"] for c in cs], dtype=np.float64) * 100
        lo = np.array([c["change_interval"][0] for c in cs], dtype=np.float64) * 100
        hi = np.array([c["change_interval"][1] for c in cs], dtype=np.float64) * 100
        val, lo, hi = (np.clip(np.nan_to_num(a, posinf=500, neginf=-500), -500, 500) for a in (val, lo, hi))
        err = np.stack([np.maximum(val - lo, 0), np.maximum(hi - val, 0)])
        ax.bar(
            x + i * width,
            val,
            width,
            yerr=err,
            capsize=2,
            color=colors[i % len(colors)],
            label=sc.name,
            alpha=0.85,
        )
        for j, c in enumerate(cs):
            if c["flagged"]:
                ax.annotate(FLAG, (x[j] + i * width, val[j]), ha="center", fontsize=8)
    ax.axhline(0, color="black", lw=0.8)
    labels = [kpi_axis_label(k.name, k.better) for k in kpis]
    ax.set_xticks(x + width * (len(result.scenarios) - 1) / 2, labels, rotation=45, ha="right", fontsize=7)
    ax.set_ylabel(f"{result.candidate} vs {result.baseline} (%)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


# ------------------------------------------------------------------------------------ html
_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,sans-serif;margin:2em auto;max-width:1200px;color:#222}
table{border-collapse:collapse;margin:0.5em 0 1.5em 0;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 8px;text-align:right}th{background:#f3f3f3}
td:first-child,th:first-child{text-align:left}.flag{color:#b35900;font-weight:bold}
.worse{color:#b00020}.better{color:#1a7f37}img{max-width:100%;border:1px solid #eee;margin:0.5em 0}
.note{color:#555;font-size:13px}code{background:#f6f6f6;padding:0 3px}
"""


def _img(path: Path) -> str:
    data = base64.b64encode(path.read_bytes()).decode()
    return f'<img alt="{html.escape(path.name)}" src="data:image/png;base64,{data}">'


def _html_value(d: Mapping[str, Any]) -> str:
    flag = (
        f' <span class="flag" title="rests on states outside the logs\' support">{FLAG}</span>'
        if d.get("flagged")
        else ""
    )
    return f"{_fmt(d['mean'])} <small>[{_fmt(d['interval'][0], 3)}, {_fmt(d['interval'][1], 3)}]</small>{flag}"


def html_report(
    result: WhatIfResult, images: Mapping[str, Path], title: str = "What-if report", preamble: str = ""
) -> str:
    """One self-contained HTML page: the tables, the plots inlined, the notes."""
    e = html.escape
    s = result.settings
    parts = [
        f"<!doctype html><html><head><meta charset='utf-8'><title>{e(title)}</title><style>{_CSS}</style></head><body>"
    ]
    parts.append(f"<h1>{e(title)}</h1>")
    if preamble:
        parts.append(preamble)
    parts.append(
        f"<p>Spec <code>{e(str(s['spec']))}</code> ({e(str(s['spec_hash']))}), {e(s['mode'])} mode, {s['steps']} steps, "
        f"seed {s['seed']}, members {e(str(s['members']))}, {s['replicates']} replicate worlds. "
        f"Policies: {e(', '.join(result.policies))}"
        + (f" (baseline <b>{e(result.baseline)}</b>)" if result.baseline else "")
        + ".</p>"
    )
    if "changes" in images:
        parts.append("<h2>Candidate vs baseline</h2>" + _img(images["changes"]))
    for sc in result.scenarios:
        parts.append(f"<h2>Scenario <code>{e(sc.name)}</code></h2>")
        if sc.description:
            parts.append(f"<p>{e(sc.description)}</p>")
        if sc.perturbations:
            parts.append("<ul>" + "".join(f"<li>{e(p.describe())}</li>" for p in sc.perturbations) + "</ul>")
        logged = bool(result.logged_kpis) and sc.is_nominal
        cands = result.candidates
        head = ["KPI", "better", *(["as logged"] if logged else []), *result.policies]
        head += [f"{c} vs {result.baseline}" for c in cands]
        parts.append("<table><tr>" + "".join(f"<th>{e(h)}</th>" for h in head) + "</tr>")
        for k in result.kpis:
            cells = [e(k.name + (f" ({k.unit})" if k.unit else "")), e(k.better or NO_DIRECTION)]
            if logged:
                v = result.logged_kpis.get(k.name)
                cells.append(_fmt(float(np.nanmean(v))) if v is not None and len(v) else "n/a")
            cells += [_html_value(result.summary(p, sc.name, k.name)) for p in result.policies]
            for cand in cands:
                c = result.compare(sc.name, k.name, candidate=cand)
                cls = ""
                if c["worsening"] is not None and math.isfinite(c["worsening"]) and c["worsening"] != 0:
                    cls = "worse" if c["worsening"] > 0 else "better"
                flag = f' <span class="flag">{FLAG}</span>' if c["flagged"] else ""
                cells.append(
                    f"<span class='{cls}'>{_pct(c['change'])}</span> "
                    f"<small>[{_pct(c['change_interval'][0])}, {_pct(c['change_interval'][1])}]</small>{flag}"
                )
            parts.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
        parts.append("</table>")
        key = f"timeline:{sc.name}"
        if key in images:
            parts.append(_img(images[key]))
    parts.append(
        "<h2>Notes</h2><ul class='note'>" + "".join(f"<li>{e(n)}</li>" for n in notes(result)) + "</ul>"
    )
    parts.append("</body></html>")
    return "\n".join(parts)


def timeline_path(out_dir: str | Path, scenario: str) -> Path:
    """Where `write_report` puts ``scenario``'s timeline PNG (`plot_timeline`) under ``out_dir``."""
    return Path(out_dir) / f"kpis_over_time_{_slug(scenario)}.png"


def plot_some(
    result: WhatIfResult, out_dir: str | Path, units: Sequence[str], claim: Callable[[str], bool] | None = None
) -> dict[str, Path]:
    """The report's PNGs named by ``units`` (``"timeline:<scenario>"``: `plot_timeline`; ``"changes"``:
    `plot_changes`), in that order, each only if ``claim(unit)`` grants it (default: all); returns
    ``{unit: path}`` of those it wrote (``"changes"`` left out when there is nothing to compare).

    Why: each PNG depends on ``result`` only, so two processes holding the same result may share
    them (`write_report`'s ``images``), each claiming the next unit nobody has; the bytes do not
    depend on who drew them."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    done: dict[str, Path] = {}
    for unit in units:
        if claim is not None and not claim(unit):
            continue
        if unit == "changes":
            ch = plot_changes(result, out / "kpi_changes.png")
            if ch is not None:
                done[unit] = ch
        elif unit.startswith("timeline:"):
            name = unit.partition(":")[2]
            done[unit] = plot_timeline(result, name, timeline_path(out, name))
        else:
            raise ValueError(f"unknown report image {unit!r}")
    return done


def write_report(
    result: WhatIfResult,
    out_dir: str | Path,
    title: str = "What-if report",
    extra: Mapping[str, Any] | None = None,
    preamble_md: str = "",
    preamble_html: str = "",
    images: Callable[[], Mapping[str, Path]] | None = None,
) -> dict[str, Path]:
    """Write JSON, Markdown, PNGs and HTML into ``out_dir``; returns ``{artifact: path}``.

    Args:
        extra: more keys for the JSON document (e.g. a promotion decision).
        preamble_md, preamble_html: text placed before the tables (e.g. the gate's verdict).
        images: called after the JSON and the Markdown, before the HTML inlines the PNGs: every
            PNG's path by unit (`plot_some`'s), once it is written (e.g. the demo's two processes
            draw them together); default: drawn here, one after the other.
    """
    out = Path(out_dir)
    draw = images if images is not None else (lambda: plot_some(result, out, report_units(result)))
    return _write_report(result, out, title, extra, preamble_md, preamble_html, draw)


def report_units(result: WhatIfResult) -> list[str]:
    """The PNGs of ``result``'s report, in `write_report`'s order: a timeline per scenario, then the changes."""
    return [*(f"timeline:{sc.name}" for sc in result.scenarios), "changes"]


def _write_report(
    result: WhatIfResult, out: Path, title: str, extra: Mapping[str, Any] | None, preamble_md: str,
    preamble_html: str, images: Callable[[], Mapping[str, Path]],
) -> dict[str, Path]:
    """`write_report` with the PNGs drawn by ``images`` (the same files, and the same paths in the same order)."""
    out.mkdir(parents=True, exist_ok=True)
    doc = result.to_dict()
    if extra:
        doc.update(extra)
    paths = {"json": out / "whatif.json"}
    paths["json"].write_text(json.dumps(doc, indent=1, default=_json_default, allow_nan=True))
    md = markdown(result, title)
    if preamble_md:
        head, _, rest = md.partition("\n\n")
        md = f"{head}\n\n{preamble_md.rstrip()}\n\n{rest}"
    paths["markdown"] = out / "whatif.md"
    paths["markdown"].write_text(md)
    drawn = dict(images())
    ordered = {u: drawn[u] for u in report_units(result) if u in drawn}
    paths.update(ordered)
    paths["html"] = out / "report.html"
    paths["html"].write_text(html_report(result, ordered, title, preamble_html))
    return paths


__all__ = [
    "NO_DIRECTION",
    "html_report",
    "kpi_axis_label",
    "markdown",
    "markdown_html",
    "notes",
    "plot_changes",
    "plot_some",
    "plot_timeline",
    "report_units",
    "timeline_path",
    "write_report",
]
