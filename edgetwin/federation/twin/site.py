"""One site's side of a federated twin fit (`SiteFitter`): answers each phase's task from its own
rows only, with an aggregate over at least ``min_agents`` agents or a model update (what leaves a
site: docs/federation.md)."""

from __future__ import annotations

import logging
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
from scipy.special import logsumexp

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import TwinSpec
from edgetwin.federation.twin.agents import released_rows
from edgetwin.federation.twin.clusters import agent_clusters, component_logpdf
from edgetwin.federation.twin.columns import (
    column_means,
    first_rows,
    heavy_low,
    log1p_pos,
    profile_marginal,
    profile_y,
)
from edgetwin.federation.twin.mail import mail_config
from edgetwin.federation.twin.plan import (
    MAX_LEN,
    MIN_AGENTS,
    ROLES,
    SUPPORT_FOLDS,
    SUPPORT_K,
    TooFewAgents,
    TwinFitPlan,
)
from edgetwin.generative.transform import ProfileTransformer
from edgetwin.imitation.layout import Layout
from edgetwin.imitation.mail import (
    GaussianModel,
    behaviour_clone,
    client_rows,
)
from edgetwin.imitation.steps import build_steps
from edgetwin.imitation.world import Composition
from edgetwin.twin.support import SupportIndex
from edgetwin.twin.twin import bootstrap_episodes


def _bootstrap(df: pd.DataFrame, member: int, members: int, seed: int, site: str) -> pd.DataFrame:
    """The member's bootstrap of this site's episodes (all of them when ``members == 1``), drawn
    as `Twin.fit` draws a member's (`bootstrap_episodes`), from a seed of its own per site."""
    if members == 1:
        return df
    episodes = df["episode"].unique()
    rng = np.random.default_rng([seed, member, zlib.crc32(site.encode())])
    return bootstrap_episodes(df, episodes, rng.choice(len(episodes), size=len(episodes), replace=True))


log_ = logging.getLogger("edgetwin.federation.twin")
#: the most rows a site measures its support thresholds on (a seeded subset above)
SUPPORT_SAMPLE = 20_000


