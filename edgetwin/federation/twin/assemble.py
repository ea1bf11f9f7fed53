"""The coordinator's side of a federated twin fit (`TwinAssembler`): turns the phases' aggregated
vectors into the layout, the population, the support index and, finally, an ordinary `Twin`; it
holds no row of any site. Also the per-scenario FedAvg of the model blocks (`apply_blocks`) and
the context encodings the sites decode (`transformer_from_dict`, `gmm_from_context`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch as th

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import REWARD_COLUMN, TwinSpec
from edgetwin.federation.twin.clusters import kmeans
from edgetwin.federation.twin.columns import (
    heavy_low,
    profile_marginal,
)
from edgetwin.federation.twin.mail import mail_config
from edgetwin.federation.twin.plan import (
    ROLES,
    SUPPORT_K,
    FitOptions,
    TwinFitPlan,
)
from edgetwin.generative.gmm import GMMPopulation
from edgetwin.generative.transform import ColumnCodec, ProfileTransformer
from edgetwin.imitation.layout import ColumnScaler, Layout
from edgetwin.imitation.mail import (
    MIN_STD,
    MailConfig,
)
from edgetwin.imitation.world import Composition, InitialStates
from edgetwin.twin.member import Member
from edgetwin.twin.support import SupportIndex
from edgetwin.twin.twin import FORMAT_VERSION, Twin, library_versions


class TwinAssembler:
    """The coordinator's side: turns aggregated statistics into the layout, the population, the
    support and, finally, a `Twin`. Holds no row of any site."""

    def __init__(self, spec: TwinSpec, options: FitOptions) -> None:
        self.spec = spec
        self.options = options
        self.plan: TwinFitPlan | None = None
        self.site_names: list[str] = []
        self.s1: dict[str, np.ndarray] = {}
        self.ctx2: dict[str, Any] = {}
        self.transformer: ProfileTransformer | None = None
        self.gmm: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self.support: SupportIndex | None = None
        self.units: list[np.ndarray] = []
        self.unit_profile: list[np.ndarray] = []
        self.unit_state: list[np.ndarray] = []
        self.members: list[Member] = []
        self.history: list[dict[str, Any]] = []
        self.gan: Any = None

    def hello(self, labels: Mapping[str, Mapping[str, Any]]) -> TwinFitPlan:
        """The plan, from every site's labels (scenarios: the union; columns: the intersection)."""
        if not labels:
            raise InputError("no site answered the hello", where="federated fit")
        scen = sorted({s for lab in labels.values() for s in lab["scenarios"]})
        cols = set.intersection(*(set(lab["columns"]) for lab in labels.values()))
        self.site_names = sorted(str(lab["site"]) for lab in labels.values())
        self.plan = TwinFitPlan(self.spec, scen, sorted(cols), REWARD_COLUMN in cols, self.options)
        if self.options.response_model == "causal":
            self.plan.policies = sorted({str(p) for lab in labels.values() for p in lab.get("policies", [])})
            if not self.plan.policies:
                raise InputError("no site logged any policy over at least its min_agents agents: nothing to fit a "
                                 "causal response model on", where="--response-model")
        return self.plan

    def context1(self, total: np.ndarray) -> dict[str, Any]:
        """After ``stats1``: pooled means and the log flags (the context of ``stats2``)."""
        plan = self.plan
        assert plan is not None
        s1 = plan.unpack("stats1", total)
        self.s1 = s1
        mean, lmean, logf = {}, {}, {}
        for r in ROLES:
            n = np.maximum(s1[f"{r}.n"], 1.0)
            feats = [self.spec.feature(c) if c != REWARD_COLUMN else None for c in plan.cols[r]]
            logf[r] = [bool(f is not None and f.kind == "heavy_tailed" and s1[f"{r}.nonneg"][j] >= s1[f"{r}.n"][j])
                       for j, f in enumerate(feats)]
            mean[r] = (s1[f"{r}.sum"] / n).tolist()
            lmean[r] = (s1[f"{r}.lsum"] / n).tolist()
        agents = max(float(s1["agents.scen"].sum()), 1.0)
        lows = [heavy_low(self.spec, c) for c in plan.cols["profile"]]
        offs = [0.01 * float(s1["prof.above_sum"][j] / s1["prof.above_n"][j]) if s1["prof.above_n"][j] > 0 else 1.0
                for j in range(plan.width("profile"))]
        pmean = s1["prof.sum"] / agents
        from edgetwin.contract.metrics import log_space

        centre = [float(log_space(np.array([pmean[j]]), lows[j], offs[j])[0])
                  if self.spec.feature(c).kind == "heavy_tailed" and self.spec.feature(c).allowed_values() is None
                  else float(pmean[j]) for j, c in enumerate(plan.cols["profile"])]
        self.ctx2 = {"mean": mean, "lmean": lmean, "log": logf, "prof_low": lows, "prof_offset": offs,
                     "prof_c": centre}
        return self.ctx2

    def layout2(self, total: np.ndarray) -> dict[str, Any]:
        """After ``stats2``: the layout and the population encoding (the context of ``summary``)."""
        plan = self.plan
        assert plan is not None
        s1, s2, c2 = self.s1, plan.unpack("stats2", total), self.ctx2
        scalers = {}
        for r in ROLES:
            n = np.maximum(s1[f"{r}.n"], 1.0)
            logf = np.asarray(c2["log"][r], bool)
            mean = np.where(logf, c2["lmean"][r], c2["mean"][r])
            std = np.sqrt(s2[f"{r}.ss"] / n)
            std = np.where(np.isfinite(std) & (std > 1e-8), std, 1.0)
            feats = [self.spec.feature(c) if c != REWARD_COLUMN else None for c in plan.cols[r]]
            base = ColumnScaler.fit(pd.DataFrame({c: [0.0] for c in plan.cols[r]}), feats)
            scalers[r] = ColumnScaler(list(plan.cols[r]), logf, mean, std, base.low, base.high, base.values)
        sites = max(float(s1["sites"][0]), 1.0)
        S = plan.width("state")
        scoped = {f.name for f in self.spec.features if f.scope == "site"}
        declared_names = set(self.spec.declared_columns)
        multi = float(s1["votes.multi"][0])
        site_state = [bool(multi > 0 and s1["votes.site_state"][j] >= multi) or c in scoped
                      for j, c in enumerate(plan.cols["state"])]
        declared = [c in declared_names for c in plan.cols["state"]]
        clock = [None if declared[j] or s1["votes.clock_n"][j] < sites else float(s1["votes.clock_step"][j] / sites)
                 for j in range(S)]
        echo: list[int | None] = []
        for j in range(S):
            k = int(np.argmax(s1["votes.echo"][j])) if S else 0
            echo.append(k if not declared[j] and s1["votes.echo"][j, k] >= sites else None)
        lengths = s1["lengths"]
        cum = np.cumsum(lengths)
        horizon = int(np.searchsorted(cum, cum[-1] / 2.0) + 1) if cum[-1] > 0 else 1
        spec = self.spec
        layout = Layout(
            spec=spec,
            profile=list(plan.cols["profile"]),
            state=list(plan.cols["state"]),
            action=list(plan.cols["action"]),
            response=[c for c in spec.names("response") if c in plan.cols["outputs"]],
            kpi=[c for c in spec.names("kpi") if c in plan.cols["outputs"]],
            predict_reward=plan.has_reward,
            learn_transition=spec.transition is None and bool(plan.cols["state"]),
            scenarios=list(plan.scenarios),
            scalers=scalers,
            log_size_center=float(s1["groups.logsize"][0] / max(s1["groups.n"][0], 1.0)),
            use_time=True,
            horizon=horizon,
            site_state=site_state,
            state_absolute=[bool(s1["votes.absolute"][j] * 2 >= sites) for j in range(S)],
            site_profile=True,
            clock=clock,
            echo=echo,
            declared=declared,
            # pooled mean +- 4 sd: a min/max would be one site's single logged value
            input_range=[(-4.0, 4.0)] * S,
            site_profile_columns=[c in scoped for c in plan.cols["profile"]],
        )
        plan.layout = layout
        # the population encoding ("standard" transform) from the pooled profile moments
        agents = max(float(s1["agents.scen"].sum()), 1.0)
        tr = ProfileTransformer(spec, method="standard")
        for j, c in enumerate(plan.cols["profile"]):
            f = spec.feature(c)
            mean = float(c2["prof_c"][j] + s2["prof.yc"][j] / agents)
            var = float(s2["prof.yss"][j] / agents - (s2["prof.yc"][j] / agents) ** 2)
            sd = float(np.sqrt(var)) if var > 1e-16 else 1.0
            allowed = f.allowed_values()
            if allowed is not None:
                vals = np.asarray(sorted(allowed), dtype=np.float64)
                tr.codecs.append(ColumnCodec(f, width=len(vals), values=vals, mean=mean, std=sd))
            else:
                tr.codecs.append(ColumnCodec(f, width=1, mean=mean, std=sd, low=float(c2["prof_low"][j]),
                                             offset=float(c2["prof_offset"][j])))
        self.transformer = tr
        return {"layout": layout.to_dict(), "transformer": _transformer_dict(tr)}

    def summaries(self, per_site: Mapping[str, np.ndarray]) -> None:
        """After ``summary``: mixture initialisation, the support index, the site units."""
        plan = self.plan
        assert plan is not None
        K, D = self.options.n_components, plan.d_pop
        # by site name: the centroids' order seeds k-means, so it must not be the order they arrived in
        parts = {k: plan.unpack("summary", per_site[k]) for k in sorted(per_site)}
        self.gmm = []
        for s in range(plan.n_scen):
            c = np.concatenate([p["pop.c"][s] for p in parts.values()])
            n = np.concatenate([p["pop.n"][s] for p in parts.values()])
            keep = n > 0
            c, n = c[keep], n[keep]
            if len(c) == 0:
                c, n = np.zeros((1, D)), np.ones(1)
            if len(c) > K:
                mu, _ = kmeans(c, K, self.options.seed + s, weights=n)
            else:
                mu = c
            k = len(mu)
            w = np.full(k, 1.0 / k)
            chol = np.repeat(np.eye(D)[None] * 0.5, k, axis=0)
            if k < K:  # pad: a component with no weight
                mu = np.concatenate([mu, np.zeros((K - k, D))])
                w = np.concatenate([w, np.full(K - k, 1e-12)])
                w = w / w.sum()
                chol = np.concatenate([chol, np.repeat(np.eye(D)[None], K - k, axis=0)])
            self.gmm.append((w, mu, chol))
        # the bank: the sites' centroids (each a mean over >= min_agents agents of that site), no
        # logged row; the thresholds: the sites' held-out-episode quantiles, weighted by rows
        bank = np.concatenate([p["support.c"][p["support.n"] > 0] for p in parts.values()]).astype(np.float32)
        ns = np.array([p["support.n"].sum() for p in parts.values()])
        qs = np.array([p["support.q"] for p in parts.values()]).reshape(len(parts), 2)
        thr = (ns[:, None] * qs).sum(axis=0) / ns.sum() if ns.sum() > 0 else np.full(2, np.inf)
        self.support = SupportIndex(bank=bank, threshold=float(thr[0]), n_action=plan.width("action"),
                                    action_threshold=float(thr[1]), k=SUPPORT_K)
        names = sorted(parts)
        self.unit_names = names
        self.units = [parts[k]["unit.counts"] for k in names]
        self.unit_profile = [parts[k]["unit.profile"] for k in names]
        self.unit_state = [parts[k]["unit.state"] for k in names]

    def em_step(self, total: np.ndarray, reg: float = 1e-3) -> float:
        """One M-step from pooled sufficient statistics; returns the mean log-likelihood per agent."""
        plan = self.plan
        assert plan is not None
        st = plan.unpack("em", total)
        D = plan.d_pop
        new = []
        for s, (_w0, mu0, chol0) in enumerate(self.gmm):
            nk = st["em.n"][s]
            w = nk / max(nk.sum(), 1e-12)
            mu, chol = mu0.copy(), chol0.copy()
            for k in range(len(nk)):
                if nk[k] < 1e-3:
                    continue
                mu[k] = st["em.x"][s, k] / nk[k]
                cov = st["em.xx"][s, k] / nk[k] - np.outer(mu[k], mu[k]) + reg * np.eye(D)
                cov = 0.5 * (cov + cov.T)
                try:
                    chol[k] = np.linalg.cholesky(cov)
                except np.linalg.LinAlgError:
                    chol[k] = np.linalg.cholesky(np.diag(np.maximum(np.diag(cov), reg)))
            w = np.maximum(w, 1e-12)
            new.append((w / w.sum(), mu, chol))
        self.gmm = new
        return float(st["em.ll"][0] / max(float(self.s1["agents.scen"].sum()), 1.0))

    def gmm_context(self) -> dict[str, Any]:
        return {"gmm": [[w.tolist(), mu.tolist(), chol.tolist()] for w, mu, chol in self.gmm]}

    def initial_vector(self, member: int) -> np.ndarray:
        plan = self.plan
        assert plan is not None
        return np.concatenate([plan.policy_vector(plan.new_policies(member)), np.zeros(plan.n_scen, np.float32)])

    def apply_weights(self, params: np.ndarray, aggregated_delta_mean: np.ndarray) -> np.ndarray:
        """Per-scenario FedAvg from the sample-weighted mean of the scaled deltas (see `SiteFitter.weights`)."""
        plan = self.plan
        assert plan is not None
        return apply_blocks(params, aggregated_delta_mean, plan.block_slices(), plan.n_scen)

    # --- the default family ------------------------------------------------------------------
    def build_population(self) -> Any:
        """The federated GAN-SMMSG before its rounds (after ``em``): `twin.gan.federated_gan`."""
        from edgetwin.federation.twin.gan import federated_gan, gan_size

        plan = self.plan
        assert plan is not None and self.transformer is not None
        props = self.s1["agents.scen"] / max(float(self.s1["agents.scen"].sum()), 1.0)
        self.gan = federated_gan(self.spec, plan.scenarios, props, self.transformer,
                                 profile_marginal(self.gmm, plan.width("profile")), self.options.to_dict())
        plan.population_size = gan_size(self.gan)
        return self.gan

    def population_vector(self) -> np.ndarray:
        from edgetwin.federation.twin.gan import gan_modules
        from edgetwin.federation.twin.mail import module_vector

        return module_vector(gan_modules(self.gan))

    def set_population(self, params: np.ndarray, rounds: list[dict[str, Any]]) -> None:
        from edgetwin.federation.twin.gan import gan_modules
        from edgetwin.federation.twin.mail import load_module_vector

        load_module_vector(gan_modules(self.gan), params)
        self.gan.history = rounds

    def _adversarial_modules(self, member: int) -> dict[str, Any]:
        from edgetwin.federation.twin.mail import adversarial_templates, mail_config

        plan = self.plan
        assert plan is not None and plan.layout is not None
        mods = adversarial_templates(plan.layout, mail_config(self.options.to_dict()),
                                     self.options.seed * 1000 + member * 17)
        for s, pol in self.members[member].clients.items():
            mods[f"client{s}"].load_state_dict(pol.state_dict())
        return mods

    def adversarial_vector(self, member: int) -> tuple[np.ndarray, np.ndarray]:
        """``(clients and discriminators ++ zero shares, engines)`` of a member after its BC phase."""
        from edgetwin.federation.twin.mail import engine_modules, module_vector

        plan = self.plan
        assert plan is not None
        mods = self._adversarial_modules(member)
        adv = np.concatenate([module_vector(mods), np.zeros(plan.n_scen, np.float32)])
        return adv, module_vector(engine_modules(self.members[member].engines))

    def apply_adversarial(self, member: int, params: np.ndarray, aggregated_delta_mean: np.ndarray) -> np.ndarray:
        from edgetwin.federation.twin.mail import module_blocks

        plan = self.plan
        assert plan is not None
        return apply_blocks(params, aggregated_delta_mean, module_blocks(self._adversarial_modules(member)), plan.n_scen)

    def finish_adversarial(self, member: int, params: np.ndarray, rounds: list[dict[str, Any]]) -> None:
        """Load the aggregated client policies into the member (its discriminators are dropped, as
        `fit_mail` drops them)."""
        from edgetwin.federation.twin.mail import load_module_vector

        plan = self.plan
        assert plan is not None
        mods = self._adversarial_modules(member)
        load_module_vector(mods, np.asarray(params, np.float32)[: -plan.n_scen])
        mem = self.members[member]
        for s, pol in mem.clients.items():
            pol.load_state_dict(mods[f"client{s}"].state_dict())
        mem.history = pd.concat([mem.history, pd.DataFrame(rounds)], ignore_index=True)

    def set_causal(self, member: int, models: Mapping[int, Any], counted: np.ndarray,
                   rounds: list[dict[str, Any]]) -> None:
        """The member's client models become the federated causal ones (`twin.causal.CausalAggregate`)
        for every scenario some site counted rows of (``counted (scenarios,)``: pooled rows); a
        scenario nobody could count keeps its behaviour-cloned model."""
        mem = self.members[member]
        for s, model in models.items():
            if counted[s] > 0:
                mem.clients[s] = model
                if mem.noise:  # fitted on the behaviour-cloned model's residuals: the causal one has its own std
                    mem.noise.pop(s, None)
        if mem.noise is not None and not mem.noise:
            mem.noise = None
        mem.history = pd.concat([mem.history, pd.DataFrame(rounds)], ignore_index=True)

    def add_member(self, member: int, params: np.ndarray, residual_total: np.ndarray, rounds: list[dict[str, Any]]) -> None:
        plan = self.plan
        assert plan is not None
        pols = plan.new_policies(member)
        plan.load_policy_vector(pols, params[: plan.policy_size])
        r = plan.unpack("residual", residual_total)
        with th.no_grad():
            for s in range(plan.n_scen):
                for kind in ("client", "engine"):
                    n = max(float(r[f"{kind}.n"][s]), 1.0)
                    rms = np.sqrt(r[f"{kind}.ss"][s] / n)
                    pol = pols[f"{kind}{s}"]
                    pol.log_std.copy_(th.as_tensor(np.log(np.maximum(rms, MIN_STD)), dtype=pol.log_std.dtype))
        clients = {s: pols[f"client{s}"] for s in range(plan.n_scen)}
        engines = {s: pols[f"engine{s}"] for s in range(plan.n_scen)}
        mem = Member(clients, engines, pd.DataFrame(rounds))
        assert plan.layout is not None
        # the output noise by predicted level from the same round's pooled per-bin moments
        # (`edgetwin.federation.twin.noise`): the sites' rows of this member, never moved
        from edgetwin.federation.twin.noise import noise_from_sums

        noise = {}
        for s in range(plan.n_scen):
            # the first n_outputs of the client's outputs are the twin's (`Member.fit_output_noise`'s ``ny``)
            ny = plan.layout.n_outputs
            model = noise_from_sums({k: r[f"client.bin_{k}"][s][:ny] for k in ("n", "s1", "ss", "smu")})
            if model is not None:
                noise[s] = model
        mem.noise = noise or None
        mem.noise_source = "training episodes (pooled per-bin residual moments of the sites, residual round)"
        self.members.append(mem)

    def twin(self, meta_extra: Mapping[str, Any] | None = None) -> Twin:
        """The fitted twin: an ordinary `Twin` (save/load, envs, what-ifs, training)."""
        plan = self.plan
        assert plan is not None and plan.layout is not None and self.transformer is not None
        assert self.support is not None
        lay, spec, o = plan.layout, self.spec, self.options
        P = plan.width("profile")
        props = self.s1["agents.scen"] / max(float(self.s1["agents.scen"].sum()), 1.0)
        pop: Any
        if self.gan is not None:
            pop = self.gan
            pop.meta["n_train"] = int(self.s1["agents.scen"].sum())
        else:
            pop = GMMPopulation(spec=spec, scenarios=list(plan.scenarios), proportions=props,
                                transformer=self.transformer,
                                hyper={"n_components": o.n_components, "federated": True, "calibrate": False},
                                meta={"n_train": int(self.s1["agents.scen"].sum()), "seed": o.seed, "federated": True})
            pop.params = profile_marginal(self.gmm, P)
        # the bank of initial states: joint draws of (profile, initial state) from the mixture
        rng = np.random.default_rng([o.seed, 0x1B])
        zp, st = [], []
        for w, mu, chol in self.gmm:
            comp = rng.choice(len(w), size=o.bank, p=w)
            x = mu[comp] + np.einsum("nij,nj->ni", chol[comp], rng.standard_normal((o.bank, mu.shape[1])))
            prof = self.transformer.inverse_codes(x[:, :P])[lay.profile].to_numpy(np.float64)
            zp.append(lay.scalers["profile"].transform(prof))
            st.append(lay.scalers["state"].inverse(x[:, P:]))
        initial = InitialStates(zp, st)
        site_p = np.asarray(lay.site_profile_columns or [False] * P, bool)
        site_s = np.asarray(lay.site_state or [False] * len(lay.state), bool)
        units = np.maximum(np.rint(np.stack(self.units)), 0).astype(np.int64)
        empty = units.sum(axis=1) == 0
        units[empty, int(np.argmax(props))] = 1
        up = np.where(site_p[None, :], np.stack(self.unit_profile), np.nan)
        us = np.where(site_s[None, :], np.stack(self.unit_state), np.nan)
        composition = Composition(units=units, unit_sites=np.asarray(self.unit_names).astype("U"),
                                  unit_profile=up, unit_state=us)
        a_low, a_high = spec.bounds("action")
        sc = lay.scalers["action"]
        a_low = np.where(np.isfinite(a_low), a_low, sc.inverse(np.full((1, sc.width), -4.0))[0])
        a_high = np.where(np.isfinite(a_high), a_high, sc.inverse(np.full((1, sc.width), 4.0))[0])
        meta = {
            "format_version": FORMAT_VERSION,
            "seed": o.seed,
            "members": len(self.members),
            "response_model": "causal" if o.response_model == "causal" else "mail" if o.adversarial else "bc",
            "transition_model": "client",
            "site_model": False,
            "population_model": "gan-smmsg" if self.gan is not None else "gmm",
            "hyper": {**mail_config(o.to_dict()).__dict__, "rounds": o.adv_rounds if o.adversarial else 0,
                      # what `personalise` takes as the local fits' epochs: whole-epoch rounds add
                      # up; short rounds (`FitOptions.local_steps`) are no number of epochs, so
                      # a centralised fit's default
                      "bc_epochs": o.local_epochs * o.rounds if not o.local_steps else MailConfig().bc_epochs},
            "data_sha256": "federated (no pooled data): " + ",".join(self.unit_names),
            "n_rows": int(self.s1["rows.scen"].sum()),
            "n_episodes": int(self.s1["lengths"].sum()),
            "spec_hash": spec.hash(),
            "versions": library_versions(),
            "federated": {"sites": self.unit_names, "options": o.to_dict(), **dict(meta_extra or {})},
        }
        return Twin(lay, list(self.members), pop, composition, initial, self.support, a_low, a_high, meta)


