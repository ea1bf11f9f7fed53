"""`Simulation`: a twin's world of agents on sites, stepped in one batch per tick.

The engine under every environment (`edgetwin.twin.envs`), `Twin.rollout`, the what-if engine and
the counterfactual replays of `edgetwin.twin.fidelity`. It reads the fitted twin through
`SimulatedTwin`, the few attributes it needs, so that it sits below `edgetwin.twin.twin` (which
fits, saves and loads twins and builds simulations) rather than beside it in an import cycle.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pandas as pd
import torch as th

from edgetwin.contract.logs import ordered_columns
from edgetwin.contract.policy import PlatformPolicy
from edgetwin.contract.spec import REWARD_COLUMN, TwinSpec
from edgetwin.imitation.layout import Layout
from edgetwin.imitation.mail import GaussianModel, numpy_forward
from edgetwin.imitation.noise import OutputNoise, noise_residuals, stack_tables
from edgetwin.imitation.split import SplitNetwork
from edgetwin.imitation.world import Composition, InitialStates, World
from edgetwin.twin.forward import GroupedForward, ScenarioOrder
from edgetwin.twin.fused import FusedTick
from edgetwin.twin.member import Member
from edgetwin.twin.support import ProfileSupport, SupportIndex

__all__ = ["RolloutRecord", "SimulatedTwin", "Simulation", "StepResult", "normals"]

log = logging.getLogger(__name__)


class SimulatedTwin(Protocol):
    """What a `Simulation` reads of a twin; `edgetwin.twin.twin.Twin` is the implementation.

    Attributes:
        layout: roles, scalers and horizon; members: the ensemble; population: the population
            model (``.sample(n, scenario, seed) -> DataFrame``); composition: logged site units;
            initial: logged initial states; support: the logs' support.
        action_low, action_high: ``(A,)`` finite action bounds.
        profile_retries: redraws of a generated profile outside the logs' support.
        member_models: per member, the client models by scenario (``mean`` / ``sample``).
        member_transitions: per member, the site-aware transition models by scenario, or None.
    """

    layout: Layout
    members: list[Member]
    population: Any
    composition: Composition
    initial: InitialStates
    support: SupportIndex
    action_low: np.ndarray
    action_high: np.ndarray
    profile_retries: int
    member_models: list[dict[int, Any]]
    member_transitions: list[dict[int, GaussianModel] | None]

    @property
    def spec(self) -> TwinSpec: ...

    @property
    def n_members(self) -> int: ...

    @property
    def profile_support(self) -> ProfileSupport: ...


@dataclass
class StepResult:
    """One tick of a `Simulation`: raw arrays, row-aligned with the simulation's agents."""

    obs: np.ndarray
    action: np.ndarray
    outputs: np.ndarray
    next_state: np.ndarray
    reward: np.ndarray
    disagreement: np.ndarray


@dataclass
class RolloutRecord:
    frame: pd.DataFrame
    support: dict[str, float]

    @staticmethod
    def concat(records: list[RolloutRecord], threshold: float) -> pd.DataFrame:
        """One log table of several runs; ``attrs["support"]`` = their support reports averaged."""
        df = pd.concat([r.frame for r in records], ignore_index=True)
        keys = ("out_of_support", "median_distance", "disagreement", "profile_redrawn", "profile_outside")
        df.attrs["support"] = {k: float(np.mean([r.support[k] for r in records])) for k in keys}
        df.attrs["support"]["threshold"] = threshold
        return df


_TWO_PI = np.float32(2.0 * np.pi)


def normals(rng: np.random.Generator, shape: tuple[int, int]) -> np.ndarray:
    """``shape`` float32 standard normals drawn from ``rng`` by the Box-Muller transform.

    Why not ``rng.standard_normal(dtype=float32)``: numpy's ziggurat takes ~8 ns a draw here, 0.9 ms
    of a 10,000-agent tick (11 outputs each), more than the whole rest of the response path; the
    transform's vectorised log, sqrt, cos and sin take ~3 ns. Exactly normal in distribution (the
    radius from a float64 uniform: tails to 8.5 sigma; the angle from a float32 one), a different
    stream than the ziggurat's: a seed gives other draws than before this change, and the same
    draws every time (the same seed, the same bits).
    """
    k = shape[0] * shape[1]
    m = (k + 1) // 2
    r = rng.random(m)  # [0, 1): 1 - r is in (0, 1], its log finite
    angle = rng.random(m, dtype=np.float32)
    np.subtract(1.0, r, out=r)
    np.log(r, out=r)
    r *= -2.0
    np.sqrt(r, out=r)
    angle *= _TWO_PI
    out = np.empty(2 * m, np.float32)
    np.cos(angle, out=out[:m])
    np.sin(angle, out=out[m:])
    r32 = r.astype(np.float32)
    out[:m] *= r32
    out[m:] *= r32
    return out[:k].reshape(shape)


