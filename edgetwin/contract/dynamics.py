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
every agent's response, then computes the declared columns from them. Expressions are compiled and
evaluated by numexpr (its own parser and virtual machine, a fixed set of arithmetic functions),
never by Python's ``eval``. A site-scoped column's expression may use agent-scoped columns only
inside an aggregate, so that it is one value per site.

Unknown names, an aggregate inside an aggregate, a function that cannot be imported, or one that
returns the wrong shape are errors naming the spec entry when the spec is read, not halfway
through a fit. `agreement` measures how well declarations reproduce a log (the validator reports it).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np
import pandas as pd

from edgetwin.contract.errors import InputError
from edgetwin.contract.functions import resolve_function_ref

__all__ = [
    "AGGREGATES",
    "DT_NAME",
    "Declaration",
    "DeclaredDynamics",
    "Expression",
    "agreement",
]

Scope = Literal["agent", "site"]

#: Reductions over a site's agents that an expression may use.
AGGREGATES: tuple[str, ...] = ("sum", "mean", "min", "max")
#: The name of the step length (seconds, the spec's ``step_seconds`` unless a queue sets ``dt``).
DT_NAME = "dt"
_ROLE_NAME = re.compile(r"\b(profile|state|action|response|kpi)\.([A-Za-z_][A-Za-z0-9_]*)")
_AGG_OPEN = re.compile(r"\b(" + "|".join(AGGREGATES) + r")\s*\(")

#: ``fn(columns: {name: (N,) array at t}, site: (N,) int ids) -> (N,) next values``.
DynamicsFn = Callable[[Mapping[str, np.ndarray], np.ndarray], np.ndarray]


def _sanitise(text: str) -> str:
    """``kpi.edge_cpu`` -> ``kpi__edge_cpu``: numexpr names cannot hold a dot."""
    return _ROLE_NAME.sub(lambda m: f"{m.group(1)}__{m.group(2)}", text)


def _original(name: str) -> str:
    role, sep, rest = name.partition("__")
    return f"{role}.{rest}" if sep and role in ("profile", "state", "action", "response", "kpi") else name


def _names(text: str, where: str) -> list[str]:
    """The variable names of a numexpr expression (original spelling), or an error naming ``where``."""
    from numexpr.necompiler import getExprNames

    try:
        names, _ = getExprNames(text, {})
    except (SyntaxError, ValueError, TypeError, KeyError, AttributeError, NotImplementedError) as e:
        raise InputError(f"{where}: cannot read expression {text!r} ({type(e).__name__}: {e})", "spec") from None
    return [_original(n) for n in names]