def apply_blocks(params: np.ndarray, aggregated_delta_mean: np.ndarray, blocks: Sequence[tuple[int, slice]],
                 n_scen: int) -> np.ndarray:
    """Per-scenario FedAvg: each scenario's block moves by the sample-weighted mean of the sites'
    share-scaled deltas divided by the mean of their shares (the last ``n_scen`` values); a
    scenario no site trained stays where it was."""
    share = aggregated_delta_mean[-n_scen:]
    out = params[:-n_scen].astype(np.float64).copy()
    for s, sl in blocks:
        if share[s] > 1e-12:
            out[sl] += aggregated_delta_mean[sl] / share[s]
    return np.concatenate([out, np.zeros(n_scen)]).astype(np.float32)


def _transformer_dict(tr: ProfileTransformer) -> dict[str, Any]:
    return {c.feature.name: [c.mean, c.std, c.low, c.offset] for c in tr.codecs}


def transformer_from_dict(spec: TwinSpec, d: Mapping[str, Any]) -> ProfileTransformer:
    """The population encoding a coordinator's context describes (its inverse of `_transformer_dict`)."""
    st = {f"{name}|ms": np.asarray(v, np.float64) for name, v in d.items()}
    return ProfileTransformer.from_state(spec, "standard", st)


def gmm_from_context(ctx: Mapping[str, Any]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    return [(np.asarray(w), np.asarray(mu), np.asarray(ch)) for w, mu, ch in ctx["gmm"]]
