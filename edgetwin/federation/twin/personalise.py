"""A twin for one site chosen by its own log among the federated twin, adaptations of it and the
site's own twin (`personalise`), each scored in closed loop on held-out service groups
(`closed_loop_scores`). The site's log never leaves the site."""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch as th

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import REWARD_COLUMN
from edgetwin.federation.twin.candidates import (
    PROX_GRID,
    Candidate,
    model_candidates,
    refit,
    validation_agents,
)
from edgetwin.imitation.mail import (
    MailConfig,
    client_rows,
    gaussian_policy,
)
from edgetwin.imitation.steps import build_steps
from edgetwin.twin.member import Member
from edgetwin.twin.twin import Twin

#: twin-level candidates of `personalise` assembled from the per-model candidates: which of each
#: model's candidates each one takes; with ``site_alone``, `SITE_ALONE` is a fourth
TWIN_CHOICES = ("federated", "per model", "local only")
#: the twin-level candidate that is the site's own twin, fitted on its rows alone (`personalise`)
SITE_ALONE = "site alone"
#: the selection criteria `personalise` computes for every twin-level candidate (`closed_loop_scores`)
CRITERIA = ("closed loop", "closed loop by action", "closed loop, reward", "closed loop, reward by action")


def closed_loop_scores(twin: Twin, log: pd.DataFrame, held: np.ndarray, policy: Any, seed: int,
                       strata: int = 3, min_rows: int = 10) -> dict[str, float]:
    """How far ``twin`` is from a site's logged outcomes on held-out service groups, in closed loop.

    The twin runs the log's episodes (its populations and first states, `logged_rollout`) under
    ``policy`` (a clone of the logging policy), every agent simulated; on the rows of the groups
    ``held`` (the log's rows, ``(N,)`` bool) the twin's mean of each output and of the reward is set
    beside the logged mean, in units of the logged column's standard deviation ``sd``:

    - ``"closed loop"``: the mean over those columns of ``((twin - log) / sd)^2``;
    - ``"closed loop by action"``: the same per stratum of each action column (``strata`` bins at the
      logged held-out rows' quantiles; the twin's rows binned by the actions its policy took),
      averaged over columns, actions and strata with at least ``min_rows`` rows on both sides. A
      policy other than the logging one moves the actions; a twin whose response to the action is
      off can still match the mean under the logging policy, and this score sees it;
    - ``"closed loop, reward"``, ``"closed loop, reward by action"``: the same two on the reward
      column alone (what a ranking of policies by return depends on).

    This is the error a twin is used for (mean returns and KPIs over a day, with its own
    predictions feeding the next tick), on groups none of the candidates was fitted on; a one-step
    likelihood can prefer a model with less variance per row but a bias that every tick of a
    rollout adds up. Returns ``{criterion: score}`` (NaN without held-out rows), one rollout."""
    from edgetwin.twin.fidelity import logged_rollout

    lay = twin.layout
    cols = [c for c in [*lay.outputs] if c in log.columns]
    key = log["episode"].astype(str) + "\x1f" + log["agent"].astype(str)
    held_keys = set(key[held])
    rep = logged_rollout(twin, policy, log, seed=seed, all_members=True)
    rkey = rep["episode"].astype(str).str.replace(r"-m\d+$", "", regex=True) + "\x1f" + rep["agent"].astype(str)
    sim = rep[rkey.isin(held_keys).to_numpy()]
    real = log[held]
    nan = {c: float("nan") for c in CRITERIA}
    if not len(sim) or not len(real):
        return nan
    cols = [c for c in cols if c in sim.columns]
    sd = {c: max(float(real[c].std()), 1e-9) for c in cols}
    err = {c: ((float(sim[c].mean()) - float(real[c].mean())) / sd[c]) ** 2 for c in cols}
    strat: dict[str, list[float]] = {c: [] for c in cols}
    for a in [c for c in lay.action if c in real.columns and c in sim.columns]:
        edges = np.unique(np.quantile(real[a].to_numpy(np.float64), np.linspace(0, 1, strata + 1)[1:-1]))
        rb, sb = np.digitize(real[a].to_numpy(np.float64), edges), np.digitize(sim[a].to_numpy(np.float64), edges)
        for b in range(len(edges) + 1):
            r_, s_ = real[rb == b], sim[sb == b]
            if len(r_) < min_rows or len(s_) < min_rows:
                continue
            for c in cols:
                strat[c].append(((float(s_[c].mean()) - float(r_[c].mean())) / sd[c]) ** 2)

    def mean(v: list[float]) -> float:
        return float(np.mean(v)) if v else float("nan")

    rw = [REWARD_COLUMN] if REWARD_COLUMN in err else []
    return {"closed loop": mean(list(err.values())), "closed loop by action": mean(sum(strat.values(), [])),
            "closed loop, reward": mean([err[c] for c in rw]),
            "closed loop, reward by action": mean(sum((strat[c] for c in rw), []))}