class SiteFitter:
    """One site's side of the fit: answers each phase from its own rows only.

    Args:
        name: the site's name (also its client id).
        log: the site's validated log (never leaves this object).
        spec: the twin spec every site shares.
        min_agents: the site's privacy setting: every statistic it sends is an aggregate over at
            least this many distinct agents (`effective_agents`; rows of one agent are not
            independent); a log with fewer agents sends none (`TooFewAgents`), and the rows of a
            scenario over fewer are left out of every statistic, hello included (`released_rows`). Model updates
            (``weights``, ``adversarial``, ``population``) are gradients of models trained on the
            rows: what they reveal is bounded only by Gaussian DP (docs/federation.md).
    """

    def __init__(self, name: str, log: pd.DataFrame, spec: TwinSpec, min_agents: int = MIN_AGENTS) -> None:
        if min_agents < 1:
            raise InputError(f"min_agents must be at least 1, got {min_agents}", where="min_agents")
        self.name = name
        # only the rows of scenarios over >= min_agents agents ever enter a statistic (`released_rows`)
        released, self._withheld = released_rows(log, int(min_agents))
        if self._withheld:
            log_.info("site %s withholds scenario(s) %s: fewer than %d agents", name, self._withheld, min_agents)
        self.df = released.sort_values(["episode", "t", "agent"], kind="stable").reset_index(drop=True)
        self.spec = spec
        #: every statistic sent is an aggregate over at least this many (effective) agents
        self.min_agents = int(min_agents)
        self.plan: TwinFitPlan | None = None
        self._steps: dict[int, Any] = {}
        self._pols: dict[int, dict[str, Any]] = {}
        #: per member, each model's Adam state between rounds (`FitOptions.keep_optimizer`)
        self._optim: dict[int, dict[str, dict[str, Any]]] = {}
        self._codes: np.ndarray | None = None
        #: per scenario, the group of each (episode, agent) point in EM (fixed at the first EM round)
        self._em_groups: list[np.ndarray] | None = None
        self._gan: Any = None
        self._adv: dict[int, Any] = {}
        self._causal: dict[int, Any] = {}

    # --- hello ------------------------------------------------------------------------------
    def hello(self, policies: bool = False) -> tuple[np.ndarray, dict[str, Any]]:
        """Its row count and labels; with ``policies`` (a causal fit) also the ids of the policies
        it logged over at least ``min_agents`` agents (`twin.causal.site_policies`)."""
        labels: dict[str, Any] = {
            "scenarios": sorted(str(s) for s in self.df["scenario"].unique()),
            "site": str(self.name),
            "columns": [str(c) for c in self.df.columns],
        }
        if policies:
            from edgetwin.federation.twin.causal import site_policies

            labels["policies"] = site_policies(self.df, self.min_agents)
        return np.array([len(self.df)], np.float32), labels

    def set_plan(self, plan: TwinFitPlan) -> None:
        """Take the coordinator's plan; rows of a scenario the plan does not name (this site's hello
        was late, and no other site released it) are left out like a withheld scenario's: whole
        scenarios, so the totals stay sums of released cells."""
        self.plan = plan
        known = self.df["scenario"].astype(str).isin(plan.scenarios)
        if not known.all():
            self._withheld = sorted({*self._withheld, *self.df.loc[~known, "scenario"].astype(str).unique()})
            self.df = self.df[known].reset_index(drop=True)

    # --- statistics -------------------------------------------------------------------------
    def _role_values(self, role: str) -> np.ndarray:
        assert self.plan is not None
        return self.df[self.plan.cols[role]].to_numpy(np.float64)

    def _require_agents(self) -> None:
        """Refuse to send a statistic over fewer than ``min_agents`` agents (the sums of ``stats1``,
        ``stats2``, ``em`` and ``residual`` are over all the site's released agents)."""
        if self.df["agent"].nunique() < self.min_agents:
            withheld = f" (scenario(s) {', '.join(self._withheld)} withheld: each under that many)" if self._withheld else ""
            raise TooFewAgents(f"site {self.name!r} has fewer than {self.min_agents} agents{withheld}")

    def stats1(self) -> np.ndarray:
        plan = self.plan
        assert plan is not None
        self._require_agents()
        df = self.df
        parts: dict[str, Any] = {}
        for r in ROLES:
            x = self._role_values(r)
            ok = np.isfinite(x)
            xs = np.where(ok, x, 0.0)
            parts[f"{r}.n"] = ok.sum(axis=0)
            parts[f"{r}.sum"] = xs.sum(axis=0)
            parts[f"{r}.lsum"] = np.where(ok, log1p_pos(xs), 0.0).sum(axis=0)
            parts[f"{r}.nonneg"] = (ok & (xs >= 0.0)).sum(axis=0)
        sizes = df.groupby(["episode", "t", "site"], sort=False).size().to_numpy()
        parts["groups.n"] = [len(sizes)]
        parts["groups.logsize"] = [np.log1p(sizes).sum()]
        lengths = df.groupby("episode", sort=False)["t"].max().to_numpy() + 1
        parts["lengths"] = np.bincount(np.clip(lengths, 1, MAX_LEN) - 1, minlength=MAX_LEN)
        parts["sites"] = [1.0]
        # local structure, voted on by the sites (a property of the logs, not of a row)
        local = Layout.fit(df, self.spec, use_time=True)
        S, Y = plan.width("state"), plan.width("outputs")
        multi = bool((df.groupby(["episode", "site", "t"], sort=False).size() > 1).any())
        parts["votes.multi"] = [float(multi)]
        parts["votes.site_state"] = np.asarray(local.site_state, float) if multi else np.zeros(S)
        parts["votes.clock_n"] = np.array([c is not None for c in local.clock], float)
        parts["votes.clock_step"] = np.array([0.0 if c is None else c for c in local.clock], float)
        echo = np.zeros((S, max(Y, 1)))
        for j, k in enumerate(local.echo):
            if k is not None:
                echo[j, k] = 1.0
        parts["votes.echo"] = echo
        parts["votes.absolute"] = np.asarray(local.state_absolute, float)
        first = first_rows(df)
        pos = {s: i for i, s in enumerate(plan.scenarios)}
        sc = first["scenario"].astype(str).map(pos).to_numpy()
        parts["agents.scen"] = np.bincount(sc, minlength=plan.n_scen)
        parts["rows.scen"] = np.bincount(df["scenario"].astype(str).map(pos).to_numpy(), minlength=plan.n_scen)
        prof = first[plan.cols["profile"]].to_numpy(np.float64)
        lows = np.array([heavy_low(self.spec, c) for c in plan.cols["profile"]])
        above = prof - lows > 0
        parts["prof.sum"] = prof.sum(axis=0)
        parts["prof.above_n"] = above.sum(axis=0)
        parts["prof.above_sum"] = np.where(above, prof - lows, 0.0).sum(axis=0)
        return plan.pack("stats1", parts)

    def stats2(self, context: Mapping[str, Any]) -> np.ndarray:
        plan = self.plan
        assert plan is not None
        self._require_agents()
        parts: dict[str, Any] = {}
        for r in ROLES:
            x = self._role_values(r)
            ok = np.isfinite(x)
            mean = np.asarray(context["mean"][r])
            logc = np.asarray(context["log"][r], bool)
            lmean = np.asarray(context["lmean"][r])
            v = np.where(logc, log1p_pos(np.where(ok, x, 0.0)) - lmean, np.where(ok, x, 0.0) - mean)
            parts[f"{r}.ss"] = np.where(ok, v * v, 0.0).sum(axis=0)
        prof = first_rows(self.df)[plan.cols["profile"]].to_numpy(np.float64)
        y = profile_y(self.spec, plan.cols["profile"], prof, context)
        parts["prof.yc"] = y.sum(axis=0)
        parts["prof.yss"] = (y * y).sum(axis=0)
        return plan.pack("stats2", parts)

    # --- centroids and units ------------------------------------------------------------------
    def _population_rows(self, transformer: ProfileTransformer) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(codes ++ z(initial state)) (N, D)`` of each (episode, agent)'s first row, its scenario
        ids and its agents."""
        plan = self.plan
        assert plan is not None and plan.layout is not None
        first = first_rows(self.df)
        codes = transformer.transform_codes(first[plan.cols["profile"]].reset_index(drop=True))
        zs = plan.layout.scalers["state"].transform(first[plan.cols["state"]].to_numpy(np.float64))
        pos = {s: i for i, s in enumerate(plan.scenarios)}
        return (np.concatenate([codes, zs], axis=1), first["scenario"].astype(str).map(pos).to_numpy(),
                first["agent"].astype(str).to_numpy())

    def summary(self, transformer: ProfileTransformer) -> np.ndarray:
        """Centroids of the population space and of the support space, each a mean over at least
        ``min_agents`` effective agents (`agent_clusters`), the support thresholds measured on
        unseen episodes (`support_thresholds`) and the site's unit composition (site-level)."""
        plan = self.plan
        assert plan is not None and plan.layout is not None
        self._require_agents()
        lay, o = plan.layout, plan.options
        K, D = o.n_components, plan.d_pop
        x, sc, agents = self._population_rows(transformer)
        self._codes = x
        pop_c, pop_n = np.zeros((plan.n_scen, K, D)), np.zeros((plan.n_scen, K))
        for s in range(plan.n_scen):
            rows = sc == s
            n_agents = len(np.unique(agents[rows]))
            k = min(K, n_agents // self.min_agents)
            if k < 1:
                continue
            c, n, _ = agent_clusters(x[rows], agents[rows], k, self.min_agents, o.seed + s)
            pop_c[s, : len(c)], pop_n[s, : len(c)] = c, n
        z, agent_of, episode_of = self._support_rows()
        Ks = o.support_centroids
        sup_c, sup_n = np.zeros((Ks, plan.d_support)), np.zeros(Ks)
        c, n, _ = agent_clusters(z, agent_of, Ks, self.min_agents, o.seed)  # over all rows: Σ n = the row count
        sup_c[: len(c)], sup_n[: len(c)] = c, n
        sample = self._support_sample(len(z))
        q = self.support_thresholds(z[sample], agent_of[sample], episode_of[sample]) if len(c) else (0.0, 0.0)
        unit = Composition.fit(self.df, lay)
        return plan.pack("summary", {
            "pop.c": pop_c, "pop.n": pop_n, "support.c": sup_c, "support.n": sup_n, "support.q": list(q),
            "unit.counts": unit.units.mean(axis=0),
            "unit.profile": column_means(unit.unit_profile, plan.width("profile")),
            "unit.state": column_means(unit.unit_state, plan.width("state")),
        })

    def _support_sample(self, n: int) -> np.ndarray:
        """Indices of the rows the support thresholds are measured on: all ``n``, or a seeded
        subset of `SUPPORT_SAMPLE` (the thresholds' folds cluster and measure distances again).
        The support centroids are over all rows: centroids over a subset, beside the totals over
        all rows, would release the complement's sums (docs/federation.md, D7)."""
        assert self.plan is not None
        if n <= SUPPORT_SAMPLE:
            return np.arange(n)
        rng = np.random.default_rng([self.plan.options.seed, zlib.crc32(self.name.encode())])
        return np.sort(rng.choice(n, SUPPORT_SAMPLE, replace=False))

    def _support_rows(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``[context, action] (N, Dsup)`` of the site's rows, with each row's agent and episode."""
        plan = self.plan
        assert plan is not None and plan.layout is not None
        steps = build_steps(self.df, plan.layout)
        z = np.concatenate([steps.x_engine, steps.za], axis=1).astype(np.float64)
        frame = steps.frame
        agent_of = frame["agent"].astype(str).to_numpy()
        episode_of = frame["episode"].astype(str).to_numpy()
        return z, agent_of, episode_of

    def support_thresholds(self, z: np.ndarray, agent_of: np.ndarray, episode_of: np.ndarray,
                           quantile: float = 0.99) -> tuple[float, float]:
        """``(context, action)`` thresholds of the federated support index, measured as the
        centralised index measures its own (`SupportIndex.fit`): the ``quantile`` of the distances
        from rows of episodes the bank did not see to a bank built like the one sent (centroids
        over ``min_agents`` agents) from the other episodes — the context's distance to the nearest
        centroid, the action's to the actions of its `SUPPORT_K` nearest. Episodes are grouped
        into at most `SUPPORT_FOLDS` folds; a site with one episode folds by agent instead."""
        plan = self.plan
        assert plan is not None
        o, A = plan.options, plan.width("action")
        groups = episode_of if len(np.unique(episode_of)) >= 2 else agent_of
        codes, uniq = pd.factorize(groups)
        folds = codes % min(SUPPORT_FOLDS, len(uniq))
        d_ctx, d_act = [], []
        for f in np.unique(folds):
            held = folds == f
            c, _, _ = agent_clusters(z[~held], agent_of[~held], o.support_centroids, self.min_agents, o.seed + 1 + int(f))
            if not len(c):
                continue
            idx = SupportIndex(bank=c.astype(np.float32), threshold=1.0, n_action=A, k=SUPPORT_K)
            dc, da = idx._distances(idx.bank, z[held])
            d_ctx.append(dc)
            d_act.append(da)
        if not d_ctx:
            return 0.0, 0.0
        return float(np.quantile(np.concatenate(d_ctx), quantile)), float(np.quantile(np.concatenate(d_act), quantile))

    def em(self, params: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]], transformer: ProfileTransformer) -> np.ndarray:
        """EM sufficient statistics of the population mixture over this site's *groups* of agents.

        Agents are partitioned once per scenario into groups of at least ``min_agents`` effective
        agents (`agent_clusters`, as many as the count allows); each group's responsibilities are
        those of its mean (its expected log-likelihood under each component: the Gaussian at its
        mean less half the trace of the component's precision times the group's covariance), and
        its count, sum and sum of outer products go into the statistics whole. So whatever the
        coordinator does with the statistics of several iterations, differences included, it can
        isolate at most one group's moments: with one responsibility per row, an agent that
        changed component between two iterations was the difference of their sums (a curious
        coordinator recovered an agent's profile that way).
        """
        plan = self.plan
        assert plan is not None
        K, D = plan.options.n_components, plan.d_pop
        self._require_agents()
        x, sc, agents = self._population_rows(transformer)
        self._codes = x
        if self._em_groups is None:
            self._em_groups = []
            for s in range(plan.n_scen):
                rows = sc == s
                k = len(np.unique(agents[rows])) // self.min_agents
                lab = (agent_clusters(x[rows], agents[rows], k, self.min_agents, plan.options.seed + 31 + s)[2]
                       if k >= 1 else np.full(int(rows.sum()), -1))
                self._em_groups.append(lab)
        en, ex, exx, ll = np.zeros((plan.n_scen, K)), np.zeros((plan.n_scen, K, D)), np.zeros((plan.n_scen, K, D, D)), 0.0
        for s, (w, mu, chol) in enumerate(params):
            xs, lab = x[sc == s], self._em_groups[s]
            prec = [np.linalg.inv(c @ c.T) for c in chol]
            for g in np.unique(lab[lab >= 0]):
                xg = xs[lab == g]
                n, tot, outer = float(len(xg)), xg.sum(axis=0), xg.T @ xg
                mean = tot / n
                cov = outer / n - np.outer(mean, mean)
                lp = component_logpdf(mean[None, :], w, mu, chol)[0] - 0.5 * np.array([np.trace(p @ cov) for p in prec])
                r = np.exp(lp - logsumexp(lp))
                ll += n * float(logsumexp(lp))
                en[s] += r * n
                ex[s] += r[:, None] * tot[None, :]
                exx[s] += r[:, None, None] * outer[None, :, :]
        return plan.pack("em", {"em.n": en, "em.x": ex, "em.xx": exx, "em.ll": [ll]})

    # --- models ---------------------------------------------------------------------------------
    def _member_steps(self, member: int) -> Any:
        plan = self.plan
        assert plan is not None and plan.layout is not None
        if member not in self._steps:
            sub = _bootstrap(self.df, member, plan.options.members, plan.options.seed, self.name)
            self._steps = {member: build_steps(sub, plan.layout)}  # one member at a time in memory
        return self._steps[member]

    def weights(self, member: int, step: int, global_vector: np.ndarray) -> tuple[np.ndarray, float]:
        """Local behaviour-cloning epochs from the global models: ``(delta ++ block weights, rows)``.

        Each scenario's block of the delta is scaled by this site's share of its own rows of that
        scenario, and the shares are appended: FedAvg's sample-weighted mean of the blocks, divided
        by the mean of the shares, is then the per-scenario FedAvg (a site without rows of a
        scenario does not pull its models towards where they started).
        """
        plan = self.plan
        assert plan is not None and plan.layout is not None
        lay, o = plan.layout, plan.options
        steps = self._member_steps(member)
        if member not in self._pols:
            self._pols = {member: plan.new_policies(member)}
        pols = self._pols[member]
        global_vector = np.asarray(global_vector, np.float32)[: plan.policy_size]
        plan.load_policy_vector(pols, global_vector)
        n_rows = np.zeros(plan.n_scen)
        if member not in self._optim:
            self._optim = {member: {}}

        def opt(name: str) -> dict[str, Any] | None:
            return self._optim[member].setdefault(name, {}) if o.keep_optimizer else None

        for s in range(plan.n_scen):
            seed = o.seed * 1000 + member * 97 + step * 7 + s + zlib.crc32(self.name.encode()) % 10_000
            rows = steps.rows(s)
            if len(rows):
                behaviour_clone(steps.x_engine[rows], steps.za[rows], pols[f"engine{s}"], o.local_epochs, seed,
                                max_steps=o.local_steps or None, optimizer_state=opt(f"engine{s}"))
            crow = client_rows(steps, lay, s)
            if len(crow):
                behaviour_clone(steps.x_client[crow], steps.y_client[crow], pols[f"client{s}"], o.local_epochs,
                                seed + 50, max_steps=o.local_steps or None, optimizer_state=opt(f"client{s}"))
            n_rows[s] = len(crow)
        delta = plan.policy_vector(pols).astype(np.float64) - np.asarray(global_vector, np.float64)
        total = max(float(n_rows.sum()), 1.0)
        share = n_rows / total
        for s, sl in plan.block_slices():
            delta[sl] *= share[s]
        return np.concatenate([delta, share]).astype(np.float32), total

    def residual(self, member: int, global_vector: np.ndarray) -> np.ndarray:
        plan = self.plan
        assert plan is not None and plan.layout is not None
        self._require_agents()
        lay = plan.layout
        steps = self._member_steps(member)
        pols = plan.new_policies(member)
        plan.load_policy_vector(pols, np.asarray(global_vector, np.float32)[: plan.policy_size])
        from edgetwin.federation.twin.noise import N_BINS, binned_residual_sums

        parts = {"client.ss": np.zeros((plan.n_scen, lay.n_model_outputs)), "client.n": np.zeros(plan.n_scen),
                 "engine.ss": np.zeros((plan.n_scen, plan.width("action"))), "engine.n": np.zeros(plan.n_scen),
                 **{f"client.bin_{k}": np.zeros((plan.n_scen, lay.n_model_outputs, N_BINS))
                    for k in ("n", "s1", "ss", "smu")}}
        for s in range(plan.n_scen):
            rows = steps.rows(s)
            if len(rows):
                mu = GaussianModel(pols[f"engine{s}"]).mean(steps.x_engine[rows])
                parts["engine.ss"][s] = ((steps.za[rows] - mu) ** 2).sum(axis=0)
                parts["engine.n"][s] = len(rows)
            crow = client_rows(steps, lay, s)
            if len(crow):
                y = np.clip(steps.y_client[crow], -10.0, 10.0)
                mu = GaussianModel(pols[f"client{s}"]).mean(steps.x_client[crow])
                parts["client.ss"][s] = ((y - mu) ** 2).sum(axis=0)
                parts["client.n"][s] = len(crow)
                for k, v in binned_residual_sums(mu, y).items():
                    parts[f"client.bin_{k}"][s] = v
        return plan.pack("residual", parts)

    # --- the causal response model (`edgetwin.federation.twin.causal`) ------------------------
    def _site_causal(self, member: int) -> Any:
        from edgetwin.federation.twin.causal import SiteCausal

        plan = self.plan
        assert plan is not None and plan.layout is not None
        self._require_agents()
        if member not in self._causal:
            self._causal = {member: SiteCausal(self._member_steps(member), plan.layout, plan.policies, self.min_agents,
                                               plan.options.to_dict(), member)}
        return self._causal[member]

    def causal_sums(self, member: int, params: np.ndarray) -> np.ndarray:
        """Per scenario and policy: the count, Σr and Σr² of its rows' residuals at ``params``."""
        return self._site_causal(member).sums(np.asarray(params, np.float32))  # type: ignore[no-any-return]

    def causal_grad(self, member: int, params: np.ndarray) -> np.ndarray:
        """``params`` = the models' weights ++ ``∂L/∂S``: the gradient of this site's share of the loss."""
        plan = self.plan
        assert plan is not None
        k = plan.size("causal_grad")
        p = np.asarray(params, np.float32)
        return self._site_causal(member).gradient(p[:k], p[k:])  # type: ignore[no-any-return]

    # --- the default family: GAN-SMMSG population, MAIL's adversarial rounds ------------------
    def population(self, step: int, global_vector: np.ndarray, transformer: ProfileTransformer,
                   gmm: Sequence[tuple[np.ndarray, np.ndarray, np.ndarray]]) -> tuple[np.ndarray, float]:
        """One round of the population game on this site's agents (`twin.gan.SiteGan`)."""
        from edgetwin.federation.twin.gan import SiteGan, federated_gan

        plan = self.plan
        assert plan is not None
        if self._gan is None:
            pop = federated_gan(self.spec, plan.scenarios, np.ones(plan.n_scen) / plan.n_scen, transformer,
                                profile_marginal(gmm, plan.width("profile")), plan.options.to_dict())
            self._gan = SiteGan(self.name, self.df, pop, plan.options.to_dict())
        delta, n, _ = self._gan.round(step, global_vector)
        return delta, n

    def adversarial(self, member: int, step: int, params: np.ndarray) -> tuple[np.ndarray, float]:
        """One of MAIL's adversarial rounds on this site's rows (`twin.mail.SiteAdversarial`).

        ``params``: the global client policies and discriminators (`TwinAssembler.adversarial_vector`,
        shares slot included), then the member's engine policies."""
        from edgetwin.federation.twin.mail import (
            SiteAdversarial,
            engine_modules,
            load_module_vector,
        )

        plan = self.plan
        assert plan is not None and plan.layout is not None
        size = plan.size("adversarial")
        if member not in self._adv:
            engines = {s: p for s, p in plan.new_policies(member).items() if s.startswith("engine")}
            mods = engine_modules({int(k.removeprefix("engine")): v for k, v in engines.items()})
            load_module_vector(mods, np.asarray(params, np.float32)[size:])
            seed = plan.options.seed * 1000 + member * 97 + 500
            self._adv = {member: SiteAdversarial(self.name, self._member_steps(member), self.df, self.spec, plan.layout,
                                                 mail_config(plan.options.to_dict()),
                                                 {int(k.removeprefix("engine")): v for k, v in engines.items()}, seed)}
        v, n, _ = self._adv[member].round(np.asarray(params, np.float32)[: size - plan.n_scen])
        return v, n
