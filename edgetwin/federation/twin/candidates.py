"""Per-model candidates of a site's personalisation: the federated model as it is, proximal
fine-tunings of it towards the federated weights (FedProx / Ditto) and a model of the site's rows
alone, each scored by the fixed-variance Gaussian likelihood of held-out service groups
(`model_candidates`, `select_and_fit`). Written here rather than with an SB3 trainer because the
proximal term and the fixed-variance likelihood are not SB3 losses."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch as th

from edgetwin.imitation.mail import (
    OUTPUT_CLIP,
    set_maximum_likelihood_std,
)

#: proximal strengths tried by `personalise` (0: plain fine-tuning; larger: closer to the federation)
PROX_GRID = (0.0, 0.1, 1.0, 10.0)


@dataclass
class Candidate:
    """One way of fitting a model on the site's rows: start (federated or fresh), proximal
    strength, epochs, and the held-out loss it reached."""

    name: str
    start: str  # "federated" | "fresh"
    mu: float
    epochs: int
    loss: float


def _actor_mean(pol: Any, x: th.Tensor) -> th.Tensor:
    """``(N, in) -> (N, out)`` the Gaussian policy's mean, with gradients (`GaussianModel.mean`
    without ``no_grad``; Box observations need no preprocessing)."""
    return pol.action_net(pol.mlp_extractor.forward_actor(pol.pi_features_extractor(x)))


def _actor_params(pol: Any) -> list[tuple[str, th.nn.Parameter]]:
    return [(n, p) for n, p in pol.named_parameters() if n != "log_std" and "value_net" not in n]


def _weighted_loss(pol: Any, x: np.ndarray, y: np.ndarray, inv_var: np.ndarray) -> float:
    """Mean Gaussian negative log-likelihood of ``y`` under ``pol``'s mean with a fixed variance
    (``1 / inv_var``, per output), up to constants: ``0.5 * mean(sum((mu - y)^2 * inv_var))``."""
    if len(x) == 0:
        return float("nan")
    with th.no_grad():
        mu = _actor_mean(pol, th.as_tensor(np.asarray(x, np.float32)))
        d = mu - th.as_tensor(np.asarray(y, np.float32))
        return float(0.5 * (d * d * th.as_tensor(inv_var, dtype=d.dtype)).sum(dim=1).mean())


def proximal_fit(pol: Any, anchor: Any, x: np.ndarray, y: np.ndarray, inv_var: np.ndarray, epochs: int, mu: float,
                 seed: int, x_val: np.ndarray | None = None, y_val: np.ndarray | None = None,
                 batch_size: int = 256, lr: float = 1e-3) -> list[float]:
    """Fit ``pol``'s mean to ``(x, y)`` by Adam on the fixed-variance Gaussian likelihood plus the
    proximal term ``mu/2 * ||theta - theta_anchor||^2`` (FedProx / Ditto: the site's model may move
    as far from the federated one as its own rows justify, no further); ``mu = 0`` is plain
    fine-tuning, and a fresh ``pol`` with ``mu = 0`` is a local-only fit.

    Args:
        pol, anchor: Gaussian policies of the same architecture (``anchor`` is not modified).
        x, y: ``(N, in)``, ``(N, out)`` standardised inputs and targets (``y`` clipped to the
            models' output range).
        inv_var: ``(out,)`` per-output weights (inverse variances: the federated residuals).
        epochs, mu, seed: epochs over ``x``; proximal strength; batches and init are seeded.
        x_val, y_val: held-out rows; when given, their loss is recorded after every epoch.

    Returns:
        The held-out loss after each epoch (empty without held-out rows).
    """
    y = np.clip(np.asarray(y, np.float32), -OUTPUT_CLIP, OUTPUT_CLIP)
    x = np.asarray(x, np.float32)
    params = _actor_params(pol)
    ref = dict(_actor_params(anchor))
    ref_t = [ref[n].detach().clone() for n, _ in params]
    opt = th.optim.Adam([p for _, p in params], lr=lr)
    w = th.as_tensor(inv_var, dtype=th.float32)
    xt, yt = th.as_tensor(x), th.as_tensor(y)
    rng = np.random.default_rng(seed)
    bs = max(1, min(batch_size, len(x)))
    val: list[float] = []
    for _ in range(max(0, int(epochs))):
        order = rng.permutation(len(x))
        for i in range(0, len(x), bs):
            b = th.as_tensor(order[i : i + bs])
            d = _actor_mean(pol, xt[b]) - yt[b]
            loss = 0.5 * (d * d * w).sum(dim=1).mean()
            if mu > 0:
                loss = loss + 0.5 * mu * sum(((p - r) ** 2).sum() for (_, p), r in zip(params, ref_t, strict=True))
            opt.zero_grad()
            loss.backward()
            opt.step()
        if x_val is not None and y_val is not None and len(x_val):
            val.append(_weighted_loss(pol, x_val, np.clip(y_val, -OUTPUT_CLIP, OUTPUT_CLIP), inv_var))
    return val


def _set_std(pol: Any, x: np.ndarray, y: np.ndarray) -> None:
    """The variance at its maximum-likelihood value given the mean (as `behaviour_clone` ends)."""
    if len(x) == 0:
        return
    set_maximum_likelihood_std(pol, x, np.clip(np.asarray(y, np.float32), -OUTPUT_CLIP, OUTPUT_CLIP))


def validation_agents(df: pd.DataFrame, fraction: float, seed: int) -> np.ndarray:
    """``(N,)`` bool: the rows of held-out service groups (``(episode, agent)`` pairs), about
    ``fraction`` of each scenario's groups and at least one of each scenario that has two or more,
    drawn with ``seed``. Whole groups are held out (not ticks) so that the validation rows are
    groups the fit never saw, as a held-out day's are."""
    key = df["episode"].astype(str) + "\x1f" + df["agent"].astype(str)
    out = np.zeros(len(df), bool)
    if fraction <= 0:
        return out
    rng = np.random.default_rng([seed, 0x7A1])
    for _, sub in df.groupby("scenario", sort=True):
        groups = np.sort(key.loc[sub.index].unique())
        if len(groups) < 2:
            continue
        k = min(len(groups) - 1, max(1, int(round(fraction * len(groups)))))
        held = set(rng.choice(groups, size=k, replace=False))
        out[sub.index.to_numpy()[key.loc[sub.index].isin(held).to_numpy()]] = True
    return out


def model_candidates(fed: Any, x: np.ndarray, y: np.ndarray, held: np.ndarray, epochs: int, local_epochs: int,
                     seed: int, prox_grid: Sequence[float] = PROX_GRID, fresh: Any = None) -> list[tuple[Candidate, Any]]:
    """The candidates of one model of one site, each trained on the rows not ``held`` and scored
    by the fixed-variance Gaussian likelihood of the ``held`` rows: the federated model as it is;
    for each ``mu`` in ``prox_grid``, fine-tuning from it with the proximal term, stopped at its
    best epoch (up to ``epochs``); a fresh model (``fresh``, same architecture) trained on the
    site's rows alone, at its best epoch (up to ``local_epochs``). Empty without held-out rows or
    with fewer than two rows to fit. Returns ``(candidate, model trained on the kept rows)``."""
    inv_var = np.exp(-2.0 * fed.log_std.detach().cpu().numpy().astype(np.float64))
    fit, val = ~held, held
    out: list[tuple[Candidate, Any]] = []
    if not val.any() or fit.sum() < 2:
        return out
    out.append((Candidate("federated", "federated", 0.0, 0, _weighted_loss(fed, x[val], y[val], inv_var)), fed))
    for j, mu in enumerate(prox_grid):
        pol = copy.deepcopy(fed)
        curve = proximal_fit(pol, fed, x[fit], y[fit], inv_var, epochs, mu, seed + 31 * j, x[val], y[val])
        e = int(np.nanargmin(curve)) if curve else 0
        # refit at the best epoch, so that the model returned is the one scored
        pol = copy.deepcopy(fed)
        proximal_fit(pol, fed, x[fit], y[fit], inv_var, e + 1, mu, seed + 31 * j)
        _set_std(pol, x[fit], y[fit])
        out.append((Candidate(f"fine-tuned (mu={mu:g})", "federated", mu, e + 1,
                               float(curve[e]) if curve else np.inf), pol))
    if fresh is not None and local_epochs > 0:
        pol = copy.deepcopy(fresh)
        curve = proximal_fit(pol, fresh, x[fit], y[fit], inv_var, local_epochs, 0.0, seed + 997, x[val], y[val])
        e = int(np.nanargmin(curve))
        pol = copy.deepcopy(fresh)
        proximal_fit(pol, fresh, x[fit], y[fit], inv_var, e + 1, 0.0, seed + 997)
        _set_std(pol, x[fit], y[fit])
        out.append((Candidate("local only", "fresh", 0.0, e + 1, float(curve[e])), pol))
    return out


def refit(cand: Candidate, fed: Any, fresh: Any, x: np.ndarray, y: np.ndarray, seed: int) -> Any:
    """A candidate's recipe (start, proximal strength, epochs) applied to all the site's rows."""
    start = fresh if cand.start == "fresh" else fed
    model = copy.deepcopy(start)
    if cand.epochs > 0 and len(x) >= 2:
        inv_var = np.exp(-2.0 * fed.log_std.detach().cpu().numpy().astype(np.float64))
        proximal_fit(model, start, x, y, inv_var, cand.epochs, cand.mu, seed + 7)
        _set_std(model, x, y)
    return model


def select_and_fit(fed: Any, x: np.ndarray, y: np.ndarray, held: np.ndarray, epochs: int, local_epochs: int,
                   seed: int, prox_grid: Sequence[float] = PROX_GRID, fresh: Any = None) -> tuple[Any, dict[str, Any]]:
    """One model of one site: the federated one, a proximal fine-tuning of it, or a local-only
    fit, whichever predicts the site's held-out rows best (`model_candidates`); the winner's recipe
    is then refitted on all rows.

    Why by held-out loss: whether the federation helps a site depends on how much data it has and
    how unlike the others it is, which only its own rows can tell; a site with plenty of data of
    its own picks its local fit, a data-poor one the federated model or a fine-tuning close to it.

    Args:
        fed: the federated model (not modified).
        x, y: ``(N, in)``, ``(N, out)`` the site's standardised rows (``y`` without NaN).
        held: ``(N,)`` bool, the held-out rows; with none (or no row to fit), the first proximal
            candidate with ``epochs`` epochs is used without selection.
        epochs, local_epochs: most epochs of fine-tuning and of the local fit.
        seed: seeds batches.
        fresh: a freshly initialised model of the same architecture (None: no local candidate).

    Returns:
        ``(model, record)``: a new model, and ``{"choice", "epochs", "mu", "losses": {name: loss}}``.
    """
    cands = [c for c, _ in model_candidates(fed, x, y, held, epochs, local_epochs, seed, prox_grid, fresh)]
    if cands:
        best = min(cands, key=lambda c: (c.loss if np.isfinite(c.loss) else np.inf))
    else:
        best = Candidate(f"fine-tuned (mu={prox_grid[0]:g})", "federated", float(prox_grid[0]), epochs, float("nan"))
    model = refit(best, fed, fresh if fresh is not None else fed, x, y, seed)
    return model, {"choice": best.name, "epochs": best.epochs, "mu": best.mu, "losses": {c.name: c.loss for c in cands}}