def _same_shape(fresh: Any, like: Any) -> Any:
    """``fresh`` when its parameters have ``like``'s shapes (a local-only candidate must be the same
    model family), else None (no local candidate)."""
    a = {k: tuple(v.shape) for k, v in fresh.state_dict().items()}
    b = {k: tuple(v.shape) for k, v in like.state_dict().items()}
    return fresh if a == b else None


def _take(cands: list[tuple[Candidate, Any]], how: str) -> tuple[Candidate, Any] | None:
    """The per-model candidate twin-level choice ``how`` (one of `TWIN_CHOICES`) takes: the
    federated model, the local-only fit (the federated one when there is none) or the best by
    held-out loss; None without candidates."""
    if not cands:
        return None
    if how == "federated":
        return cands[0]
    if how == "local only":
        loc = [c for c in cands if c[0].start == "fresh"]
        return loc[0] if loc else cands[0]
    return min(cands, key=lambda c: (c[0].loss if np.isfinite(c[0].loss) else np.inf))


class _SiteCandidates:
    """A site's candidates for `personalise`: per member, scenario and model (engine, client) a
    *slot* holding the model's candidates trained on the kept groups (`model_candidates`), and the
    ways of turning slots into members and twins (assembled, refitted, after local GAIL rounds).

    Args: as `personalise`; ``df`` its log sorted by (episode, t, agent), ``steps`` its steps,
    ``held_rows`` / ``inner`` ``(N,)`` bool: the twin-level and per-model hold-outs."""

    def __init__(self, twin: Twin, df: pd.DataFrame, steps: Any, held_rows: np.ndarray, inner: np.ndarray,
                 epochs: int, local_epochs: int, seed: int, prox_grid: Sequence[float], adversarial_rounds: int) -> None:
        self.twin, self.lay, self.df, self.steps = twin, twin.layout, df, steps
        self.held_rows, self.seed, self.epochs, self.prox_grid = held_rows, seed, epochs, prox_grid
        self.adversarial_rounds = adversarial_rounds
        hyper = dict(twin.meta.get("hyper") or {})
        self.cfg = MailConfig.from_hyper(hyper)
        self.cfg.disc_arch = tuple(int(h) for h in self.cfg.disc_arch)
        self.slots = self._slots(inner, local_epochs, [int(h) for h in hyper.get("net_arch", [64, 64])],
                                 [int(h) for h in hyper.get("engine_arch", [32, 32])])

    def _slots(self, inner: np.ndarray, local_epochs: int, net_arch: list[int], engine_arch: list[int]
               ) -> list[dict[str, Any]]:
        """Per member, scenario and model: its candidates, trained on the groups not held out."""
        lay, steps, seed, held_rows = self.lay, self.steps, self.seed, self.held_rows
        slots: list[dict[str, Any]] = []
        for m, mem in enumerate(self.twin.members):
            for s in range(len(lay.scenarios)):
                for kind, rows, x, y, fed, fresh in (
                    ("engine", steps.rows(s), steps.x_engine, steps.za, mem.engines[s],
                     (lay.n_engine_inputs, len(lay.action), engine_arch, 0)),
                    ("client", client_rows(steps, lay, s), steps.x_client, steps.y_client, mem.clients[s],
                     (lay.n_client_inputs, lay.n_model_outputs, net_arch, 100)),
                ):
                    if len(rows) < 2:
                        continue
                    th.manual_seed(seed * 1000 + m * 17 + fresh[3] + s)
                    new = _same_shape(gaussian_policy(fresh[0], fresh[1], fresh[2]), fed)
                    sd = seed * 100 + m * 10 + s + (5 if kind == "client" else 0)
                    keep = ~held_rows[rows] if held_rows.any() else np.ones(len(rows), bool)
                    cands = model_candidates(fed, x[rows][keep], y[rows][keep], inner[rows][keep], self.epochs,
                                             local_epochs, sd, self.prox_grid, new)
                    slots.append({"member": m, "scenario": s, "model": kind, "x": x[rows], "y": y[rows], "fed": fed,
                                  "fresh": new, "seed": sd, "cands": cands, "keep": keep})
        return slots

    def assemble(self, pick: Callable[[dict[str, Any]], Any]) -> list[Member]:
        """The twin's members with each slot's model replaced by ``pick(slot)``."""
        out = []
        for m, mem in enumerate(self.twin.members):
            clients, engines = dict(mem.clients), dict(mem.engines)
            for sl in self.slots:
                if sl["member"] == m:
                    (clients if sl["model"] == "client" else engines)[sl["scenario"]] = pick(sl)
            out.append(Member(clients, engines, mem.history))
        return out

    def with_gail(self, members: list[Member], frame: pd.DataFrame, frame_steps: Any) -> list[Member]:
        """Copies of ``members`` whose clients had the local GAIL rounds on ``frame``'s rows."""
        from edgetwin.federation.twin.mail import SiteAdversarial

        out = []
        for m, mem in enumerate(members):
            clients = {s: copy.deepcopy(c) for s, c in mem.clients.items()}
            engines = {s: copy.deepcopy(e) for s, e in mem.engines.items()}
            history = mem.history.copy()
            if self.adversarial_rounds > 0:
                local = SiteAdversarial("personalise", frame_steps, frame, self.twin.spec, self.lay, self.cfg, engines,
                                        self.seed * 100 + m)
                for s, pol in clients.items():
                    local.learners.clients[s].load_state_dict(pol.state_dict())
                recs = [{"round": r + 1, "phase": "personalised", **st}
                        for r in range(self.adversarial_rounds) for st in local.local_round()]
                for s in clients:
                    clients[s].load_state_dict(local.learners.clients[s].state_dict())
                history = pd.concat([history, pd.DataFrame(recs)], ignore_index=True)
            out.append(Member(clients, engines, history))
        return out

    def as_twin(self, members: list[Member]) -> Twin:
        """A twin of ``members``, each with its output noise model (`Member.fit_output_noise`, as
        `Twin.fit` fits one) fitted at the site on the rows its models were fitted on: the kept
        groups' (``noise_source`` "training episodes": it understates the spread by the models' own
        fitting error). Not on the held-out groups: they score the candidates
        (`closed_loop_scores`), and a noise model fitted there would take part in its own selection.
        The rows never leave the site; neither does the personalised twin."""
        t = self.twin
        rows = self.df[~self.held_rows] if self.held_rows.any() else self.df
        for m, mem in enumerate(members):
            mem.fit_output_noise(rows, rows["episode"].unique(), None, self.lay, self.seed * 1000 + m * 10 + 700)
        return Twin(self.lay, members, t.population, t.composition, t.initial, t.support, t.action_low,
                    t.action_high, dict(t.meta))

    def kept_fit(self, sl: dict[str, Any], h: str) -> Any:
        """Candidate ``h``'s model of slot ``sl``: its recipe refitted on all the kept groups."""
        c = _take(sl["cands"], h)
        if c is None:
            return sl["fed"]
        k = sl["keep"]
        return refit(c[0], sl["fed"], sl["fresh"] if sl["fresh"] is not None else sl["fed"], sl["x"][k], sl["y"][k],
                     sl["seed"])

    def _kept_pick(self, h: str, sl: dict[str, Any]) -> Any:
        return self.kept_fit(sl, h)

    def scores(self, site_alone: Callable[[pd.DataFrame], Twin] | None, selection_adversarial: bool
               ) -> dict[str, dict[str, float]]:
        """``{criterion: {candidate: score}}``: every twin-level candidate fitted without the
        held-out groups, run in closed loop on the site's episodes and scored on those groups
        (`closed_loop_scores`); empty scores when nothing is held out or no slot has candidates."""
        by_crit: dict[str, dict[str, float]] = {c: {} for c in CRITERIA}
        if not (self.held_rows.any() and any(sl["cands"] for sl in self.slots)):
            return by_crit
        kept = self.df[~self.held_rows].reset_index(drop=True)
        local_twin = self.as_twin(self.assemble(lambda sl: self.kept_fit(sl, "local only")))
        policy = local_twin.logging_policy(seed=self.seed + 11)  # the site's own clone of its logging policy
        kept_steps = build_steps(kept, self.lay) if selection_adversarial and self.adversarial_rounds > 0 else None
        named = [*TWIN_CHOICES, *([SITE_ALONE] if site_alone is not None else [])]
        for h in named:
            if h == SITE_ALONE:
                cand = site_alone(kept)  # type: ignore[misc]
            else:
                mems = self.assemble(functools.partial(self._kept_pick, h))
                if kept_steps is not None:
                    mems = self.with_gail(mems, kept, kept_steps)
                cand = self.as_twin(mems)
            for c, v in closed_loop_scores(cand, self.df, self.held_rows, policy, self.seed + 13).items():
                by_crit[c][h] = v
        return by_crit

    def build(self, h: str, site_alone: Callable[[pd.DataFrame], Twin] | None, site_alone_twin: Twin | None
              ) -> tuple[Twin, list[dict[str, Any]]]:
        """Candidate ``h`` on all the site's rows, and its per-model record."""
        if h == SITE_ALONE:
            own = site_alone_twin if site_alone_twin is not None else site_alone(self.df)  # type: ignore[misc]
            return own, []
        recs, final = [], {}
        for sl in self.slots:
            c = _take(sl["cands"], h)
            if c is None:
                best = Candidate(f"fine-tuned (mu={self.prox_grid[0]:g})", "federated", float(self.prox_grid[0]),
                                 self.epochs, float("nan"))
            else:
                best = c[0]
            final[id(sl)] = refit(best, sl["fed"], sl["fresh"] if sl["fresh"] is not None else sl["fed"], sl["x"],
                                  sl["y"], sl["seed"])
            recs.append({"member": sl["member"], "scenario": self.lay.scenarios[sl["scenario"]], "model": sl["model"],
                         "choice": best.name, "epochs": best.epochs, "mu": best.mu,
                         "losses": {c.name: c.loss for c, _ in sl["cands"]}})
        return self.as_twin(self.with_gail(self.assemble(lambda sl: final[id(sl)]), self.df, self.steps)), recs


