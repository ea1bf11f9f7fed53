"""`SiteStateModel`: the next values of the site-level state columns from the whole site's tick.

Optional (``--site-model``): by default a site-level state column is the mean of its agents'
predictions; this model adds up what every agent of the site did at the tick, weighted by who it
is (see the class docstring for the form and why).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from edgetwin.contract.errors import InputError
from edgetwin.imitation.layout import DAY_SECONDS, Layout
from edgetwin.imitation.steps import StepTable

__all__ = ["SiteStateModel", "site_element_features", "time_features"]


def time_features(t: np.ndarray, step_seconds: float) -> np.ndarray:
    """``(N, 2)`` time of day ``(sin, cos)`` of step indices ``t (N,)``."""
    phase = 2.0 * np.pi * ((np.asarray(t, np.float64) * step_seconds) % DAY_SECONDS) / DAY_SECONDS
    return np.stack([np.sin(phase), np.cos(phase)], axis=1)


def site_element_features(
    layout: Layout,
    zp: np.ndarray,
    zs: np.ndarray,
    za: np.ndarray,
    zy: np.ndarray,
    scenario: np.ndarray,
    t: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-agent inputs of the site-state model: ``(who, did)``.

    Returns:
        who: ``(N, P+S'+L+n_scenarios·5)`` who the agent is and when: z(profile), its own
            (non-site) z(state) ``S'``, ``log`` of its ``L`` heavy-tailed non-negative profile
            columns (raw units: a load is a *product* of such columns, which is linear in their
            logs), its scenario one-hot, and that one-hot times the time of day's first two
            harmonics (a scenario's daily pattern; zeros without ``layout.use_time``).
        did: ``(N, A+Y+1)`` what happened at this tick: z(action), z(outputs), and a constant 1.
    """
    own = ~np.asarray(layout.site_state, dtype=bool) if layout.site_state else np.ones(zs.shape[1], bool)
    n = len(scenario)
    onehot = np.eye(len(layout.scenarios), dtype=np.float32)[np.asarray(scenario, np.int64)]
    if layout.use_time:
        t1 = time_features(t, layout.spec.step_seconds)
        t2 = time_features(2 * np.asarray(t), layout.spec.step_seconds)
        harmonics = np.concatenate([t1, t2], axis=1)
    else:
        harmonics = np.zeros((n, 4))
    daily = (onehot[:, :, None] * harmonics[:, None, :].astype(np.float32)).reshape(n, -1)
    heavy = layout.scalers["profile"].log
    raw = layout.scalers["profile"].inverse(np.asarray(zp, np.float64))[:, heavy] if np.any(heavy) else np.zeros((n, 0))
    logs = np.clip(np.log(np.maximum(raw, 1e-9)), -20.0, 20.0)
    who = np.concatenate(
        [np.asarray(v, np.float32).reshape(n, -1) for v in (zp, zs[:, own], logs)] + [onehot, daily],
        axis=1,
    )
    did = np.concatenate(
        [np.asarray(v, np.float32).reshape(n, -1) for v in (za, zy)] + [np.ones((n, 1), np.float32)], axis=1
    )
    return who, did


