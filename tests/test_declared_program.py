"""Declared dynamics compiled into one call per tick (`edgetwin.contract.dynamics_program`, issue 47):
numexpr's own programs copied instruction for instruction give `DeclaredDynamics.next_state`'s
numbers to the bit, and anything else is left to `next_state`."""

from __future__ import annotations

import numpy as np
import pytest

from edgetwin.contract.dynamics import Declaration, DeclaredDynamics
from edgetwin.contract.dynamics_program import compile_program
from edgetwin.emulator.cluster import DECLARED_DYNAMICS

PROFILE = ["profile.site_vcpu", "profile.w"]
STATE = ["state.site_reserved", "state.site_util", "state.site_backlog_s", "state.site_background", "state.q"]
ACTION = ["action.a", "action.b"]
OUTPUTS = ["kpi.reserved_vcpu", "kpi.edge_cpu", "response.r"]
BOUNDS = {"state.site_reserved": (0.0, 20.0), "state.site_util": (0.0, 1.0), "state.site_backlog_s": (0.0, 3600.0),
          "state.q": (None, 50.0), "state.site_background": (None, None)}


def _dynamics(raw: list[dict], step: float = 900.0) -> DeclaredDynamics:
    decls = tuple(Declaration.parse(d, i) for i, d in enumerate(raw, start=1))
    return DeclaredDynamics(decls, step, {d.column: BOUNDS[d.column] for d in decls})


def _tick(n: int, sites: int, seed: int, odd: bool) -> tuple[np.ndarray, ...]:
    """Columns of one tick; ``odd``: NaNs, infinities, signed zeros, zero divisors, values past the bounds."""
    rng = np.random.default_rng(seed)
    blocks = [rng.standard_normal((n, len(c))) * rng.choice([1e-3, 1.0, 1e3], (n, len(c))) for c in (PROFILE, STATE, ACTION, OUTPUTS)]
    if odd:
        for b in blocks:
            m = rng.random(b.shape)
            b[m < 0.03] = np.nan
            b[m < 0.015] = -np.nan  # a NaN with its sign bit set
            b[(m >= 0.03) & (m < 0.05)] = np.inf
            b[(m >= 0.05) & (m < 0.08)] = -0.0
            b[(m >= 0.08) & (m < 0.11)] = 0.0
    site = np.sort(rng.integers(0, sites, n)) if seed % 2 else rng.integers(0, sites, n)
    return (*blocks, site.astype(np.int64))


def _both(dyn: DeclaredDynamics, tick: tuple[np.ndarray, ...], sites: int) -> tuple[np.ndarray, np.ndarray]:
    profile, state, action, outputs, site = tick
    cols = {c: b[:, j] for names, b in zip((PROFILE, STATE, ACTION, OUTPUTS), tick[:4], strict=True) for j, c in enumerate(names)}
    want = state.copy()
    with np.errstate(all="ignore"):
        for c, v in dyn.next_state(cols, site, sites).items():
            want[:, STATE.index(c)] = v
    prog = compile_program(dyn, (PROFILE, STATE, ACTION, OUTPUTS), STATE)
    assert prog is not None
    got = prog.apply(profile, state, action, outputs, site, state.copy(), sites)
    return got, want


@pytest.mark.parametrize("odd", [False, True])
def test_the_emulated_clusters_declarations_are_next_states_bits(odd: bool) -> None:
    dyn = _dynamics(list(DECLARED_DYNAMICS))
    for seed in range(4):
        got, want = _both(dyn, _tick(300, 17, seed, odd), 17)
        assert got.tobytes() == want.tobytes(), seed


EXPRESSIONS = [
    "state.q / 2.0 - 3 * action.a",  # numexpr turns the division by 2.0 into a product by 0.5
    "-(action.a) + 1 / 3 + dt * 2",
    "(action.a + action.b) * (action.a - action.b) / (profile.w - 0.25)",
    "mean(kpi.edge_cpu * action.a - response.r) / profile.site_vcpu",
    "sum(kpi.edge_cpu / 7.0) - mean(response.r) * 1e-3 + state.site_background",
    "action.a",
    "2.5",
    "sum(kpi.reserved_vcpu)",
    "state.q - 7 / dt + (1 + 2) * 0.1",
    "action.a ** 3 - state.q ** 2",  # numexpr's powers by small integers: products
    "-(-(state.q) - -(action.b)) * -(kpi.edge_cpu)",
]


@pytest.mark.parametrize("text", EXPRESSIONS)
@pytest.mark.parametrize("odd", [False, True])
def test_arithmetic_expressions_and_queues_are_next_states_bits(text: str, odd: bool) -> None:
    """Each expression as a ``next`` and as a queue's arrivals (with its own dt and max), the queue's
    service another expression: numexpr's rewrites (reciprocals, folded constants) and all."""
    dyn = _dynamics([{"column": "state.q", "next": text},
                     {"column": "state.site_backlog_s", "queue": {"arrivals": text, "service": "action.b * 0.5", "dt": 60, "max": 100}},
                     {"column": "state.site_util", "queue": {"arrivals": text, "service": "1"}}], step=900.0)
    for seed in range(3):
        got, want = _both(dyn, _tick(200, 9, seed, odd), 9)
        assert got.tobytes() == want.tobytes(), (text, seed)
        assert not np.array_equal(got, _tick(200, 9, seed, odd)[1]) or odd  # the declared columns were written


@pytest.mark.parametrize("raw", [
    {"column": "state.q", "next": "exp(action.a)"},  # a transcendental function: numexpr's, not copied
    {"column": "state.q", "next": "max(kpi.edge_cpu) / profile.site_vcpu"},  # a max aggregate
    {"column": "state.q", "next": "where(action.a > 0, 1.0, action.b)"},  # a comparison
    {"column": "state.q", "next": "action.a ** 0.3"},  # numexpr's power by a non-integer
])
def test_what_the_program_does_not_copy_is_left_to_next_state(raw: dict) -> None:
    assert compile_program(_dynamics([raw]), (PROFILE, STATE, ACTION, OUTPUTS), STATE) is None
