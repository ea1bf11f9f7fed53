"""Declared dynamics: the state columns an operator can write down, computed instead of learned.

A twin learns what nobody can write down (how clients respond) and should not learn what the
operator already knows: its own accounting. A spec's ``[[dynamics]]`` entries say how a state
column moves from tick ``t`` to ``t+1``, in one of three forms::

    [[dynamics]]                       # an expression; sum()/mean()/min()/max() aggregate over
    column = "state.site_reserved"     # the agents of the site at the tick
    next = "sum(kpi.reserved_vcpu) / profile.site_vcpu"

    [[dynamics]]                       # the same aggregate, written as a block
    column = "state.site_reserved"
    aggregate = "sum"                  # sum | mean | min | max
    of = "kpi.reserved_vcpu"           # an expression of each agent's columns
    divide_by = "profile.site_vcpu"    # optional: a site-scoped column (a site constant)

    [[dynamics]]                       # a fluid queue:
    column = "state.site_backlog_s"    # next = clip(now + (arrivals - service) * dt, 0, max)
    queue = { arrivals = "sum(kpi.edge_cpu) / profile.site_vcpu + state.site_background", service = "1" }
    # dt (default: the spec's step_seconds) and max (default: the column's high bound) are optional

    [[dynamics]]                       # or the operator's own function
    column = "state.credits"
    function = "mypkg.accounting:next_credits"   # fn(columns, site) -> (N,) next values

Every name in an expression is a column of the step at ``t`` (``profile.*``, ``state.*``,
``action.*``, and the tick's learned ``response.*`` / ``kpi.*`` / ``reward``) or ``dt``. So a
declared site column *sees the learned per-agent outputs of the same tick*: the twin first draws
every agent's response, then computes the declared columns from them. Expressions are parsed by
`edgetwin.contract.expressions` into a strict grammar (numbers, columns, arithmetic, comparisons,
a fixed list of functions, the aggregates) and refused otherwise before any library sees them;
numexpr then evaluates the text re-printed from the validated tree, never the spec's text (numexpr
itself hands its input to Python's ``eval`` behind a blacklist that can be bypassed). A twin's
fused tick runs the same numexpr programs, copied instruction for instruction into one compiled call
per tick where they are plain arithmetic (`edgetwin.contract.dynamics_program`; the same bits). A
site-scoped column's expression may use agent-scoped columns only inside an aggregate, so that it
is one value per site.

Anything outside the grammar, unknown names, an aggregate inside an aggregate, a function that
cannot be imported, or one that returns the wrong shape are errors naming the spec entry when the
spec is read, not halfway through a fit. `agreement` measures how well declarations reproduce a log (the validator reports it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

import numba
import numpy as np
import pandas as pd

from edgetwin.contract.errors import InputError
from edgetwin.contract.expressions import AGGREGATES, Parsed, parse_expression, shown, variable
from edgetwin.contract.functions import resolve_function_ref

__all__ = [
    "AGGREGATES",
    "DT_NAME",
    "Declaration",
    "DeclaredDynamics",
    "Expression",
    "Replay",
    "agreement",
    "replay",
]

Scope = Literal["agent", "site"]

#: The name of the step length (seconds, the spec's ``step_seconds`` unless a queue sets ``dt``).
DT_NAME = "dt"

#: ``fn(columns: {name: (N,) array at t}, site: (N,) int ids) -> (N,) next values``.
DynamicsFn = Callable[[Mapping[str, np.ndarray], np.ndarray], np.ndarray]


@dataclass(frozen=True)
class Expression:
    """An expression over a step's columns, with site aggregates, validated and compiled for numexpr.

    Built only by `compile`, from a tree that `edgetwin.contract.expressions` checked against the
    grammar: ``outer`` and the aggregates' texts are printed from that tree, never the spec's text.

    Attributes:
        text: the expression as written (or, for an ``aggregate`` block, as its keys compose it).
        outer: the numexpr text with every aggregate replaced by a placeholder ``_agg<k>``.
        aggregates: per placeholder, ``(reduction, inner numexpr text)``.
        outer_names, inner_names: the column names each part reads (original spelling).
    """

    text: str
    outer: str
    aggregates: tuple[tuple[str, str], ...]
    outer_names: tuple[str, ...]
    inner_names: tuple[tuple[str, ...], ...]

    @classmethod
    def compile(cls, text: object, where: str, key: str = "next") -> Expression:
        """Parse ``text`` on the grammar, then compile its re-printed parts for numexpr.

        Raises:
            InputError: naming ``where`` and ``key``: outside the grammar (`parse_expression`), or
                a valid tree numexpr cannot compile or run (e.g. more variables than the 64
                operands numpy's iterator takes), now rather than on the first tick.
        """
        parsed = parse_expression(text, where, key)
        return cls._from(parsed, text if isinstance(text, str) else parsed.printed, where, key)

    @classmethod
    def _from(cls, parsed: Parsed, text: str, where: str, key: str) -> Expression:
        for part in (parsed.outer, *(inner for _, inner in parsed.aggregates)):
            try:  # compiled and run once on one agent: numexpr's limits (e.g. 64 operands) show now
                names = _program(part)[0]
                with np.errstate(all="ignore"):
                    _numexpr(part, {n: np.ones(1) for n in names})
            except Exception as e:  # noqa: BLE001 - numexpr on our own validated text: any failure is the spec's
                raise InputError(
                    f"{where}: cannot compile expression {key} = {shown(text)!r} ({type(e).__name__}: {shown(str(e))})",
                    "spec",
                ) from None
        return cls(text, parsed.outer, parsed.aggregates, parsed.outer_names, parsed.inner_names)

    @classmethod
    def aggregate(cls, op: str, of: object, divide_by: object | None, where: str) -> Expression:
        """``op(of)`` or ``op(of) / divide_by`` from an ``aggregate`` block, each key parsed on its own
        (the keys are never pasted together as text: ``of = 'x) + sum(y'`` is refused, not composed)."""
        inner = parse_expression(of, where, "of", aggregates=False)
        text = f"{op}({inner.printed})"
        if divide_by is not None:
            div = parse_expression(divide_by, where, "divide_by")
            text = f"{text} / {div.printed}"
        return cls._from(parse_expression(text, where, "aggregate"), text, where, "aggregate")

    @property
    def names(self) -> set[str]:
        return set(self.outer_names).union(*self.inner_names) if self.inner_names else set(self.outer_names)

    def check(self, known: Mapping[str, Scope], where: str, site_valued: bool) -> None:
        """Unknown names, and (for a site value) agent columns outside an aggregate, are errors."""
        allowed = set(known) | {DT_NAME}
        unknown = sorted(self.names - allowed)
        if unknown:
            raise InputError(
                f"{where}: unknown name(s) {unknown} in {shown(self.text)!r}; an expression reads the spec's "
                f"profile/state/action/response/kpi columns, 'reward' and '{DT_NAME}'",
                "spec",
            )
        if site_valued:
            loose = sorted(n for n in self.outer_names if known.get(n, "site") == "agent")
            if loose:
                raise InputError(
                    f"{where}: {loose} vary between the agents of a site; a site column's expression "
                    f"may use them only inside {'/'.join(AGGREGATES)}(...)",
                    "spec",
                )

    def evaluate(
        self, columns: Mapping[str, np.ndarray], site: np.ndarray, n_sites: int, dt: float
    ) -> np.ndarray:
        """``(N,)`` the expression per agent; aggregates are over each agent's site at the tick."""
        n = len(site)

        def local(names: Sequence[str], extra: Mapping[str, np.ndarray]) -> dict[str, Any]:
            d: dict[str, Any] = {variable(c): np.asarray(columns[c], np.float64) for c in names if c != DT_NAME}
            d[DT_NAME] = np.float64(dt)
            d.update(extra)
            return d

        if not self.aggregates and not self.outer_names:
            # a constant (a queue's ``service = "1"``): numexpr's value once, as every agent's
            return np.full(n, _constant(self.outer))
        placeholders: dict[str, np.ndarray] = {}
        for k, ((op, inner), names) in enumerate(zip(self.aggregates, self.inner_names, strict=True)):
            if len(names) == 1 and inner == variable(names[0]):
                # a bare column (``sum(kpi.edge_cpu)``): its values, which numexpr would copy as they are
                per_agent = _per_agent(columns[names[0]], n)
            else:
                per_agent = _per_agent(_numexpr(inner, local(names, {})), n)
            if op in ("sum", "mean"):
                placeholders[f"_agg{k}"] = _site_total(per_agent, site, n_sites, op == "mean")
            else:
                placeholders[f"_agg{k}"] = _reduce(op, per_agent, site, n_sites)[site]
        out = _numexpr(self.outer, local(self.outer_names, placeholders))
        return _per_agent(out, n).copy()


@numba.njit(fastmath=False, cache=True, nogil=True, boundscheck=False)
def _site_total_kernel(values: np.ndarray, site: np.ndarray, n_sites: int, mean: bool, out: np.ndarray) -> None:
    """``out[i]`` = the sum (``mean``: the mean) of ``values`` over agent i's site: the sums added
    from 0.0 in row order, as ``np.bincount(site, values)`` adds them, a mean divided by
    ``max(count, 1)`` as `_reduce` divides it (the same IEEE operations, so the same bits)."""
    sums = np.zeros(n_sites)
    counts = np.zeros(n_sites, np.int64)
    for i in range(values.shape[0]):
        sums[site[i]] += values[i]
        counts[site[i]] += 1
    if mean:
        for k in range(n_sites):
            sums[k] = sums[k] / np.float64(max(counts[k], 1))
    for i in range(values.shape[0]):
        out[i] = sums[site[i]]


def _site_total(values: np.ndarray, site: np.ndarray, n_sites: int, mean: bool) -> np.ndarray:
    """``(N,)`` `_reduce`'s sum or mean over each agent's site, gathered back to the agents
    (``_reduce(op, values, site, n_sites)[site]`` to the bit), in one compiled pass: a twin's
    tick calls it with ~300 sites and 10,000 agents, where ``np.bincount``'s checks and the
    gather cost more than the sums."""
    out = np.empty(len(values), np.float64)
    _site_total_kernel(np.asarray(values, np.float64), np.ascontiguousarray(site, np.int64), int(n_sites), mean, out)
    return out


#: numexpr text of a constant expression -> its value
_CONSTANTS: dict[str, float] = {}


def _constant(text: str) -> float:
    """The value numexpr gives a constant expression (no names, no aggregates), kept per text."""
    hit = _CONSTANTS.get(text)
    if hit is None:
        hit = _CONSTANTS[text] = float(np.asarray(_numexpr(text, {}), np.float64).reshape(-1)[0])
    return hit


def _per_agent(values: Any, n: int) -> np.ndarray:
    """``values`` as ``(n,)`` float64: itself when it is one already (a twin's tick: no
    `np.broadcast_to`, whose Python wrapper costs ~8 us a call), else broadcast (a constant)."""
    v = np.asarray(values, np.float64)
    return v if v.shape == (n,) else np.broadcast_to(v, (n,))


#: numexpr text -> (its variable names, whether it uses VML, the compiled program)
_COMPILED: dict[str, tuple[list[str], bool, Any]] = {}


def _program(text: str) -> tuple[list[str], bool, Any]:
    """numexpr's program for ``text``, compiled once per text; ``text`` is always one that
    `edgetwin.contract.expressions` printed from a validated tree (`Expression` has no other source)."""
    hit = _COMPILED.get(text)
    if hit is None:
        import numexpr
        from numexpr.necompiler import getContext, getExprNames, getType

        context = getContext({})
        names, uses_vml = getExprNames(text, context, sanitize=True)
        signature = [(name, getType(np.zeros(1))) for name in names]  # every variable is float64
        hit = _COMPILED[text] = (names, uses_vml, numexpr.NumExpr(text, signature, sanitize=True, **context))
    return hit


def _numexpr(text: str, local: Mapping[str, Any]) -> np.ndarray:
    """``numexpr.evaluate(text, local_dict=local)`` for float64 variables, compiled once per text.

    What `numexpr.evaluate` does (names, a signature, `numexpr.NumExpr`, then the call with its
    default keywords), without its per-call parsing and cache look-ups, which cost more than the
    arithmetic at a twin's sizes: the same program on the same arrays, so the same numbers.
    """
    names, uses_vml, program = _program(text)
    args = [np.asarray(local[name], np.float64) for name in names]
    return program(*args, out=None, order="K", casting="safe", ex_uses_vml=uses_vml)


def _reduce(op: str, values: np.ndarray, site: np.ndarray, n_sites: int) -> np.ndarray:
    """``(n_sites,)`` the reduction of per-agent ``values`` over each site's agents."""
    if op == "sum":
        return np.bincount(site, values, minlength=n_sites)
    if op == "mean":
        count = np.bincount(site, minlength=n_sites)
        return np.bincount(site, values, minlength=n_sites) / np.maximum(count, 1)
    fill = np.inf if op == "min" else -np.inf
    out = np.full(n_sites, fill)
    (np.minimum if op == "min" else np.maximum).at(out, site, values)
    return np.where(np.isfinite(out), out, 0.0)


@dataclass(frozen=True)
class Declaration:
    """How one state column moves from ``t`` to ``t+1``, as the spec declares it.

    Exactly one of ``next`` (an `Expression`), ``queue`` (``arrivals``/``service`` expressions, a
    fluid queue) or ``function`` (``"module:function"``) is set. ``raw`` is the TOML table as given
    (what the spec writes back and hashes).
    """

    column: str
    raw: Mapping[str, Any]
    next: Expression | None = None
    arrivals: Expression | None = None
    service: Expression | None = None
    dt: float | None = None
    max: float | None = None
    function: str | None = None
    _fn: list[DynamicsFn] = field(default_factory=list, compare=False, repr=False)

    @classmethod
    def parse(cls, raw: Mapping[str, Any], index: int) -> Declaration:
        """Read one ``[[dynamics]]`` table (``index`` counts from 1, for messages)."""
        if not isinstance(raw, Mapping):
            raise InputError(f"[[dynamics]] entry {index} is not a table", "spec")
        column = raw.get("column")
        where = f"[[dynamics]] entry {index} ({column})" if column else f"[[dynamics]] entry {index}"
        if not isinstance(column, str) or not column.startswith("state."):
            raise InputError(f"{where}: 'column' must name a state.* column, got {column!r}", "spec")
        forms = [k for k in ("next", "aggregate", "queue", "function") if k in raw]
        if len(forms) != 1:
            raise InputError(
                f"{where}: give exactly one of 'next', 'aggregate', 'queue' or 'function', got {forms or 'none'}",
                "spec",
            )
        allowed = {"column", forms[0]} | {"aggregate": {"of", "divide_by"}, "queue": set()}.get(forms[0], set())
        unknown = sorted(set(raw) - allowed)
        if unknown:
            raise InputError(f"{where}: unknown keys {unknown}", "spec")
        form = forms[0]
        if form == "next":
            return cls(column, dict(raw), next=Expression.compile(raw["next"], where, "next"))
        if form == "aggregate":
            op = raw["aggregate"]
            if op not in AGGREGATES:
                raise InputError(f"{where}: aggregate must be one of {list(AGGREGATES)}, got {op!r}", "spec")
            if "of" not in raw:
                raise InputError(f"{where}: an aggregate needs 'of', the expression it reduces", "spec")
            return cls(column, dict(raw), next=Expression.aggregate(op, raw["of"], raw.get("divide_by"), where))
        if form == "queue":
            q = raw["queue"]
            if not isinstance(q, Mapping) or "arrivals" not in q or "service" not in q:
                raise InputError(f"{where}: queue needs 'arrivals' and 'service' expressions", "spec")
            bad = sorted(set(q) - {"arrivals", "service", "dt", "max"})
            if bad:
                raise InputError(f"{where}: unknown queue keys {bad}", "spec")
            dt = _positive(q.get("dt"), f"{where}: queue dt")
            cap = _positive(q.get("max"), f"{where}: queue max")
            return cls(
                column,
                dict(raw),
                arrivals=Expression.compile(q["arrivals"], where, "queue.arrivals"),
                service=Expression.compile(q["service"], where, "queue.service"),
                dt=dt,
                max=cap,
            )
        ref = raw["function"]
        if not isinstance(ref, str) or ":" not in ref:
            raise InputError(f"{where}: function must be 'module:function', got {ref!r}", "spec")
        return cls(column, dict(raw), function=ref)

    @property
    def expressions(self) -> tuple[Expression, ...]:
        return tuple(e for e in (self.next, self.arrivals, self.service) if e is not None)

    def check(self, known: Mapping[str, Scope], index: int) -> None:
        """Names against the spec's columns; a function is imported and tried on a tiny batch."""
        where = f"[[dynamics]] entry {index} ({self.column})"
        if self.column not in known:
            raise InputError(f"{where}: {self.column!r} is not a state feature of the spec", "spec")
        site_valued = known[self.column] == "site"
        for e in self.expressions:
            e.check(known, where, site_valued)
        if self.function is not None:
            fn = self._import(where)
            probe = {c: np.ones(3) for c in known}
            try:
                out = np.asarray(fn(probe, np.zeros(3, np.int64)), np.float64)
            except Exception as e:  # noqa: BLE001 - the user's function: report anything it raises
                raise InputError(
                    f"{where}: function {self.function!r} failed on a probe batch of 3 agents "
                    f"({type(e).__name__}: {e})",
                    "spec",
                ) from None
            if out.shape != (3,):
                raise InputError(
                    f"{where}: function {self.function!r} returned shape {out.shape} for 3 agents; "
                    "it must return one next value per agent, shape (N,)",
                    "spec",
                )

    def _import(self, where: str) -> DynamicsFn:
        if not self._fn:
            self._fn.append(resolve_function_ref(self.function, entry=f"{where}: function"))
        return self._fn[0]

    def next_values(
        self,
        columns: Mapping[str, np.ndarray],
        site: np.ndarray,
        n_sites: int,
        step_seconds: float,
        high: float | None,
        memo: dict[tuple[str, float], np.ndarray] | None = None,
    ) -> np.ndarray:
        """``(N,)`` the column's values at ``t+1`` from the step's columns at ``t``.

        ``memo``: expressions already evaluated on these same ``columns``, by (text, dt): a spec
        often writes one expression twice (a site's load is both a column and a queue's
        arrivals), and it has one value per tick.
        """

        def value(e: Expression, dt: float) -> np.ndarray:
            if memo is None:
                return e.evaluate(columns, site, n_sites, dt)
            key = (e.text, float(dt))
            if key not in memo:
                memo[key] = e.evaluate(columns, site, n_sites, dt)
            return memo[key].copy()

        if self.next is not None:
            return value(self.next, step_seconds)
        if self.arrivals is not None and self.service is not None:
            dt = self.dt if self.dt is not None else step_seconds
            cap = self.max if self.max is not None else (np.inf if high is None else high)
            a = value(self.arrivals, dt)
            s = value(self.service, dt)
            now = np.asarray(columns[self.column], np.float64)
            return np.clip(now + (a - s) * dt, 0.0, cap)
        fn = self._import(f"[[dynamics]] {self.column}")
        return np.asarray(fn(columns, site), np.float64).reshape(len(site))


def _positive(v: Any, what: str) -> float | None:
    if v is None:
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise InputError(f"{what} must be a number, got {v!r}", "spec") from None
    if not np.isfinite(x) or x <= 0:
        raise InputError(f"{what} must be a finite number > 0, got {v!r}", "spec")
    return x


@dataclass(frozen=True)
class DeclaredDynamics:
    """A spec's declarations, applied together: every one reads the step at ``t``.

    Attributes:
        declarations: in spec order.
        step_seconds: the spec's step (the default ``dt``).
        bounds: per declared column, its spec ``(low, high)`` (None: unbounded); a queue's default
            ``max`` is its high bound, and the twin clips every declared value to them.
    """

    declarations: tuple[Declaration, ...]
    step_seconds: float
    bounds: Mapping[str, tuple[float | None, float | None]]

    @property
    def columns(self) -> list[str]:
        return [d.column for d in self.declarations]

    @cached_property
    def reads(self) -> frozenset[str] | None:
        """The column names `next_state` reads of its ``columns`` (its expressions' names and each
        queue's own column), or None when a declared function may read any column."""
        if any(d.function is not None for d in self.declarations):
            return None
        names: set[str] = set()
        for d in self.declarations:
            for e in d.expressions:
                names |= e.names
            if d.arrivals is not None:
                names.add(d.column)
        return frozenset(names - {DT_NAME})

    def next_state(
        self, columns: Mapping[str, np.ndarray], site: np.ndarray, n_sites: int | None = None
    ) -> dict[str, np.ndarray]:
        """``{column: (N,) value at t+1}`` of every declared column, from ``columns`` at ``t``.

        Args:
            columns: every column of the step at ``t``, ``{name: (N,)}`` (raw units).
            site: ``(N,)`` integer site ids ``0..``; aggregates reduce over equal ids.
        """
        site = np.asarray(site, np.int64)
        n_sites = int(site.max()) + 1 if n_sites is None and len(site) else int(n_sites or 0)
        memo: dict[tuple[str, float], np.ndarray] = {}  # every declaration reads the same step
        return {
            d.column: self.clip(
                d.column,
                d.next_values(
                    columns, site, n_sites, self.step_seconds, self.bounds.get(d.column, (None, None))[1], memo
                ),
            )
            for d in self.declarations
        }

    def clip(self, column: str, values: np.ndarray) -> np.ndarray:
        """``values`` clipped to the column's spec bounds."""
        low, high = self.bounds.get(column, (None, None))
        return np.clip(values, -np.inf if low is None else low, np.inf if high is None else high)


@dataclass(frozen=True)
class Replay:
    """The declarations replayed on a log: per row at ``t``, the declared value at ``t+1``.

    Attributes:
        order: ``(n,)`` positions in the given log of the rows below, sorted by (episode, t, agent).
        predicted: per declared column ``(n,)`` its declared next value, clipped to its bounds.
        logged_next: per declared column ``(n,)`` the logged value at ``t+1`` (NaN without one).
        has_next: ``(n,)`` whether the row's (episode, agent) has a row at ``t+1``.
    """

    order: np.ndarray
    predicted: dict[str, np.ndarray]
    logged_next: dict[str, np.ndarray]
    has_next: np.ndarray


def replay(log: pd.DataFrame, dynamics: DeclaredDynamics) -> Replay:
    """Every declaration computed from every row's tick (aggregates over the agents logged at
    that (episode, site, t)), beside the logged next value.

    Raises:
        InputError: naming the entry whose computation raised on the log (a declared function's
            exception, whatever its type): the twin would call it on ticks like these.
    """
    df = log.reset_index(drop=True).sort_values(["episode", "t", "agent"], kind="stable")
    order = df.index.to_numpy()
    df = df.reset_index(drop=True)
    groups = pd.factorize(pd.MultiIndex.from_frame(df[["episode", "t", "site"]].astype(str)))[0]
    needed = set().union(*[e.names for d in dynamics.declarations for e in d.expressions] or [set()])
    needed |= set(dynamics.columns)
    cols = {c: df[c].to_numpy(np.float64) for c in needed if c in df.columns}
    if any(d.function is not None for d in dynamics.declarations):
        cols.update({c: df[c].to_numpy(np.float64) for c in df.columns if "." in c and c not in cols})
    n_sites = int(groups.max()) + 1 if len(groups) else 0
    memo: dict[tuple[str, float], np.ndarray] = {}
    pred: dict[str, np.ndarray] = {}
    for i, d in enumerate(dynamics.declarations, start=1):  # `DeclaredDynamics.next_state`, entry by entry
        high = dynamics.bounds.get(d.column, (None, None))[1]
        try:
            with np.errstate(all="ignore"):  # a NaN or inf is reported by the caller, with its rows
                pred[d.column] = dynamics.clip(
                    d.column, d.next_values(cols, groups, n_sites, dynamics.step_seconds, high, memo)
                )
        except Exception as e:  # noqa: BLE001 - the operator's function on its own log: name the entry
            raise InputError(
                f"[[dynamics]] entry {i} ({d.column}) fails on the log's rows ({type(e).__name__}: {shown(str(e))})",
                "spec",
            ) from None
    by_agent = df.groupby(["episode", "agent"], sort=False)
    nxt = by_agent["t"].shift(-1)
    has_next = (nxt == df["t"] + 1).to_numpy()
    logged = {c: np.where(has_next, by_agent[c].shift(-1).to_numpy(np.float64), np.nan) for c in pred}
    return Replay(order, pred, logged, has_next)


def agreement(
    log: pd.DataFrame, dynamics: DeclaredDynamics, tolerance: float = 1e-3, replayed: Replay | None = None
) -> dict[str, tuple[int, int, float]]:
    """How well the declarations reproduce a log's transitions.

    For every (episode, agent) row at ``t`` with a row at ``t+1``, the declared next value
    (computed from the whole site's tick, aggregates over the agents logged at that
    (episode, site, t)) against the logged one. ``replayed``: `replay` of the same log, if done.

    Returns:
        per declared column ``(transitions, mismatches, median relative error)``; a mismatch is
        a relative error above ``tolerance`` (relative to ``max(|logged|, 1e-6·scale)``).
    """
    if not dynamics.declarations or log.empty:
        return {}
    r = replayed if replayed is not None else replay(log, dynamics)
    out: dict[str, tuple[int, int, float]] = {}
    for c, p in r.predicted.items():
        logged = r.logged_next[c][r.has_next]
        guess = p[r.has_next]
        scale = max(float(np.nanmax(np.abs(logged))) if len(logged) else 1.0, 1e-12)
        rel = np.abs(guess - logged) / np.maximum(np.abs(logged), 1e-6 * scale)
        out[c] = (int(r.has_next.sum()), int((rel > tolerance).sum()), float(np.median(rel)) if len(rel) else 0.0)
    return out