def _choose(by_crit: Mapping[str, Mapping[str, float]], criterion: str) -> tuple[str, str]:
    """``(twin choice, criterion used)``: the candidate of least finite score under ``criterion``
    (the plain ``"closed loop"`` when it has none; ``"per model"`` when no score is finite)."""
    finite = {k: v for k, v in by_crit[criterion].items() if np.isfinite(v)}
    if not finite and any(by_crit[criterion]):  # e.g. no action stratum with enough rows
        criterion = "closed loop"
        finite = {k: v for k, v in by_crit[criterion].items() if np.isfinite(v)}
    return (min(finite, key=finite.__getitem__) if finite else "per model"), criterion


def _stamp(tw: Twin, record: dict[str, Any]) -> Twin:
    """``tw`` with ``meta["personalised"] = record``."""
    meta = dict(tw.meta)
    meta["personalised"] = record
    return Twin(tw.layout, tw.members, tw.population, tw.composition, tw.initial, tw.support,
                tw.action_low, tw.action_high, meta)


def personalise(twin: Twin, log: pd.DataFrame, epochs: int = 8, seed: int = 0, adversarial_rounds: int | None = None,
                validation: float = 0.25, prox_grid: Sequence[float] = PROX_GRID, local_epochs: int | None = None,
                site_alone: Callable[[pd.DataFrame], Twin] | None = None, site_alone_twin: Twin | None = None,
                criterion: str = "closed loop", selection_adversarial: bool = True,
                candidates: dict[str, Twin] | None = None) -> Twin:
    """A twin for one site, chosen by its own log (which never leaves the site) among the federated
    twin, adaptations of it, and — with ``site_alone`` — the site's own twin.

    A fraction ``validation`` of each scenario's service groups is held out for the twin-level
    choice (`validation_agents`), and the same fraction of the remaining ("kept") groups for the
    per-model choices. For each ensemble member, scenario and model (engine, client),
    `model_candidates` fits on the kept groups less the inner ones the federated model as it is,
    proximal fine-tunings of it towards the federated weights (FedProx / Ditto, ``prox_grid``) and a
    model of the site's rows alone, each at its best epoch by the one-step likelihood of the inner
    held-out groups. Twin-level candidates, all fitted on the kept groups (the recipes refitted on
    all of them): three assembled from those models (`TWIN_CHOICES`: all federated; per model the
    best one-step candidate; all local), each with the local GAIL rounds below run on the kept
    groups (``selection_adversarial``; False: scored as behaviour clones), and, with
    ``site_alone``, ``site_alone(kept rows)``: the site's own full twin (e.g. ``Twin.fit`` with the
    federation's family and budget, adversarial stage included), `SITE_ALONE`. Each runs the site's
    episodes in closed loop under the site's cloned logging policy and is scored on the held-out
    groups (`closed_loop_scores`, every criterion of `CRITERIA` recorded; ``criterion`` chooses, the
    plain ``"closed loop"`` if it has no finite score):
    one-step likelihood alone can prefer a model whose small bias a rollout adds up tick after tick.
    Only the site's own logged rows are used to choose, and no candidate is tuned on the groups it
    is scored on (with one hold-out for both, the per-model candidates' early stopping and choice
    had seen the scoring groups, and "per model" won on every benchmark run). The winner is rebuilt on all the site's
    rows: its recipe refitted and then ``adversarial_rounds`` local GAIL rounds on the site's rows
    (`twin.mail.SiteAdversarial`, fresh discriminators; default: as many as the twin's own
    adversarial rounds, 0 for a BC twin), or, for `SITE_ALONE`, ``site_alone_twin`` (the site's twin
    already fitted on all its rows) or else ``site_alone(log)``.

    What is measured, and what is not guaranteed: the choice is the candidate closest to the site's
    unseen groups of its logged days under its logging policy, which is all the site can check
    with its own logs. It is *not* "never worse than the site's own twin" on other days and
    policies: on the federated-twin benchmark (docs/benchmarks/federated_twin/README.md, "The data-poor site", where each
    candidate's selection score is set beside its ranking error on held-out days) the fine-tuned
    "per model" twin had the best score under every criterion of `CRITERIA` in all four runs, and
    on one (seed 1, a whole day of the site) its error was 17.6 % against 6.4 % for the site's own
    twin, which scored worst (keeping the held-out groups out of the federation changed neither).
    A criterion that sees another logged day would be needed for the guarantee.

    Args:
        twin: the (federated) twin.
        log: the site's log, in the contract of the twin's spec.
        epochs: most fine-tuning epochs (chosen on the held-out groups).
        seed: the same seed and log give the same twin.
        adversarial_rounds: local GAIL rounds after the selection (see above).
        validation: fraction of service groups held out to choose; 0: no choice (proximal
            fine-tuning with ``prox_grid[0]`` for ``epochs`` epochs).
        prox_grid: proximal strengths tried.
        local_epochs: most epochs of the local-only candidate (default: the twin's BC epochs).
        site_alone: fits the site's own twin on a table of its rows (called on the kept groups to
            score it; on the whole log if it wins and ``site_alone_twin`` is None); None: no such
            candidate.
        site_alone_twin: ``site_alone(log)`` if the caller has it already (not recomputed).
        criterion: one of `CRITERIA` (recorded: the one used).
        selection_adversarial: score the assembled candidates after the local GAIL rounds (as
            they would be delivered), not as behaviour clones.
        candidates: when a dict, it is filled with every twin-level candidate rebuilt on all the
            site's rows as the winner would be (``{name: Twin}``): what the benchmark scores to
            check the criterion; costs one refit (and the GAIL rounds) per candidate.

    Returns:
        The personalised twin; ``meta["personalised"]`` records the twin-level scores and choice
        (``twin_scores`` under ``criterion``, ``twin_scores_by_criterion``, ``twin_choice``) and, per
        member, scenario and model, the candidate taken and every candidate's held-out loss
        (``choices``).
    """
    if criterion not in CRITERIA:
        raise InputError(f"personalise: criterion must be one of {', '.join(CRITERIA)}, not {criterion!r}")
    if twin.meta.get("response_model") not in ("mail", "bc"):  # its candidates fine-tune Gaussian policies
        raise InputError(f"personalise adapts a twin of behaviour-cloned or MAIL client models, this one's are "
                         f"{twin.meta.get('response_model')!r}", where="twin")
    df = log.sort_values(["episode", "t", "agent"], kind="stable").reset_index(drop=True)
    steps = build_steps(df, twin.layout)
    # nested hold-out: the twin-level choice is scored on groups ``held_rows`` that no candidate saw
    # in any way; the per-model choices and early stopping use other groups (``inner``), so that
    # no candidate is tuned on the groups it is scored on (the site's own twin is not tuned at all)
    held_rows = validation_agents(steps.frame, validation, seed)
    inner = held_rows.copy()
    if held_rows.any():
        inner = np.zeros(len(held_rows), bool)
        inner[np.flatnonzero(~held_rows)] = validation_agents(
            steps.frame[~held_rows].reset_index(drop=True), validation, seed + 1)
    hyper = dict(twin.meta.get("hyper") or {})
    if adversarial_rounds is None:
        adversarial_rounds = int(hyper.get("rounds", 0)) if twin.meta.get("response_model") == "mail" else 0
    if local_epochs is None:
        local_epochs = int(hyper.get("bc_epochs", 12) or 12)
    site = _SiteCandidates(twin, df, steps, held_rows, inner, epochs, local_epochs, seed, prox_grid, adversarial_rounds)
    by_crit = site.scores(site_alone, selection_adversarial)
    how, criterion = _choose(by_crit, criterion)

    def record(h: str, recs: list[dict[str, Any]]) -> dict[str, Any]:
        return {"epochs": epochs, "rows": len(df), "adversarial_rounds": adversarial_rounds, "validation": validation,
                "prox_grid": list(prox_grid), "twin_choice": h, "criterion": criterion,
                "twin_scores": dict(by_crit[criterion]), "twin_scores_by_criterion": by_crit, "choices": recs}

    chosen, recs = site.build(how, site_alone, site_alone_twin)
    out = _stamp(chosen, record(how, recs))
    if candidates is not None:
        for h in [*TWIN_CHOICES, *([SITE_ALONE] if site_alone is not None else [])]:
            if h == how:
                candidates[h] = out
            else:
                tw, r = site.build(h, site_alone, site_alone_twin)
                candidates[h] = _stamp(tw, record(h, r))
    return out
