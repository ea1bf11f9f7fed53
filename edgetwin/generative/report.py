"""Fidelity reports of population models: metrics JSON and real-vs-generated marginal plots."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from edgetwin.contract.metrics import fidelity_report, kl_marginal, marginal_histograms
from edgetwin.contract.spec import TwinSpec
from edgetwin.generative.base import PopulationModel


def plot_marginals(
    real: pd.DataFrame,
    generated: Mapping[str, pd.DataFrame],
    spec: TwinSpec,
    columns: list[str],
    path: str | Path,
    title: str = "",
    label_column: str | None = "scenario",
) -> Path:
    """One panel per column (and one for the label column): the real histogram against each model's.

    The binning is the one the KL uses (`edgetwin.contract.metrics.marginal_histograms`), so what the
    plot shows is what the table scores; heavy-tailed columns are drawn in `log_space`. Like
    seed 004 Fig. 3. Writes a PNG (Agg backend) and returns its path.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(columns) + ([label_column] if label_column and label_column in real else [])
    ncol = min(4, len(panels))
    nrow = int(np.ceil(len(panels) / ncol))
    fig, axes = plt.subplots(nrow, ncol, figsize=(3.6 * ncol, 2.8 * nrow), squeeze=False)
    for ax, col in zip(axes.flat, panels, strict=False):
        if col == label_column:
            cats = sorted(real[col].astype(str).unique())
            width = 0.8 / (1 + len(generated))
            x = np.arange(len(cats))
            ax.bar(
                x,
                real[col].astype(str).value_counts(normalize=True).reindex(cats, fill_value=0),
                width,
                color="black",
                label="real",
            )
            for k, (name, g) in enumerate(generated.items(), start=1):
                freq = g[col].astype(str).value_counts(normalize=True).reindex(cats, fill_value=0)
                ax.bar(x + k * width, freq, width, label=name)
            ax.set_xticks(x + width * len(generated) / 2, cats)
            ax.set_title(col, fontsize=9)
            continue
        try:
            f = spec.feature(col)
        except KeyError:
            f = None
        for k, (name, g) in enumerate(generated.items()):
            p, q, grid = marginal_histograms(real[col].to_numpy(), g[col].to_numpy(), f)
            if f is not None and f.allowed_values() is not None:
                if k == 0:
                    ax.plot(grid, p, "o-", color="black", lw=2, label="real")
                ax.plot(grid, q, ".--", label=name)
            else:
                centres = (grid[1:] + grid[:-1]) / 2
                if k == 0:
                    ax.step(centres, p, where="mid", color="black", lw=2, label="real")
                ax.step(centres, q, where="mid", label=name)
        heavy = f is not None and f.kind == "heavy_tailed"
        ax.set_title(col + (" (log)" if heavy else ""), fontsize=9)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(panels) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def population_report(
    model: PopulationModel,
    real: pd.DataFrame,
    n: int = 20_000,
    seed: int = 0,
    out: str | Path | None = None,
) -> dict[str, Any]:
    """Score ``model`` against real profile rows (ideally held out from its training).

    Args:
        model: a fitted population model.
        real: one row per agent with ``scenario`` and the model's profile columns.
        n: agents to generate (scenarios mixed in the learned proportions).
        seed: sampling and metric seed.
        out: a directory for ``report.json`` and ``marginals.png``; None writes nothing.

    Returns:
        `edgetwin.contract.metrics.fidelity_report` of the generated rows, plus the model's name, fit
        metadata and per-scenario KLs (``"per_scenario": {scenario: {column: KL}}``).
    """
    cols = model.spec.names("profile")
    gen = model.sample(n, seed=seed)
    rep = fidelity_report(real, gen, model.spec, cols, seed=seed)
    per: dict[str, dict[str, float]] = {}
    for s in model.scenarios:
        r = real[real["scenario"].astype(str) == s]
        g = gen[gen["scenario"] == s]
        if len(r) >= 2 and len(g) >= 2:
            per[s] = {c: kl_marginal(r[c].to_numpy(), g[c].to_numpy(), model.spec.feature(c)) for c in cols}
    rep.update({"model": model.name, "per_scenario": per, "fit": model.meta})
    if out is not None:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "report.json").write_text(json.dumps(rep, indent=2, default=_default))
        plot_marginals(
            real,
            {model.name: gen},
            model.spec,
            cols,
            out / "marginals.png",
            title=f"{model.name}: real (held-out) vs generated",
        )
        rep["png"] = str(out / "marginals.png")
    return rep


def _default(o: Any) -> Any:
    if hasattr(o, "item"):
        return o.item()
    if hasattr(o, "tolist"):
        return o.tolist()
    return str(o)