class SiteStateModel:
    """Next values of the site-level state columns from the whole site's tick.

    A site property at ``t+1`` (its load, the capacity its agents reserved) adds up what every
    agent of the site did *at t*, weighted by who the agent is: e.g. a reservation ratio is a sum
    over agents of ``capacity x nominal load / site vCPU``, which no site mean of actions and no
    single agent's inputs express. So each agent contributes, per column ``j``,

        ``φ_ij = exp(m_j(who_i)) · (u_j · did_i)``     (``did = [z(action), z(outputs), 1]``
                                                      and their pairwise products)

    a contribution *linear in what it did and in its pairwise products* (an edge load is demand x
    offload ratio x edge share: the agent's response times the platform's action, scaled by who
    it is), scaled by a positive magnitude that is log-linear in who it is and when (``m`` is
    linear in `site_element_features`' ``who``, which holds the logs of the heavy-tailed profile
    columns and each scenario's daily harmonics: a load is a product of such columns, so its log
    is linear in them). The site's next standardised values are
    ``b(c) + exp(g(c)) ⊙ mean_i φ_i`` with ``c`` the site context (its site-level state at t, its
    mean actions and outputs at t-1, log size, time) and ``b``, ``g`` linear. Every part is linear
    or log-linear on purpose: a site's load is dominated by its few heaviest agents, so the logs
    hold few independent examples of what matters; an MLP per agent (this model's previous form)
    fitted them and did not carry over to other days (held-out R² of the emulated cluster's
    reservation ratio 0.01 / 0.17 / -1.00 on three seeds, this form -0.05 / 0.89 / -0.10;
    `benchmarks/twin_site_state.py`). And under a random logging
    policy each agent's action varies over its whole range but a site's mean action hardly moves,
    so a contribution linear in the action extrapolates a policy that moves every agent the same
    way the way a sum does. Columns that are near-random walks (`Layout.state_absolute` False, e.g.
    a clock) are predicted as changes. Causal: every input is known when the tick ends. Fitted by
    full-batch Adam on the logged (episode, site, t) groups; one random 15 % of the episodes is
    held out to pick the epoch and, per column, whether the products stay (a column whose
    held-out error they do not lower is fitted without them).

    Attributes:
        columns: indices of the site-level state columns (into ``layout.state``).
        absolute: per such column, predict the next value (True) or the change (False).
        net: the torch parameters: ``magnitude`` (``m``, linear), ``linear`` (``u``, ``(k, D)``)
            and ``context`` (``[b, g]``, linear).
        z_low, z_high: the logged range of the columns (z); predictions are clipped to it, because
            a site pushed beyond anything logged feeds its own next prediction and runs away.
        val_r2: per column, R² of the next value on the held-out episodes.
        products: per column, whether its contributions use the pairwise products.
    """

    def __init__(
        self,
        layout: Layout,
        seed: int = 0,
        columns: Sequence[str] | None = None,
        interactions: bool = True,
    ) -> None:
        import torch as th

        self.columns = self.select_columns(layout, columns)
        self.interactions = interactions
        absolute = np.asarray(layout.state_absolute or [True] * len(layout.state), dtype=bool)
        self.absolute = absolute[self.columns]
        self.log_size_center = layout.log_size_center
        self.use_time = layout.use_time
        k = len(self.columns)
        n_site = int(np.sum(layout.site_state))
        n_log = int(np.sum(layout.scalers["profile"].log))
        n_who = len(layout.profile) + len(layout.state) - n_site + n_log + 5 * len(layout.scenarios)
        n_acts = len(layout.action) + layout.n_outputs
        self.n_did = n_acts + 1 + (n_acts * (n_acts - 1) // 2 if interactions else 0)
        th.manual_seed(seed)
        n_ctx = k + layout.n_lag + 1 + 2
        magnitude = th.nn.Linear(n_who, k)
        self.net = th.nn.ModuleDict(
            {
                "magnitude": magnitude,
                "linear": th.nn.Linear(self.n_did, k, bias=False),
                "context": th.nn.Linear(n_ctx, 2 * k),
            }
        )
        # start from equal magnitudes: the logs move them only as far as the data asks
        th.nn.init.zeros_(magnitude.weight)
        th.nn.init.zeros_(magnitude.bias)
        self.k = k
        self.z_low = np.full(k, -np.inf)
        self.z_high = np.full(k, np.inf)
        self.val_r2 = np.full(k, np.nan)
        self.products = np.full(k, interactions)

    @staticmethod
    def select_columns(layout: Layout, columns: Sequence[str] | None = None) -> np.ndarray:
        """Indices (into ``layout.state``) of the columns to model: ``columns`` (default: every
        site-level state column); raises `InputError` for a name that is not a site-level column."""
        site = [c for c, is_site in zip(layout.state, layout.site_state, strict=False) if is_site]
        names = site if columns is None else list(columns)
        bad = [c for c in names if c not in site]
        if bad:
            raise InputError(
                f"site-model column(s) {bad} are not site-level state columns of this log "
                f"(one value per site and tick); those are {site}",
                "site_model",
            )
        return np.array(sorted(layout.state.index(c) for c in names), dtype=np.int64)

    def _terms(self, did: Any) -> Any:
        """``did`` with the pairwise products of its action and output entries appended."""
        import torch as th

        if not getattr(self, "interactions", False):  # a model pickled before the products
            return did
        i, j = th.triu_indices(did.shape[1] - 1, did.shape[1] - 1, offset=1)
        return th.cat([did, did[:, i] * did[:, j]], dim=1)

    def _forward(self, who: Any, did: Any, codes: Any, site_x: Any) -> Any:
        import torch as th

        phi = self.net["linear"](self._terms(did)) * th.exp(self.net["magnitude"](who).clamp(-30.0, 30.0))
        n_groups = site_x.shape[0]
        pooled = th.zeros((n_groups, self.k), dtype=phi.dtype).index_add_(0, codes, phi)
        pooled = pooled / th.bincount(codes, minlength=n_groups).clamp(min=1).to(phi.dtype)[:, None]
        bg = self.net["context"](site_x)
        return bg[:, : self.k] + th.exp(bg[:, self.k :].clamp(-5.0, 5.0)) * pooled

    def site_inputs(
        self, zs_site: np.ndarray, lag: np.ndarray, size: np.ndarray, t: np.ndarray, step_seconds: float
    ) -> np.ndarray:
        """``(G, k + A+Y + 3)`` site-level inputs: z(site state) at t, the site's mean z(action)
        and z(outputs) at t-1 (``lag``, zeros at t = 0), centred log size, time (sin, cos)."""
        tt = time_features(t, step_seconds) if self.use_time else np.zeros((len(size), 2))
        return np.concatenate(
            [zs_site, lag, (np.log1p(size) - self.log_size_center)[:, None], tt], axis=1
        ).astype(np.float32)

    def predict(self, who: np.ndarray, did: np.ndarray, codes: np.ndarray, site_x: np.ndarray) -> np.ndarray:
        """Next z of the site columns ``(G, k)`` (changes already added) for groups ``codes``."""
        import torch as th

        with th.no_grad():
            out = self._forward(
                th.as_tensor(who, dtype=th.float32),
                th.as_tensor(did, dtype=th.float32),
                th.as_tensor(np.asarray(codes, np.int64)),
                th.as_tensor(site_x, dtype=th.float32),
            ).numpy()
        zs_site = site_x[:, : len(self.columns)]
        z = np.where(self.absolute, out, zs_site + out).astype(np.float64)
        return np.clip(z, self.z_low, self.z_high)

    def logged_groups(
        self, steps: StepTable, layout: Layout
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The logged (episode, site, t) groups of a `StepTable` as this model's inputs.

        Returns:
            ``(who (N, .), did (N, .), codes (N,), site_x (G, .), zs_next (G, k))``: the inputs of
            `predict` and the logged next z of the model's columns (NaN where a group has no
            next tick).
        """
        p, s = len(layout.profile), len(layout.state)
        zp, zs = steps.x_client[:, :p], steps.x_client[:, p : p + s]
        t_rows = steps.frame["t"].to_numpy(np.int64)
        who, did = site_element_features(
            layout, zp, zs, steps.za, steps.y_client[:, : layout.n_outputs], steps.scenario, t_rows
        )
        codes = np.asarray(steps.site_group)
        n_groups = int(codes.max()) + 1 if len(codes) else 0
        zs_next = np.full((n_groups, len(self.columns)), np.nan)
        has = steps.has_next
        zs_next[codes[has]] = zs[steps.next_index[has]][:, self.columns]
        first = np.unique(codes, return_index=True)[1]
        lag0 = p + s + len(layout.action) + s
        site_x = self.site_inputs(
            zs[first][:, self.columns],
            steps.x_client[first, lag0 : lag0 + layout.n_lag],
            np.bincount(codes, minlength=n_groups).astype(np.float64),
            t_rows[first],
            layout.spec.step_seconds,
        )
        return who, did, codes, site_x, zs_next

    def _train(self, tensors: list[Any], trn: Any, val: Any, epochs: int, lr: float) -> np.ndarray:
        """Full-batch Adam on the training groups ``trn``; each column keeps its best epoch on the
        held-out groups ``val`` (on ``trn`` when there are none). Returns that best per-column
        mean squared error ``(k,)``."""
        import torch as th

        opt = th.optim.Adam(self.net.parameters(), lr=lr)
        sched = th.optim.lr_scheduler.CosineAnnealingLR(opt, epochs)
        # Every parameter belongs to one column (row j of each layer; rows j and k+j of the
        # context), so each column keeps its own best epoch on the held-out episodes.
        k = self.k
        column_of_row = {name: np.arange(len(v)) % k for name, v in self.net.state_dict().items()}
        best = np.full(k, np.inf)
        best_state = {name: v.detach().clone() for name, v in self.net.state_dict().items()}
        for _ in range(epochs):
            out = self._forward(*tensors[:4])
            err = (out - tensors[4]) ** 2
            loss = err[trn].mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            sched.step()
            score = (err[val] if bool(val.any()) else err[trn]).mean(0).detach().numpy()
            better = np.flatnonzero(score < best)
            if len(better):
                best[better] = score[better]
                for name, v in self.net.state_dict().items():
                    rows = np.isin(column_of_row[name], better)
                    best_state[name][rows] = v[rows].detach().clone()
        self.net.load_state_dict(best_state)
        return best

    def _take_columns(self, linear: SiteStateModel, columns: np.ndarray) -> None:
        """Give ``columns`` the parameters of ``linear`` (the same model without products; its
        product weights are zero here)."""
        if not len(columns):
            return
        state, theirs = self.net.state_dict(), linear.net.state_dict()
        for name, v in state.items():
            rows = np.isin(np.arange(len(v)) % self.k, columns)
            if name == "linear.weight":
                v[rows] = 0.0
                v[rows, : theirs[name].shape[1]] = theirs[name][rows]
            else:
                v[rows] = theirs[name][rows]
        self.net.load_state_dict(state)

    @classmethod
    def fit(
        cls,
        steps: StepTable,
        layout: Layout,
        seed: int = 0,
        epochs: int = 800,
        lr: float = 3e-3,
        columns: Sequence[str] | None = None,
        interactions: bool = True,
    ) -> SiteStateModel | None:
        """Fit on a `StepTable`; None when the log has no site-level state column (or no next tick).

        Args:
            columns: the site-level state columns to model (default: all of them).
            interactions: offer each column the pairwise products of actions and outputs (kept
                where they lower its held-out error); False: the form linear in each.
        """
        import torch as th

        if not layout.learn_transition or not any(layout.site_state) or steps.site_group is None:
            return None
        model = cls(layout, seed=seed, columns=columns, interactions=False)
        if not len(model.columns):
            return None
        who, did, codes, site_x, zs_next = model.logged_groups(steps, layout)
        zs_now = site_x[:, : len(model.columns)]
        target = np.where(model.absolute, zs_next, zs_next - zs_now).astype(np.float32)
        ok = np.isfinite(target).all(axis=1)
        if ok.sum() < 4:
            return None
        model.z_low, model.z_high = np.min(zs_next[ok], axis=0), np.max(zs_next[ok], axis=0)
        rng = np.random.default_rng(seed)
        ep_of_group = steps.episode[np.unique(codes, return_index=True)[1]]
        eps = np.unique(ep_of_group)
        held: np.ndarray | list[int] = (
            rng.choice(eps, size=max(1, int(round(0.15 * len(eps)))), replace=False) if len(eps) > 2 else []
        )
        val = ok & np.isin(ep_of_group, held)
        tensors = [th.as_tensor(v) for v in (who, did, codes, site_x, np.nan_to_num(target))]
        trn_t, val_t = th.as_tensor(ok & ~val), th.as_tensor(val)
        score = model._train(tensors, trn_t, val_t, epochs, lr)
        if interactions and val.any():
            # The products add ~(A+Y)²/2 weights per column; a column keeps them only where they
            # predict the held-out episodes better (without held-out episodes they are not offered:
            # on the training groups the larger form always wins).
            wider = cls(layout, seed=seed, columns=columns, interactions=True)
            wider.products = wider._train(tensors, trn_t, val_t, epochs, lr) < score
            wider._take_columns(model, np.flatnonzero(~wider.products))
            wider.z_low, wider.z_high = model.z_low, model.z_high
            model = wider
        if val.any():
            pred = model.predict(who, did, codes, site_x)[val]
            truth = zs_next[val]
            var = truth.var(0)
            # a column that hardly moves on the held-out episodes has no meaningful R²
            model.val_r2 = np.where(var > 1e-6, 1.0 - ((pred - truth) ** 2).mean(0) / np.maximum(var, 1e-12), np.nan)
        return model

    # --- persistence as data (no pickle: a twin directory is read by whoever is sent it) ---------
    def to_data(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """``(arrays, tensors)``: the model's numpy attributes and its torch parameters, each
        savable without pickle (npz and safetensors); `from_data` rebuilds the same model."""
        arrays = {
            "columns": np.asarray(self.columns, np.int64),
            "absolute": np.asarray(self.absolute, bool),
            "z_low": np.asarray(self.z_low, np.float64),
            "z_high": np.asarray(self.z_high, np.float64),
            "val_r2": np.asarray(self.val_r2, np.float64),
            "products": np.asarray(self.products, bool),
            "log_size_center": np.asarray(self.log_size_center, np.float64),
            "use_time": np.asarray(bool(self.use_time)),
            "interactions": np.asarray(bool(self.interactions)),
        }
        tensors = {k: v.detach().clone().contiguous() for k, v in self.net.state_dict().items()}
        return arrays, tensors

    @classmethod
    def from_data(cls, arrays: dict[str, np.ndarray], tensors: dict[str, Any]) -> SiteStateModel:
        """The model `to_data` described; the layers' sizes come from the tensors' shapes.

        Raises:
            KeyError, ValueError, RuntimeError: an array or tensor is missing or misshapen.
        """
        import torch as th

        m = cls.__new__(cls)
        m.columns = np.asarray(arrays["columns"], np.int64)
        m.absolute = np.asarray(arrays["absolute"], bool)
        m.z_low = np.asarray(arrays["z_low"], np.float64)
        m.z_high = np.asarray(arrays["z_high"], np.float64)
        m.val_r2 = np.asarray(arrays["val_r2"], np.float64)
        m.products = np.asarray(arrays["products"], bool)
        m.log_size_center = float(arrays["log_size_center"])
        m.use_time = bool(arrays["use_time"])
        m.interactions = bool(arrays["interactions"])
        k_mag, n_who = tensors["magnitude.weight"].shape
        k_lin, m.n_did = tensors["linear.weight"].shape
        k2, n_ctx = tensors["context.weight"].shape
        m.k = int(k_mag)
        if not (k_lin == m.k and k2 == 2 * m.k and len(m.columns) == m.k):
            raise ValueError("site-state model tensors disagree on the number of columns")
        m.net = th.nn.ModuleDict(
            {
                "magnitude": th.nn.Linear(n_who, m.k),
                "linear": th.nn.Linear(m.n_did, m.k, bias=False),
                "context": th.nn.Linear(n_ctx, 2 * m.k),
            }
        )
        m.net.load_state_dict(tensors, strict=True)
        return m