@dataclass(frozen=True)
class Expression:
    """An expression over a step's columns, with site aggregates, compiled for numexpr.

    Attributes:
        text: the expression as written.
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
    def compile(cls, text: str, where: str) -> Expression:
        if not isinstance(text, str) or not text.strip():
            raise InputError(f"{where}: an expression must be a non-empty string, got {text!r}", "spec")
        outer: list[str] = []
        aggs: list[tuple[str, str]] = []
        inner_names: list[tuple[str, ...]] = []
        pos = 0
        for m in _AGG_OPEN.finditer(text):
            if m.start() < pos:
                continue
            depth, end = 1, m.end()
            while end < len(text) and depth:
                depth += {"(": 1, ")": -1}.get(text[end], 0)
                end += 1
            if depth:
                raise InputError(f"{where}: unbalanced parentheses in {text!r}", "spec")
            inner = text[m.end() : end - 1]
            if _AGG_OPEN.search(inner):
                raise InputError(f"{where}: an aggregate inside an aggregate in {text!r}", "spec")
            k = len(aggs)
            outer.append(text[pos : m.start()] + f"_agg{k}")
            sane = _sanitise(inner)
            aggs.append((m.group(1), sane))
            inner_names.append(tuple(_names(sane, where)))
            pos = end
        outer.append(text[pos:])
        outer_text = _sanitise("".join(outer))
        outer_names = tuple(n for n in _names(outer_text, where) if not re.fullmatch(r"_agg\d+", n))
        return cls(text, outer_text, tuple(aggs), outer_names, tuple(inner_names))

    @property
    def names(self) -> set[str]:
        return set(self.outer_names).union(*self.inner_names) if self.inner_names else set(self.outer_names)

    def check(self, known: Mapping[str, Scope], where: str, site_valued: bool) -> None:
        """Unknown names, and (for a site value) agent columns outside an aggregate, are errors."""
        allowed = set(known) | {DT_NAME}
        unknown = sorted(self.names - allowed)
        if unknown:
            raise InputError(
                f"{where}: unknown name(s) {unknown} in {self.text!r}; an expression reads the spec's "
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
            d: dict[str, Any] = {_sanitise(c): np.asarray(columns[c], np.float64) for c in names if c != DT_NAME}
            d[DT_NAME] = np.float64(dt)
            d.update(extra)
            return d

        placeholders: dict[str, np.ndarray] = {}
        for k, ((op, inner), names) in enumerate(zip(self.aggregates, self.inner_names, strict=True)):
            per_agent = np.broadcast_to(np.asarray(_numexpr(inner, local(names, {})), np.float64), (n,))
            placeholders[f"_agg{k}"] = _reduce(op, per_agent, site, n_sites)[site]
        out = _numexpr(self.outer, local(self.outer_names, placeholders))
        return np.broadcast_to(np.asarray(out, np.float64), (n,)).copy()


#: numexpr text -> (its variable names, whether it uses VML, the compiled program)
_COMPILED: dict[str, tuple[list[str], bool, Any]] = {}


def _numexpr(text: str, local: Mapping[str, Any]) -> np.ndarray:
    """``numexpr.evaluate(text, local_dict=local)`` for float64 variables, compiled once per text.

    What `numexpr.evaluate` does (names, a signature, `numexpr.NumExpr`, then the call with its
    default keywords), without its per-call parsing and cache look-ups, which cost more than the
    arithmetic at a twin's sizes: the same program on the same arrays, so the same numbers.
    """
    hit = _COMPILED.get(text)
    if hit is None:
        import numexpr
        from numexpr.necompiler import getContext, getExprNames, getType

        context = getContext({})
        names, uses_vml = getExprNames(text, context, sanitize=True)
        signature = [(name, getType(np.zeros(1))) for name in names]  # every variable is float64
        hit = _COMPILED[text] = (names, uses_vml, numexpr.NumExpr(text, signature, sanitize=True, **context))
    names, uses_vml, program = hit
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
            return cls(column, dict(raw), next=Expression.compile(raw["next"], where))
        if form == "aggregate":
            op = raw["aggregate"]
            if op not in AGGREGATES:
                raise InputError(f"{where}: aggregate must be one of {list(AGGREGATES)}, got {op!r}", "spec")
            if "of" not in raw:
                raise InputError(f"{where}: an aggregate needs 'of', the expression it reduces", "spec")
            text = f"{op}({raw['of']})"
            if raw.get("divide_by") is not None:
                text = f"({text}) / ({raw['divide_by']})"
            return cls(column, dict(raw), next=Expression.compile(text, where))
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
                arrivals=Expression.compile(str(q["arrivals"]), where),
                service=Expression.compile(str(q["service"]), where),
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


def agreement(
    log: pd.DataFrame, dynamics: DeclaredDynamics, tolerance: float = 1e-3
) -> dict[str, tuple[int, int, float]]:
    """How well the declarations reproduce a log's transitions.

    For every (episode, agent) row at ``t`` with a row at ``t+1``, the declared next value
    (computed from the whole site's tick, aggregates over the agents logged at that
    (episode, site, t)) against the logged one.

    Returns:
        per declared column ``(transitions, mismatches, median relative error)``; a mismatch is
        a relative error above ``tolerance`` (relative to ``max(|logged|, 1e-6·scale)``).
    """
    if not dynamics.declarations or log.empty:
        return {}
    df = log.sort_values(["episode", "t", "agent"], kind="stable").reset_index(drop=True)
    groups = pd.factorize(pd.MultiIndex.from_frame(df[["episode", "t", "site"]].astype(str)))[0]
    needed = set().union(*[e.names for d in dynamics.declarations for e in d.expressions] or [set()])
    needed |= set(dynamics.columns)
    cols = {c: df[c].to_numpy(np.float64) for c in needed if c in df.columns}
    if any(d.function is not None for d in dynamics.declarations):
        cols.update({c: df[c].to_numpy(np.float64) for c in df.columns if "." in c and c not in cols})
    pred = dynamics.next_state(cols, groups, int(groups.max()) + 1)
    nxt = df.groupby(["episode", "agent"], sort=False)["t"].shift(-1)
    has_next = (nxt == df["t"] + 1).to_numpy()
    out: dict[str, tuple[int, int, float]] = {}
    for c, p in pred.items():
        logged = df.groupby(["episode", "agent"], sort=False)[c].shift(-1).to_numpy(np.float64)[has_next]
        guess = p[has_next]
        scale = max(float(np.nanmax(np.abs(logged))) if len(logged) else 1.0, 1e-12)
        rel = np.abs(guess - logged) / np.maximum(np.abs(logged), 1e-6 * scale)
        out[c] = (int(has_next.sum()), int((rel > tolerance).sum()), float(np.median(rel)) if len(rel) else 0.0)
    return out
