"""The plan of a federated twin fit: the options every site must agree on (`FitOptions`) and the
names and shapes of every phase's vector (`TwinFitPlan`), computed identically on both sides from
the spec, the scenario labels, the columns and the layout, never from a site's row count (the
phases: `edgetwin.federation.twin.fit`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch as th

from edgetwin.contract.errors import InputError
from edgetwin.contract.spec import REWARD_COLUMN, TwinSpec
from edgetwin.imitation.causal import INVARIANCE
from edgetwin.imitation.layout import Layout
from edgetwin.imitation.mail import (
    gaussian_policy,
)

ROLES = ("profile", "state", "action", "outputs")
#: episode lengths are counted in a histogram of this many bins (longer ones in the last)
MAX_LEN = 1024
#: the default of a site's ``min_agents``: every statistic a site sends is an aggregate over at least
#: this many distinct agents (service groups), counted as an effective number (`effective_agents`)
MIN_AGENTS = 10
#: the support index's action check: an action is compared with those of this many nearest contexts
#: (of the bank of aggregates; the centralised index compares with 20 logged rows)
SUPPORT_K = 5
#: the most episode folds a site uses to measure its support thresholds on unseen episodes
SUPPORT_FOLDS = 3


class TooFewAgents(ValueError):
    """A site whose log has fewer distinct agents than its ``min_agents``: it sends no statistic
    (the coordinator hears the type of this error only, not the count)."""


#: the behaviour-cloning schedule under Gaussian DP when none is given (`FitOptions.for_strategy`):
#: few rounds of whole epochs, as before the many-short-rounds default. Every DP round adds noise of
#: std ``noise_multiplier * clip_norm / sites`` to each weight and spends privacy budget, so the
#: default's 240 rounds random-walked the weights to values whose forward passes overflowed in the
#: sites' adversarial rounds (the fit failed); 8 rounds of 2 epochs complete (docs/federation.md).
DP_SCHEDULE: dict[str, int] = {"rounds": 8, "local_epochs": 2, "local_steps": 0}


def strategy_schedule(strategy: str) -> dict[str, int]:
    """The `FitOptions` fields an aggregation rule sets by default: `DP_SCHEDULE` for
    ``"dp_gaussian"``, none for the others."""
    return dict(DP_SCHEDULE) if strategy == "dp_gaussian" else {}


@dataclass
class FitOptions:
    """Hyper-parameters of a federated fit (sizes every site must agree on).

    Attributes:
        members: ensemble size (each member: its own bootstrap of every site's episodes).
        rounds: FedAvg rounds of the behaviour-cloned models per member (MAIL's pre-training).
        local_epochs: behaviour-cloning epochs a site runs per round (see ``local_steps``).
        local_steps: if > 0, at most this many minibatches per model and round instead of
            ``local_epochs`` (0: whole epochs).
        keep_optimizer: a site keeps each model's Adam state from one round to the next (as
            its GAIL trainers do, `edgetwin.federation.twin.mail`); False: a fresh optimiser each
            round.

            Why many short rounds with kept optimisers by default (240 x 5 minibatches): the
            sites' logs are not alike (their own load, mix and edge site), and a site that runs
            whole epochs from the global weights pulls them toward its own log (client drift),
            so the average fits no site well. On the federated-twin benchmark's data-poor site
            (behaviour cloning only, whole day, seeds 0-3) 6 rounds x 2 epochs gave a mean
            relative error of 27 % against 13 % for the same models fitted on the pooled rows;
            240 x 5 with kept optimisers gives 17 %; 120 x 5 was worse again (22-23 % on two
            seeds), 240 x 5 without kept optimisers 14 % against 8 % on seed 1 (fresh Adam
            moments every 5 steps are mostly noise), 400 x 5 no better on seed 0
            (docs/federation.md, "Rounds"). The price is bytes: a round sends every model.
        n_components: mixture components per scenario of the population model.
        em_iters: federated EM iterations.
        support_centroids: centroids per site of the support index.
        bank: initial states sampled per scenario for the twin's bank.
        net_arch, engine_arch: hidden layers of client and engine models (as `MailConfig`).
        seed: the same seed and logs give the same twin.
        response_model: ``"mail"`` (default: behaviour cloning, then ``adv_rounds`` federated
            adversarial rounds, `edgetwin.federation.twin.mail`), ``"bc"``, ``"causal"``
            (`edgetwin.imitation.causal.CausalResponseModel`, fitted on the pooled loss by
            ``causal_steps`` full-batch steps of two rounds each, `edgetwin.federation.twin.causal`;
            the engines stay behaviour-cloned) or ``"auto"``: decided at the hello round by
            `resolved` — ``"causal"`` when the sites together logged at least two policies, each
            over at least a site's ``min_agents`` agents, else ``"mail"``. It is `Twin.fit`'s
            ``"auto"`` without its overlap check (how far actions vary independently of the context
            needs the rows in one place; a site's own check would judge its slice, not the pool).
        causal_steps, causal_lr, invariance: the causal model's Adam steps, learning rate and
            invariance weight (`CausalResponseModel`'s ``steps``, ``lr``, ``invariance``).
        population_model: ``"gan-smmsg"`` (default, as `Twin.fit`: ``gan_rounds`` federated rounds
            of ``gan_local_steps`` steps per site, `edgetwin.federation.twin.gan`) or ``"gmm"``
            (the federated-EM mixture alone).
        mail: `MailConfig` overrides of the adversarial rounds (``world_agents``, ``n_steps``, ...).
        gan: GAN-SMMSG hyper-parameter overrides (``hidden``, ``batch_per_scenario``, ...).
    """

    members: int = 1
    rounds: int = 240
    local_epochs: int = 1
    local_steps: int = 5
    keep_optimizer: bool = True
    n_components: int = 5
    em_iters: int = 15
    support_centroids: int = 256
    bank: int = 2000
    net_arch: list[int] = field(default_factory=lambda: [64, 64])
    engine_arch: list[int] = field(default_factory=lambda: [32, 32])
    seed: int = 0
    response_model: str = "mail"
    population_model: str = "gan-smmsg"
    adv_rounds: int = 10
    mail: dict[str, Any] = field(default_factory=dict)
    gan_rounds: int = 10
    gan_local_steps: int = 50
    gan: dict[str, Any] = field(default_factory=dict)
    causal_steps: int = 600
    causal_lr: float = 1e-2
    invariance: float = INVARIANCE

    def __post_init__(self) -> None:
        if self.response_model not in ("mail", "bc", "causal", "auto"):
            raise InputError(f"response model must be 'mail', 'bc', 'causal' or 'auto', got {self.response_model!r}",
                             where="--response-model")
        if self.causal_steps < 1 or not self.causal_lr > 0 or not self.invariance >= 0:
            raise InputError(f"need causal_steps >= 1, causal_lr > 0, invariance >= 0; got {self.causal_steps}, "
                             f"{self.causal_lr}, {self.invariance}", where="options")
        if self.population_model not in ("gan-smmsg", "gmm"):
            raise InputError(f"population model must be 'gan-smmsg' or 'gmm', got {self.population_model!r}",
                             where="--population-model")

    @property
    def adversarial(self) -> bool:
        """MAIL's adversarial rounds run (the default family); False: behaviour cloning only."""
        return self.response_model == "mail" and self.adv_rounds > 0

    def resolved(self, policies: Sequence[str]) -> FitOptions:
        """These options with ``"auto"`` decided from the policies the sites logged (each over at least
        their ``min_agents`` agents, `edgetwin.federation.twin.causal.site_policies`): ``"causal"``
        for two or more, else ``"mail"``. Any other choice is returned as it is."""
        if self.response_model != "auto":
            return self
        return replace(self, response_model="causal" if len(set(policies)) >= 2 else "mail")

    @property
    def gan_population(self) -> bool:
        return self.population_model == "gan-smmsg" and self.gan_rounds > 0

    @classmethod
    def for_strategy(cls, strategy: str, **kw: Any) -> FitOptions:
        """The options with ``strategy``'s default schedule, ``kw`` over it: `DP_SCHEDULE` for
        ``"dp_gaussian"``, the class defaults otherwise."""
        return cls(**{**strategy_schedule(strategy), **kw})

    @classmethod
    def light(cls, **kw: Any) -> FitOptions:
        """The light family: behaviour-cloned responses and the Gaussian-mixture population."""
        return cls(**{"response_model": "bc", "population_model": "gmm", **kw})

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> FitOptions:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})


# ------------------------------------------------------------------------------------ the plan
class TwinFitPlan:
    """Names and shapes of every phase's vector: computed identically on both sides from the spec,
    the scenario labels, the columns, the layout (after ``stats2``) and the options."""

    def __init__(self, spec: TwinSpec, scenarios: list[str], columns: list[str], has_reward: bool,
                 options: FitOptions) -> None:
        self.spec = spec
        self.scenarios = list(scenarios)
        present = set(columns)
        self.cols = {
            "profile": [c for c in spec.names("profile") if c in present],
            "state": [c for c in spec.names("state") if c in present],
            "action": [c for c in spec.names("action") if c in present],
        }
        self.cols["outputs"] = (
            [c for c in spec.names("response") if c in present]
            + [c for c in spec.names("kpi") if c in present]
            + ([REWARD_COLUMN] if has_reward else [])
        )
        self.has_reward = has_reward
        self.options = options
        self.layout: Layout | None = None
        #: parameters of the federated GAN (set by whoever builds it, `twin.gan.gan_size`)
        self.population_size: int | None = None
        #: the logged policy ids the causal response model is invariant across (the union of the
        #: sites' ``hello``; `edgetwin.federation.twin.causal.site_policies`)
        self.policies: list[str] = []
        self._policy_names: list[tuple[str, int, list[str], list[tuple[int, ...]]]] | None = None

    @property
    def n_scen(self) -> int:
        return len(self.scenarios)

    def width(self, role: str) -> int:
        return len(self.cols[role])

    @property
    def d_pop(self) -> int:
        """Dimension of the population mixture: profile codes + z(initial state)."""
        return self.width("profile") + self.width("state")

    @property
    def d_support(self) -> int:
        return self.width("profile") + self.width("state") + self.width("action")

    def shapes(self, phase: str) -> dict[str, tuple[int, ...]]:
        P, S, Y, n = self.width("profile"), self.width("state"), self.width("outputs"), self.n_scen
        K, D = self.options.n_components, self.d_pop
        if phase == "hello":
            return {"rows": (1,)}
        if phase == "stats1":
            out: dict[str, tuple[int, ...]] = {}
            for r in ROLES:
                w = self.width(r)
                out.update({f"{r}.n": (w,), f"{r}.sum": (w,), f"{r}.lsum": (w,), f"{r}.nonneg": (w,)})
            out.update({
                "groups.n": (1,), "groups.logsize": (1,), "lengths": (MAX_LEN,), "sites": (1,),
                "votes.multi": (1,), "votes.site_state": (S,), "votes.clock_n": (S,), "votes.clock_step": (S,),
                "votes.echo": (S, max(Y, 1)), "votes.absolute": (S,), "agents.scen": (n,), "rows.scen": (n,),
                "prof.sum": (P,), "prof.above_n": (P,), "prof.above_sum": (P,),
            })
            return out
        if phase == "stats2":
            out = {f"{r}.ss": (self.width(r),) for r in ROLES}
            out.update({"prof.yc": (P,), "prof.yss": (P,)})
            return out
        if phase == "summary":
            return {
                "pop.c": (n, K, D), "pop.n": (n, K),
                "support.c": (self.options.support_centroids, self.d_support),
                "support.n": (self.options.support_centroids,), "support.q": (2,),
                "unit.counts": (n,), "unit.profile": (P,), "unit.state": (S,),
            }
        if phase == "em":
            return {"em.n": (n, K), "em.x": (n, K, D), "em.xx": (n, K, D, D), "em.ll": (1,)}
        if phase == "weights":
            return {"params": (self.policy_size + n,)}
        if phase == "adversarial":
            assert self.layout is not None
            from edgetwin.federation.twin.mail import adversarial_size, mail_config

            return {"params": (adversarial_size(self.layout, mail_config(self.options.to_dict())) + n,)}
        if phase == "population":
            if self.population_size is None:
                raise InputError("the population model is built after em", where="twin_task")
            return {"params": (self.population_size,)}
        if phase in ("causal_sums", "causal_grad"):
            assert self.layout is not None
            from edgetwin.federation.twin.causal import causal_size

            sums = (n, len(self.policies), 1 + 2 * self.layout.n_model_outputs)
            if phase == "causal_sums":
                return {"sums": sums}
            return {"grad": (causal_size(self.layout, self.options.to_dict()),)}
        if phase == "residual":
            assert self.layout is not None
            from edgetwin.federation.twin.noise import N_BINS

            y = self.layout.n_model_outputs
            # the per-bin residual moments of the output noise by predicted level (`federation.twin.noise`)
            return {"client.ss": (n, y), "client.n": (n,), "engine.ss": (n, self.width("action")), "engine.n": (n,),
                    **{f"client.bin_{k}": (n, y, N_BINS) for k in ("n", "s1", "ss", "smu")}}
        raise InputError(f"unknown phase {phase!r}", where="twin_task")

    def size(self, phase: str) -> int:
        return int(sum(int(np.prod(s)) for s in self.shapes(phase).values()))

    def pack(self, phase: str, parts: Mapping[str, Any]) -> np.ndarray:
        shapes = self.shapes(phase)
        out = []
        for name, shape in shapes.items():
            a = np.asarray(parts[name], np.float64)
            if a.shape != shape:
                raise InputError(f"{phase}.{name} has shape {a.shape}, the plan declares {shape}", where="plan")
            out.append(a.ravel())
        return np.concatenate(out).astype(np.float32)

    def unpack(self, phase: str, vector: np.ndarray) -> dict[str, np.ndarray]:
        out, i = {}, 0
        v = np.asarray(vector, np.float64)
        for name, shape in self.shapes(phase).items():
            k = int(np.prod(shape))
            out[name] = v[i : i + k].reshape(shape)
            i += k
        return out

    # --- the models whose weights travel -----------------------------------------------------
    def new_policies(self, member: int) -> dict[str, Any]:
        """Fresh engine and client models of one member (seeded: every party builds the same)."""
        assert self.layout is not None, "the layout is fixed after stats2"
        lay, o = self.layout, self.options
        pols: dict[str, Any] = {}
        for s in range(self.n_scen):
            th.manual_seed(o.seed * 1000 + member * 17 + s)
            pols[f"engine{s}"] = gaussian_policy(lay.n_engine_inputs, len(lay.action), list(o.engine_arch))
            th.manual_seed(o.seed * 1000 + member * 17 + 100 + s)
            pols[f"client{s}"] = gaussian_policy(lay.n_client_inputs, lay.n_model_outputs, list(o.net_arch))
        return pols

    @staticmethod
    def _travels(name: str) -> bool:
        # log_std is set from the pooled residuals; value heads are unused by behaviour cloning
        return name != "log_std" and "value_net" not in name

    @property
    def policy_size(self) -> int:
        pols = self.new_policies(0)
        return int(sum(v.numel() for p in pols.values() for k, v in p.state_dict().items() if self._travels(k)))

    def policy_vector(self, pols: Mapping[str, Any]) -> np.ndarray:
        parts = []
        for key in sorted(pols):
            for k, v in pols[key].state_dict().items():
                if self._travels(k):
                    parts.append(v.detach().cpu().numpy().ravel())
        return np.concatenate(parts).astype(np.float32)

    def load_policy_vector(self, pols: Mapping[str, Any], vector: np.ndarray) -> None:
        v = np.asarray(vector, np.float32)
        i = 0
        for key in sorted(pols):
            sd = pols[key].state_dict()
            new = {}
            for k, t in sd.items():
                if self._travels(k):
                    n = t.numel()
                    new[k] = th.as_tensor(v[i : i + n].reshape(tuple(t.shape)).copy())
                    i += n
            pols[key].load_state_dict(new, strict=False)
        if i != self.policy_size:
            raise InputError(f"parameter vector has {v.size} values, the models need {i}", where="weights")

    def block_slices(self) -> list[tuple[int, slice]]:
        """``(scenario, slice of the policy vector)`` of each scenario's engine and client blocks."""
        pols = self.new_policies(0)
        out, i = [], 0
        for key in sorted(pols):
            n = int(sum(v.numel() for k, v in pols[key].state_dict().items() if self._travels(k)))
            out.append((int(key.removeprefix("engine").removeprefix("client")), slice(i, i + n)))
            i += n
        return out