class Simulation:
    """A twin world of agents on sites, stepped in one batch per tick.

    Args:
        twin: the twin.
        n_agents: agents (default: one logged site unit's worth, drawn at each reset).
        seed: seeds population, initial states, acting member and response noise.
        stochastic: sample responses from the client models' Gaussians (else their means).
        member: fix the acting ensemble member (default: drawn per reset).

    The element-wise part of a tick runs fused (`edgetwin.twin.fused.FusedTick`: the same numbers
    to the bit, a few compiled passes instead of ~40 numpy ones) when the twin's structure allows;
    set ``use_fused = False`` on an instance to run the numpy passes (what the tests compare).
    """

    #: run the element-wise part of a tick fused where the twin allows (`fused_tick`)
    use_fused: bool = True

    def __init__(
        self,
        twin: SimulatedTwin,
        n_agents: int | None = None,
        seed: int = 0,
        stochastic: bool = True,
        member: int | None = None,
    ) -> None:
        self.twin = twin
        self.layout = twin.layout
        self.n_agents = n_agents
        self.stochastic = stochastic
        self.fixed_member = member
        self.rng = np.random.default_rng(seed)
        self._reward_fn = (
            twin.spec.reward_fn() if (twin.spec.reward_weights or twin.spec.reward_function) else None
        )
        #: the spec's own reward; a caller that replaces `_reward_fn` (training with another reward or
        #: constraints) gets the numpy passes, which call it (the fused tick computes the spec's)
        self._spec_reward_fn = self._reward_fn
        self.world: World
        #: per client model: its std, looked up once (`_std`; a twin's models do not train)
        self._stds: dict[int, tuple[Any, np.ndarray]] = {}
        #: per client model: its `SplitNetwork` (or None), looked up once (`_split`)
        self._splits: dict[int, tuple[Any, SplitNetwork | None]] = {}
        #: per (member, scenario): the first layer's profile part of the scenario's agents, kept
        #: while the world's profiles, scenarios and the network's weights are the same objects
        self._profile_h: dict[tuple[int, int], tuple[Any, ...]] = {}
        #: the twin's action bounds ``(low, high, low rows, high rows)`` for the last row count
        self._action_bounds: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None = None
        #: ``(scenario array, acting models, (N, Y) std)``: `_agent_std`
        self._agent_stds: tuple[np.ndarray, list[Any], np.ndarray] | None = None
        #: ``((member, layout id), FusedTick | None)`` of the last `fused_tick`
        self._fused: tuple[tuple[int, int], FusedTick | None] | None = None
        #: ``(world scenarios, their ScenarioOrder, (world sites, sites in that order) | None)``
        self._orders: tuple[np.ndarray, ScenarioOrder, tuple[np.ndarray, np.ndarray] | None] | None = None
        #: the client networks of a tick's scenarios, with their kept work arrays
        self._network = GroupedForward()
        #: the tick's pending legal z-values of the outputs ``(N, Y)`` float32 (kept while a
        #: `FusedTick` can end the tick; None otherwise)
        self._pending_zy: np.ndarray | None = None
        self.member = 0
        self.site_names: list[str] = []
        self.agent_names: list[str] = []
        self.reset()

    @property
    def n(self) -> int:
        return self.world.n

    def reset(self, seed: int | None = None) -> np.ndarray:
        """New agents and initial states; returns the observations ``(N, P+S)``."""
        if seed is not None:
            self.rng = np.random.default_rng(seed)
        lay = self.layout
        composition = self.twin.composition
        scen, site, units = composition.sample_units(self.rng, self.n_agents)
        profile = np.zeros((len(scen), len(lay.profile)))
        retries = self.twin.profile_retries if lay.profile else 0
        redrawn, outside = 0, 0
        for s in np.unique(scen):
            idx = np.flatnonzero(scen == s)
            for attempt in range(retries + 1):
                drawn = lay.scalers["profile"].legalise(
                    self._draw_profiles(len(idx), lay.scenarios[s], int(self.rng.integers(2**31)))
                )
                # a site constant is its logged site's, not the population model's
                profile[idx] = composition.site_values(drawn, units, site[idx], "profile")
                if retries == 0:
                    break
                ok = self.twin.profile_support.inside(int(s), lay.scalers["profile"].transform(profile[idx]))
                if attempt == 0:
                    redrawn += int((~ok).sum())
                idx = idx[~ok]
                if len(idx) == 0:
                    break
            outside += len(idx) if retries else 0
        profile = lay.scalers["profile"].legalise(profile)
        #: share of this population's first-drawn profiles that were out of support (and redrawn),
        #: and of its final profiles still out of support after ``profile_retries`` redraws
        self.profile_redrawn = redrawn / max(1, len(scen))
        self.profile_outside = outside / max(1, len(scen))
        state = self.twin.initial.sample(lay, scen, profile, self.rng)
        # a site-level state starts where its logged site started (one value for all its agents)
        state = composition.site_values(state, units, site, "state")
        n_sites = int(site.max()) + 1
        self.member = (
            self.fixed_member
            if self.fixed_member is not None
            else int(self.rng.integers(self.twin.n_members))
        )
        self.place(World(lay, scen, site, profile, state, np.zeros((n_sites, lay.n_lag))))
        self.site_names = composition.site_names(units)
        self.agent_names = [f"agent{i}" for i in range(len(scen))]
        return self.obs()

    def _draw_profiles(self, n: int, scenario: str, seed: int) -> np.ndarray:
        """``(n, P)`` raw profiles (the layout's order) of ``scenario`` from the population model,
        seeded: ``population.sample(n, scenario, seed)[layout.profile]`` as float64.

        A population model that offers ``sample_profiles`` (`edgetwin.generative.PopulationModel`)
        gives the same draws as one array, without the DataFrame `sample` builds (~60 % of a
        reset, issue 47); the layout's columns are taken from it by position.
        """
        pop = self.twin.population
        fast = getattr(pop, "sample_profiles", None)
        if fast is None:
            return pop.sample(n, scenario=scenario, seed=seed)[self.layout.profile].to_numpy(np.float64)
        names = list(pop.spec.names("profile"))
        if names == list(self.layout.profile):
            return np.asarray(fast(n, scenario=scenario, seed=seed), dtype=np.float64)
        cols = [names.index(c) for c in self.layout.profile]
        return np.asarray(fast(n, scenario=scenario, seed=seed), dtype=np.float64)[:, cols]

    def place(self, world: World) -> None:
        """Run this simulation on ``world`` (e.g. agents and states taken from a log) from its tick.

        The world gets the acting member's site-state model, and the tick's pending responses are
        cleared. Agent and site names are kept when their counts still match.
        """
        world.site_model = self.twin.members[self.member].site_model if self.twin.members else None
        self.world = world
        lay = self.layout
        self._pending_y = np.zeros((world.n, lay.n_model_outputs), np.float32)
        self._pending_a = np.zeros((world.n, len(lay.action)))
        # what `World.apply` would compute from the two above, kept row by row as they change:
        # raw outputs = inverse(pending y), standardised actions = transform(pending a)
        ny = lay.n_outputs
        self._pending_out = (
            lay.scalers["outputs"].inverse(self._pending_y[:, :ny]) if ny else np.zeros((world.n, 0))
        )
        self._pending_za = lay.scalers["action"].transform(self._pending_a)
        self._pending_zy = (
            lay.scalers["outputs"].legal_z(self._pending_y[:, :ny]) if self.fused_tick() is not None else None
        )
        if len(self.agent_names) != world.n:
            self.agent_names = [f"agent{i}" for i in range(world.n)]
        if len(self.site_names) != world.n_sites:
            self.site_names = [f"site{k}" for k in range(world.n_sites)]

    def obs(self) -> np.ndarray:
        """``(N, P+S)`` raw ``[profile.*, state.*]``: what the platform policy sees."""
        return np.concatenate([self.world.profile, self.world.state], axis=1, dtype=np.float32)

    def legal_action(self, action: np.ndarray) -> np.ndarray:
        """Raw actions ``(n, A)`` clipped to the twin's action bounds, discrete ones snapped."""
        action = np.array(action, dtype=np.float64).reshape(-1, len(self.layout.action))  # our own copy
        # the bounds as full rows, kept for the last n: np.maximum / np.minimum against (n, A)
        # operands are several times np.clip against (A,) ones (numpy's inner loop per row of 3);
        # `legalise` then clips to the scaler's bounds and makes every zero +0.0
        n = len(action)
        lo, hi = self.twin.action_low, self.twin.action_high
        kept = self._action_bounds
        if kept is None or kept[0] is not lo or kept[1] is not hi or len(kept[2]) != n:
            kept = self._action_bounds = (lo, hi, np.tile(lo, (n, 1)), np.tile(hi, (n, 1)))
        np.maximum(action, kept[2], out=action)
        np.minimum(action, kept[3], out=action)
        return self.layout.scalers["action"].legalise(action)

    def respond(
        self, rows: np.ndarray, action: np.ndarray, with_disagreement: bool = True
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The responses of agents ``rows`` to raw actions ``(len(rows), A)`` at this tick.

        The client model is causal per agent, so this needs no other agent's action of the tick.
        The responses are kept until `end_tick` applies them.

        Returns:
            ``(raw outputs (n, Y), reward (n,), disagreement (n,))``.
        """
        rows = np.asarray(rows, dtype=np.int64)
        if len(rows) == 0:  # nobody acts: nothing to respond, nothing pending changes
            return np.zeros((0, self.layout.n_outputs)), np.zeros(0), np.zeros(0)
        everyone = len(rows) == self.world.n and bool(np.array_equal(rows, np.arange(self.world.n)))
        return self._respond(None if everyone else rows, action, with_disagreement)

    def _respond(
        self, rows: np.ndarray | None, action: np.ndarray, with_disagreement: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """`respond` of agents ``rows`` (None: every agent, in order, which a tick of `step` is:
        then no row index is gathered or scattered, the arrays are used whole)."""
        lay, w = self.layout, self.world
        n = w.n if rows is None else len(rows)
        disagreement = np.zeros(n)
        models = self.twin.member_models
        if rows is None:
            groups = w.scenario_rows()
        else:
            scen = w.scenario[rows]
            groups = [(int(s), np.flatnonzero(scen == s)) for s in np.unique(scen)]
        ny = lay.n_outputs
        every = with_disagreement and len(models) > 1
        used = range(len(models)) if every else (self.member,)
        split = all(self._split(models[m][s]) is not None for s, _ in groups for m in used)
        fused = self.fused_tick() if split else None
        # the call's rows scenario by scenario: each scenario's network runs on a contiguous block
        order = self._scenario_order(groups, n, rows is None) if split else None
        if fused is not None:
            # the action's bounds and z-values and the per-agent inputs (in scenario order) in one pass
            assert order is not None
            mzs = w.model_zstate()
            action, za, agent_x = fused.legal_actions(
                np.asarray(action).reshape(n, -1), self.twin.action_low, self.twin.action_high,
                mzs if rows is None else mzs[rows], order.pos,
            )
        else:
            action = self.legal_action(np.asarray(action).reshape(n, -1))
            za = lay.scalers["action"].transform(action)
        mu_p: np.ndarray | None = None  # the acting member's means in scenario order (split networks)
        with th.no_grad():  # one grad-mode switch per tick, not one per network call
            if split:
                # the first layer by blocks (`SplitNetwork`): no (n, in) input array is assembled
                assert order is not None
                site_x = w.client_site_inputs()
                if fused is None:
                    agent_x = np.ascontiguousarray(w.client_agent_inputs(za, rows)[order.perm])
                sites = self._order_sites(order, rows)
                outs = {m: self._grouped(m, order, agent_x, sites, site_x, rows, slot=k) for k, m in enumerate(used)}
                if every:
                    means = np.stack([outs[m] for m in range(len(models))])  # (M, n, out), scenario order
                    disagreement = means.std(axis=0).mean(axis=1)[order.pos]
                    mu_p = means[self.member]
                else:
                    mu_p = outs[self.member]
            else:
                x = w.client_inputs(action, rows, za=za)
                y = np.zeros((n, lay.n_model_outputs), np.float32)
                for s, idx in groups:
                    xs = x[idx]
                    per = {m: self._forward(models[m][s], xs) for m in used}
                    if every:
                        stacked = np.stack([per[m] for m in range(len(models))])  # (M, n_s, out)
                        disagreement[idx] = stacked.std(axis=0).mean(axis=1)
                        y[idx] = stacked[self.member]
                    else:
                        y[idx] = per[self.member]
        noise, std, tables = None, None, None
        if self.stochastic and ny:
            # noise on the outputs only: fed into Δstate it would compound into drift far beyond
            # the logged noise. One draw for the call's agents in row order, float32 throughout as
            # `y` is kept (`normals`: Box-Muller, 3x numpy's ziggurat), scaled by each agent's
            # scenario's std, or mapped through the member's noise model by predicted level
            # (`_level_noise`; the fused tick maps them in its noise pass) where it has one
            noise = normals(self.rng, (n, ny))
            tables = self._noise_tables()
            if fused is None or tables is None:
                std = self._agent_std()
                if rows is not None:
                    std = std[rows]
        zy: np.ndarray | None = None
        if fused is not None:
            # the means back in row order, noise (mapped by predicted level in the same pass where
            # the member has a noise model), clip, the outputs' inverse and bounds and their
            # z-values in two passes
            assert mu_p is not None and order is not None
            level = None
            if noise is not None and tables is not None:
                level = (w.scenario if rows is None else w.scenario[rows], tables)
            outputs, zy, y = fused.outputs(mu_p, order.pos, noise, std, level)
        else:
            if mu_p is not None and order is not None:
                y = mu_p[order.pos]  # row order (a fresh array)
            if noise is not None:
                noise, std = self._level_noise(noise, std, y, np.arange(n, dtype=np.int64), rows)
                noise *= std
                noise += y[:, :ny]
                np.clip(noise, -10.0, 10.0, out=y[:, :ny])
            outputs = lay.scalers["outputs"].inverse(y[:, :ny]) if ny else np.zeros((n, 0))
            if self._pending_zy is not None:
                zy = lay.scalers["outputs"].legal_z(y[:, :ny])
        if rows is None:
            # whole arrays: slice assignment, not a scatter through ``arange(N)``; ``y`` and ``za``
            # are this call's own arrays, handed to nobody else: kept as they are, not copied
            self._pending_y = y
            self._pending_a[:] = action
            self._pending_za = za
            self._pending_out[:] = outputs
            if zy is not None:
                self._pending_zy = zy
            profile, state = w.profile, w.state
        else:
            self._pending_y[rows] = y
            self._pending_a[rows] = action
            self._pending_za[rows] = za
            self._pending_out[rows] = outputs
            if zy is not None and self._pending_zy is not None:
                self._pending_zy[rows] = zy
            profile, state = w.profile[rows], w.state[rows]
        if fused is not None:
            reward = fused.reward_of(profile, state, action, outputs)
        else:
            reward = self._reward(profile, state, action, outputs)
        return outputs, reward, disagreement

    def fused_tick(self) -> FusedTick | None:
        """The `FusedTick` of this twin with the acting member (None: the numpy passes run, because
        `use_fused` is off or the twin's structure needs them; `FusedTick.of`)."""
        if not self.use_fused or self._reward_fn is not self._spec_reward_fn:
            return None
        key = (self.member, id(self.layout))
        if self._fused is None or self._fused[0] != key:
            self._fused = (key, FusedTick.of(self.twin, self.member))
        return self._fused[1]

    def _forward(self, model: Any, x: np.ndarray) -> np.ndarray:
        """``model.mean(x)``, the client network's mean ``(n, out)`` float32 (a fresh array).

        For a plain MLP (SB3's default policy) the model's layers run here under the caller's
        ``no_grad`` with numpy's activations (`numpy_forward`: torch's linear layers, numpy's
        float32 ``tanh``, within one ulp of `GaussianModel.mean`'s), one call per scenario of a tick.
        """
        layers = model.numpy_layers() if isinstance(model, GaussianModel) else None
        if layers is None or len(x) == 0:
            return np.array(model.mean(x), dtype=np.float32)  # (a copy: the caller writes into it)
        return numpy_forward(layers, x)

    def _split(self, model: Any) -> SplitNetwork | None:
        """The `SplitNetwork` of a client model (looked up once per model), None when it is not a
        plain MLP over the client inputs."""
        hit = self._splits.get(id(model))
        if hit is None or hit[0] is not model:
            lay = self.layout
            layers = model.numpy_layers() if isinstance(model, GaussianModel) else None
            net = SplitNetwork.of(layers, len(lay.profile), len(lay.state) + len(lay.action), lay.n_client_inputs)
            hit = self._splits[id(model)] = (model, net)
        return hit[1]

    def _split_forward(
        self, m: int, s: int, xa: np.ndarray, sites: np.ndarray, site_x: np.ndarray, rows: np.ndarray | None
    ) -> np.ndarray:
        """Member ``m``'s client network of scenario ``s`` on its agents of this tick: ``xa (n, S+A)``
        their per-agent inputs (`World.client_agent_inputs`), ``sites (n,)`` their sites, ``site_x``
        every site's inputs (`World.client_site_inputs`), ``rows`` their rows in the world (None:
        all of the scenario's agents, in order). ``(n, out)`` float32, a fresh array: one scenario
        through `SplitNetwork.forward` (a tick runs every scenario at once, `_grouped`)."""
        net = self._split(self.twin.member_models[m][s])
        assert net is not None
        own, hp = self._profile_part(m, s, net)
        if rows is not None:
            hp = hp[np.searchsorted(own, rows)]
        return net.forward(xa, hp, net.site_part(site_x), sites)

    def _profile_part(self, m: int, s: int, net: SplitNetwork) -> tuple[np.ndarray, np.ndarray]:
        """``(rows of scenario s's agents (n_s,), their first layer's profile part (n_s, H))`` of
        member ``m``'s network: kept for the episode (while the world's profiles and scenarios and
        the network's weights are the same)."""
        w = self.world
        key = (m, s)
        hit = self._profile_h.get(key)
        if hit is None or hit[0] is not w.profile or hit[1] is not w.scenario or hit[2] is not net or hit[3] != net.version():
            own = dict(w.scenario_rows()).get(s, np.zeros(0, np.int64))
            hit = self._profile_h[key] = (w.profile, w.scenario, net, net.version(), own, net.profile_part(w.zprofile()[own]))
        return hit[4], hit[5]

    def _scenario_order(self, groups: list[tuple[int, np.ndarray]], n: int, whole: bool) -> ScenarioOrder:
        """The `ScenarioOrder` of a call's ``groups`` (kept for a whole tick while the world's
        scenarios are the same array)."""
        if not whole:
            return ScenarioOrder.of(groups, n)
        hit = self._orders
        if hit is None or hit[0] is not self.world.scenario:
            hit = self._orders = (self.world.scenario, ScenarioOrder.of(groups, n), None)
        return hit[1]

    def _order_sites(self, order: ScenarioOrder, rows: np.ndarray | None) -> np.ndarray:
        """``(n,)`` int64 the sites of the call's rows in scenario order (kept for a whole tick)."""
        w = self.world
        if rows is not None:
            return np.ascontiguousarray(w.site[rows][order.perm], np.int64)
        hit = self._orders
        assert hit is not None and hit[1] is order
        if hit[2] is None or hit[2][0] is not w.site:
            self._orders = (hit[0], order, (w.site, np.ascontiguousarray(w.site[order.perm], np.int64)))
            hit = self._orders
        assert hit[2] is not None
        return hit[2][1]

    def _grouped(
        self, m: int, order: ScenarioOrder, agent_x: np.ndarray, sites: np.ndarray, site_x: np.ndarray,
        rows: np.ndarray | None, slot: int = 0,
    ) -> np.ndarray:
        """Member ``m``'s client networks of every scenario on the call's agents at this tick (rows
        ``rows`` of the world, None: all): ``agent_x (n, S+A)`` float32 their per-agent inputs and
        ``sites (n,)`` their sites, both in scenario order (``order``), ``site_x`` every site's
        inputs. ``(n, out)`` float32 means in scenario order, in a work array the next call with the
        same ``slot`` overwrites (`GroupedForward`)."""
        models = self.twin.member_models[m]
        nets: list[SplitNetwork] = []
        hps: list[np.ndarray] = []
        for s, idx in order.groups:
            net = self._split(models[s])
            assert net is not None
            own, hp = self._profile_part(m, s, net)
            nets.append(net)
            hps.append(hp if rows is None else hp[np.searchsorted(own, rows[idx])])
        return self._network.run(nets, order, agent_x, hps, site_x, sites, slot)

    def _agent_std(self) -> np.ndarray:
        """``(N, Y)`` float32 the acting member's output std of each agent's scenario (`_std`),
        kept while the world's scenarios and the acting models are the same objects."""
        w = self.world
        models = self.twin.member_models[self.member]
        acting = [models[s] for s, _ in w.scenario_rows()]
        hit = self._agent_stds
        if hit is None or hit[0] is not w.scenario or any(a is not b for a, b in zip(hit[1], acting, strict=True)):
            ny = self.layout.n_outputs
            std = np.zeros((w.n, ny), np.float32)
            for (_s, idx), model in zip(w.scenario_rows(), acting, strict=True):
                std[idx] = self._std(model)[:ny]
            hit = self._agent_stds = (w.scenario, acting, std)
        return hit[2]

    def _level_noise(
        self, eps: np.ndarray, std: np.ndarray | None, mu: np.ndarray, pos: np.ndarray, rows: np.ndarray | None
    ) -> tuple[np.ndarray, np.ndarray | None]:
        """``(noise, scale)`` of the call's rows, both ``(n, Y)`` float32, whose product the tick
        adds to the means: ``(eps, std)`` as they are when the acting member has no noise model;
        else the model's noise of each row (`noise_residuals`: its prediction ``mu[pos[i]]``, its
        draw ``eps[i]``, its scenario's table) and a scale of ones (``x * 1.0f`` is ``x``)."""
        tables = self._noise_tables()
        if tables is None:
            return eps, std
        scen = self.world.scenario if rows is None else self.world.scenario[rows]
        out = np.empty(eps.shape, np.float32)
        noise_residuals(np.ascontiguousarray(mu, np.float32), np.ascontiguousarray(pos, np.int64),
                        np.ascontiguousarray(scen, np.int64), eps, *tables, out)
        ones = self.__dict__.get("_ones")
        if ones is None or ones.shape != out.shape:
            ones = self.__dict__["_ones"] = np.ones(out.shape, np.float32)
        return out, ones

    def _noise_tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """The acting member's noise tables stacked by scenario id (`stack_tables`; a scenario it
        has none for draws with its model's one std), or None when it has none; kept per member."""
        member = self.twin.members[self.member] if self.twin.members else None
        noise = None if member is None else member.noise
        hit = self.__dict__.get("_noise_memo")
        if hit is not None and hit[0] is noise and hit[1] == self.member:
            return hit[2]  # type: ignore[no-any-return]
        tables = None
        if noise is not None:
            ny = self.layout.n_outputs
            models = self.twin.member_models[self.member]
            per = [noise.get(s) or OutputNoise.homoscedastic(self._std(models[s])[:ny])
                   for s in range(len(self.layout.scenarios))]
            if any(m.width != ny for m in per):
                raise ValueError(f"member {self.member}'s output noise model is not of the twin's {ny} outputs")
            tables = stack_tables(per)
        self.__dict__["_noise_memo"] = (noise, self.member, tables)
        return tables

    def _std(self, model: Any) -> np.ndarray:
        """``(out,)`` float32 std of a client model's Gaussian, kept per model."""
        hit = self._stds.get(id(model))
        if hit is None or hit[0] is not model:
            hit = self._stds[id(model)] = (model, np.asarray(model.std, dtype=np.float32))
        return hit[1]

    @property
    def pending_action(self) -> np.ndarray:
        """``(N, A)`` the legal actions of this tick so far (what `end_tick` will apply); a copy."""
        return self._pending_a.copy()

    def override_outputs(self, rows: np.ndarray, outputs: np.ndarray) -> None:
        """Replace the pending raw outputs ``(len(rows), Y)`` of agents ``rows`` at this tick.

        `end_tick` then moves the world by them: the next tick's site aggregates and the
        site-level state see the replaced outputs (a what-if that perturbs responses).
        """
        rows = np.asarray(rows, dtype=np.int64)
        ny = self.layout.n_outputs
        if ny:
            legal = self.layout.scalers["outputs"].legalise(np.asarray(outputs, np.float64).reshape(len(rows), ny))
            self._pending_y[rows, :ny] = self.layout.scalers["outputs"].transform(legal)
            self._pending_out[rows] = self.layout.scalers["outputs"].inverse(self._pending_y[rows, :ny])
            if self._pending_zy is not None:
                self._pending_zy[rows] = self.layout.scalers["outputs"].legal_z(self._pending_y[rows, :ny])

    def end_tick(self) -> np.ndarray:
        """Apply the tick's responses: every agent moves to its next state. Returns it ``(N, S)``."""
        ny = self.layout.n_outputs
        fused = self.fused_tick()
        if fused is not None:
            zy = self._pending_zy
            if zy is None or len(zy) != self.world.n:
                zy = self.layout.scalers["outputs"].legal_z(self._pending_y[:, :ny])
            assert zy is not None  # (continuous outputs: `FusedTick.of`)
            return fused.end_tick(self.world, self._pending_a, self._pending_y, self._pending_za, zy, self._pending_out)
        # z of the legal outputs as a clip of y (`ColumnScaler.legal_z`), not through raw units and back
        zy = self.layout.scalers["outputs"].legal_z(self._pending_y[:, :ny]) if ny else None
        _, nxt = self.world.apply(
            self._pending_a,
            self._pending_y,
            self.twin.member_transitions[self.member],
            outputs=self._pending_out,
            za=self._pending_za,
            zy=zy,
        )
        return nxt

    def step(self, action: np.ndarray, with_disagreement: bool = True) -> StepResult:
        """Apply raw platform actions ``(N, A)`` for all agents at this tick and advance."""
        obs = self.obs()
        outputs, reward, disagreement = self._respond(None, action, with_disagreement)
        legal = self._pending_a.copy()
        nxt = self.end_tick()
        return StepResult(obs, legal, outputs, nxt, reward, disagreement)

    def reward_of(
        self, rows: np.ndarray, state: np.ndarray, action: np.ndarray, outputs: np.ndarray
    ) -> np.ndarray:
        """The spec's reward ``(n,)`` of agents ``rows`` given raw state, action and outputs.

        Uses the spec's reward function or weights when it has one, else the predicted ``reward``
        output (zeros when there is neither).
        """
        return self._reward(self.world.profile[rows], state, action, outputs)

    def _reward(
        self, profile: np.ndarray, state: np.ndarray, action: np.ndarray, outputs: np.ndarray
    ) -> np.ndarray:
        """`reward_of` given the agents' raw profiles ``(n, P)`` themselves."""
        cols = step_columns(self.layout, profile, state, action, outputs)
        if self._reward_fn is not None:
            return np.asarray(self._reward_fn(cols), dtype=np.float64).reshape(-1)
        if REWARD_COLUMN in cols:
            return cols[REWARD_COLUMN].astype(np.float64)
        return np.zeros(len(action))

    def run(self, policy: PlatformPolicy, steps: int | None = None, episode: str = "twin-0") -> RolloutRecord:
        """Roll ``policy`` from the current state for ``steps`` ticks; a log table + support report."""
        lay = self.layout
        steps = lay.horizon if steps is None else int(steps)
        cols = ordered_columns(lay.spec, [REWARD_COLUMN])
        blocks: list[dict[str, np.ndarray]] = []
        dis = []
        for t in range(steps):
            obs = self.obs()
            act = np.asarray(policy.act(obs), dtype=np.float64)
            res = self.step(act)
            blk: dict[str, Any] = {"t": np.full(self.n, t)}
            for j, c in enumerate(lay.profile):
                blk[c] = self.world.profile[:, j]
            for j, c in enumerate(lay.state):
                blk[c] = res.obs[:, len(lay.profile) + j].astype(np.float64)
            for j, c in enumerate(lay.action):
                blk[c] = res.action[:, j]
            for j, c in enumerate(lay.outputs):
                blk[c] = res.outputs[:, j]
            blk[REWARD_COLUMN] = res.reward
            blocks.append(blk)
            dis.append(float(res.disagreement.mean()))
        frame = pd.DataFrame({k: np.concatenate([b[k] for b in blocks]) for k in blocks[0]})
        frame.insert(0, "episode", episode)
        frame.insert(2, "agent", np.tile(self.agent_names, steps))
        frame.insert(3, "scenario", np.tile(np.asarray(lay.scenarios)[self.world.scenario], steps))
        frame.insert(4, "site", np.tile(np.asarray(self.site_names)[self.world.site], steps))
        frame = frame[[c for c in cols if c in frame.columns]]
        support = self.support_of(frame)
        support["disagreement"] = float(np.mean(dis)) if dis else 0.0
        support["profile_redrawn"] = self.profile_redrawn
        support["profile_outside"] = self.profile_outside
        return RolloutRecord(frame, support)

    def support_of(self, frame: pd.DataFrame, max_rows: int = 5000) -> dict[str, float]:
        lay = self.layout
        sub = frame.sample(min(max_rows, len(frame)), random_state=0) if len(frame) > max_rows else frame
        z = np.concatenate(
            [
                lay.scalers["profile"].transform(sub[lay.profile].to_numpy(np.float64)),
                lay.model_state(lay.scalers["state"].transform(sub[lay.state].to_numpy(np.float64))),  # declared columns as the models see them
                lay.scalers["action"].transform(sub[lay.action].to_numpy(np.float64)),
            ],
            axis=1,
        )
        score = self.twin.support.score(z)  # distance from the logs in units of the threshold
        return {
            "out_of_support": float((score > 1.0).mean()) if len(score) else 0.0,
            "median_distance": float(np.median(score)) if len(score) else 0.0,
        }


def step_columns(
    layout: Any, profile: np.ndarray, state: np.ndarray, action: np.ndarray, outputs: np.ndarray
) -> dict[str, np.ndarray]:
    """One tick's columns by name, each ``(n,)`` (views of the inputs): profile ``(n, P)``, state
    ``(n, S)``, action ``(n, A)`` and outputs ``(n, O)`` in the layout's column order; what a
    `RewardFn` and the what-if engine's KPIs read."""
    cols: dict[str, np.ndarray] = {}
    for names, arr in ((layout.profile, profile), (layout.state, state), (layout.action, action), (layout.outputs, outputs)):
        for j, c in enumerate(names):
            cols[c] = arr[:, j]
    return cols
