"""The spec's expression grammar: what a ``[[dynamics]]`` expression may say, checked before anything runs it.

Every expression a spec holds (``next``, ``of``, ``divide_by``, ``queue.arrivals`` and
``queue.service``; from a spec file, a twin's ``layout.json`` or a federated ``twin_task``'s layout:
they all go through `TwinSpec.from_dict` and land here) is parsed by Python's `ast` in
``mode="eval"``, which only *builds a tree* (it runs nothing), and then walked node by node
against a grammar of edgetwin's own. What is allowed:

- numbers: ``int`` or ``float`` literals, finite (``1``, ``0.5``, ``1e-3``); no ``True``/``None``,
  strings, bytes or complex numbers;
- names: a spec column ``profile.x`` / ``state.x`` / ``action.x`` / ``response.x`` / ``kpi.x``
  (written with its dot; ``x`` an ASCII identifier), ``reward`` and ``dt`` (the step, seconds);
- operators: ``+ - * / ** %``, unary ``-`` and ``+``; one comparison ``< <= > >= == !=`` at a
  time (no chains: ``a < b < c``); ``& | ~`` to combine comparisons (for ``where``);
- calls of the functions in `FUNCTIONS`, with their number of arguments, positionally;
- the aggregates `AGGREGATES` over the agents of a site, one argument each, not nested.

Anything else (attributes other than a column, subscripts, calls of other names, keywords,
``*args``, lambdas, comprehensions, conditionals, ``and``/``or``, f-strings, walrus, ...) is an
`InputError` naming the spec entry. The text is also bounded: at most `MAX_LENGTH` characters
(checked before `ast.parse` sees it: a 500 KB expression never reaches the parser) and
`MAX_DEPTH` nested nodes (checked on the way down, so the walk never recurses deeper; a short text
deeper than the parser itself takes, ``-`` 3,000 times, is refused the same way).

Why a grammar of our own: numexpr checks its input with a blacklist and then calls Python's
``eval`` on it; a generator expression or a quoted string slips through that into ``eval`` with
the builtins (the issue-37 payload ``(*(eval('__import__("os").system(...)') for x in (1,)),)``).
No library sees a spec's text; numexpr sees only `Parsed.numexpr_text`, printed by `_print` from
the validated tree, in which every token is one this module wrote (a number's ``repr``, a column's
``role__name`` variable, an operator, a listed function's name, parentheses).

Why numexpr still evaluates it (and not numpy on the tree): it is the evaluator every twin and
benchmark has used, so a declared column keeps its numbers to the last bit (`tests/security`
checks it on the repository's shipped expressions), and it evaluates a whole expression in one pass
over the agents without a temporary array per node, which matters at a twin's 10,000 agents per
tick. The re-printed text has the same tree as the one validated (fully parenthesised, numbers
printed by ``repr``, which round-trips), so numexpr builds the same program it built from the
original text.
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass
from typing import Any

from edgetwin.contract.errors import InputError

__all__ = [
    "AGGREGATES",
    "BARE_NAMES",
    "FUNCTIONS",
    "MAX_DEPTH",
    "MAX_LENGTH",
    "ROLES",
    "Parsed",
    "parse_expression",
    "variable",
]

#: Reductions over a site's agents at the tick; each takes one expression of an agent's columns.
AGGREGATES: tuple[str, ...] = ("sum", "mean", "min", "max")
#: The functions an expression may call, with their number of arguments: numexpr's real-valued
#: float64 functions (``minimum``/``maximum`` elementwise, NaN as numpy; ``where(cond, a, b)``).
FUNCTIONS: dict[str, int] = {
    "where": 3,
    "abs": 1,
    "sqrt": 1,
    "exp": 1,
    "expm1": 1,
    "log": 1,
    "log1p": 1,
    "log10": 1,
    "sin": 1,
    "cos": 1,
    "tan": 1,
    "arcsin": 1,
    "arccos": 1,
    "arctan": 1,
    "sinh": 1,
    "cosh": 1,
    "tanh": 1,
    "ceil": 1,
    "floor": 1,
    "arctan2": 2,
    "fmod": 2,
    "minimum": 2,
    "maximum": 2,
}
#: The column prefixes a name may carry (``kpi.edge_cpu``).
ROLES: tuple[str, ...] = ("profile", "state", "action", "response", "kpi")
#: The names without a role: the logged reward and the step length ``dt`` (seconds).
BARE_NAMES: tuple[str, ...] = ("reward", "dt")
#: The longest expression text read (characters). The longest the repository ships is ~60; a
#: spec entry is a formula, not a program.
MAX_LENGTH = 4000
#: The deepest tree read (nested nodes: ``a + b + c`` is 3 deep on its left). Bounds the walk's
#: recursion, and numexpr's over the same tree, far below Python's limit.
MAX_DEPTH = 100

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_BINOPS: dict[type[ast.operator], str] = {
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.Pow: "**",
    ast.Mod: "%",
    ast.BitAnd: "&",
    ast.BitOr: "|",
}
_UNARY: dict[type[ast.unaryop], str] = {ast.USub: "-", ast.UAdd: "+", ast.Invert: "~"}
_COMPARE: dict[type[ast.cmpop], str] = {
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Eq: "==",
    ast.NotEq: "!=",
}
#: A readable name for every node kind the grammar refuses (anything not listed: its class name).
_REFUSED: dict[type[ast.AST], str] = {
    ast.Attribute: "an attribute",
    ast.Subscript: "a subscript",
    ast.Lambda: "a lambda",
    ast.GeneratorExp: "a generator expression",
    ast.ListComp: "a comprehension",
    ast.SetComp: "a comprehension",
    ast.DictComp: "a comprehension",
    ast.Starred: "a starred expression",
    ast.Tuple: "a tuple",
    ast.List: "a list",
    ast.Set: "a set",
    ast.Dict: "a dict",
    ast.IfExp: "a conditional (use where(cond, a, b))",
    ast.BoolOp: "'and'/'or' (use & and | on comparisons)",
    ast.JoinedStr: "a string",
    ast.NamedExpr: "an assignment",
    ast.Await: "await",
    ast.Yield: "yield",
    ast.YieldFrom: "yield",
}


def variable(name: str) -> str:
    """The evaluator's variable for a column: ``kpi.edge_cpu`` -> ``kpi__edge_cpu`` (no dots in names)."""
    role, dot, rest = name.partition(".")
    return f"{role}__{rest}" if dot else name


def shown(text: str, limit: int = 120) -> str:
    """``text`` for a one-line message: at most ``limit`` characters, and how long it was."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text):,} characters)"


@dataclass(frozen=True)
class Parsed:
    """A validated expression, split at its aggregates and printed for the evaluator.

    Attributes:
        outer: numexpr text of the whole, with aggregate ``k`` replaced by the variable ``_agg<k>``.
        aggregates: per aggregate ``(reduction, numexpr text of its argument)``.
        outer_names, inner_names: the column names (as the spec spells them) the outer part and
            each aggregate read, in order of first use.
        printed: the whole expression re-printed from the tree in the spec's spelling (what a
            declaration built from several keys, e.g. ``aggregate`` + ``of`` + ``divide_by``, says).
    """

    outer: str
    aggregates: tuple[tuple[str, str], ...]
    outer_names: tuple[str, ...]
    inner_names: tuple[tuple[str, ...], ...]
    printed: str


class _Refused(Exception):
    """The grammar's reason for refusing a node (turned into an `InputError` naming the entry)."""


#: The largest magnitude a constant part of an expression may fold to (the bound literals have):
#: numexpr folds constant sub-expressions with Python integers before it compiles, and
#: ``10 ** 10 ** 10`` is a 33-billion-bit integer that no reader of the spec ever finishes computing.
MAX_CONSTANT = 2.0**63

_FOLD: dict[type[ast.AST], Any] = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.Div: lambda a, b: a / b,
    ast.Pow: lambda a, b: a**b,
    ast.Mod: lambda a, b: math.fmod(a, b),
}


def _fold_bounded(node: ast.AST) -> float | None:
    """The value of ``node`` when it is constant (no column, no function), folded in *float*
    arithmetic (which overflows at once instead of growing an integer), else None; refuses a
    constant part whose magnitude exceeds `MAX_CONSTANT` or is not a finite real number. Runs on a
    tree the grammar already accepted, so its depth is bounded by `MAX_DEPTH`."""
    if isinstance(node, ast.Constant):
        return float(node.value) if isinstance(node.value, int | float) else None
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
        v = _fold_bounded(node.operand)
        return None if v is None else (-v if isinstance(node.op, ast.USub) else v)
    if isinstance(node, ast.BinOp) and type(node.op) in _FOLD:
        a, b = _fold_bounded(node.left), _fold_bounded(node.right)
        if a is None or b is None:
            return None
        try:
            v = _FOLD[type(node.op)](a, b)
        except (OverflowError, ZeroDivisionError, ValueError):
            v = math.inf
        if not isinstance(v, float) or not math.isfinite(v) or abs(v) > MAX_CONSTANT:
            raise _Refused(f"a constant part folds to a number beyond {MAX_CONSTANT:.3g} (or not a finite real)")
        return v
    for child in ast.iter_child_nodes(node):  # columns, calls, comparisons: check the constant parts inside
        _fold_bounded(child)
    return None


class _Walk:
    """One pass over a tree: checks every node and prints it, twice (numexpr text, spec spelling)."""

    def __init__(self) -> None:
        self.aggregates: list[tuple[str, str]] = []
        self.inner_names: list[tuple[str, ...]] = []
        self.names: list[str] = []  # the part being printed: outer, or the aggregate's argument
        self.in_aggregate = False

    def print(self, node: ast.AST, depth: int) -> tuple[str, str]:
        """``(numexpr text, spec text)`` of ``node``, fully parenthesised; refuses what is not grammar."""
        if depth > MAX_DEPTH:
            raise _Refused(f"nested more than {MAX_DEPTH} deep")
        d = depth + 1
        if isinstance(node, ast.Constant):
            v = node.value
            if type(v) not in (int, float):  # bool is an int subclass: refused here too
                raise _Refused(f"{type(v).__name__} literal {shown(repr(v), 40)} (numbers only)")
            if isinstance(v, float) and not math.isfinite(v):
                raise _Refused(f"non-finite number {v!r}")
            if isinstance(v, int) and abs(v) >= 2**63:
                raise _Refused(f"integer {shown(str(v), 40)} does not fit 64 bits")
            return repr(v), repr(v)
        if isinstance(node, ast.Name):
            if node.id not in BARE_NAMES:
                if node.id in FUNCTIONS or node.id in AGGREGATES:
                    raise _Refused(f"{node.id!r} is a function: call it, {node.id}(...)")
                raise _Refused(
                    f"unknown name(s) [{node.id!r}]; an expression reads the spec's "
                    f"{'/'.join(ROLES)} columns (e.g. kpi.x), {' and '.join(map(repr, BARE_NAMES))}"
                )
            self._use(node.id)
            return node.id, node.id
        if isinstance(node, ast.Attribute):
            base = node.value
            if isinstance(base, ast.Name) and base.id in ROLES and _IDENT.match(node.attr):
                name = f"{base.id}.{node.attr}"
                self._use(name)
                return variable(name), name
            raise _Refused("an attribute (only a spec column, role.name, has a dot)")
        if isinstance(node, ast.BinOp):
            op = _BINOPS.get(type(node.op))
            if op is None:
                raise _Refused(f"the operator {type(node.op).__name__}")
            (la, lb), (ra, rb) = self.print(node.left, d), self.print(node.right, d)
            return f"({la} {op} {ra})", f"({lb} {op} {rb})"
        if isinstance(node, ast.UnaryOp):
            op = _UNARY.get(type(node.op))
            if op is None:
                raise _Refused("'not' (use ~ on a comparison)")
            a, b = self.print(node.operand, d)
            return f"({op}{a})", f"({op}{b})"
        if isinstance(node, ast.Compare):
            if len(node.ops) != 1:
                raise _Refused("a chained comparison (write (a < b) & (b < c))")
            op = _COMPARE.get(type(node.ops[0]))
            if op is None:
                raise _Refused(f"the comparison {type(node.ops[0]).__name__}")
            (la, lb), (ra, rb) = self.print(node.left, d), self.print(node.comparators[0], d)
            return f"({la} {op} {ra})", f"({lb} {op} {rb})"
        if isinstance(node, ast.Call):
            return self._call(node, d)
        raise _Refused(_REFUSED.get(type(node), type(node).__name__))

    def _use(self, name: str) -> None:
        if name not in self.names:
            self.names.append(name)

    def _call(self, node: ast.Call, d: int) -> tuple[str, str]:
        if not isinstance(node.func, ast.Name):
            raise _Refused("a call of something that is not a listed function")
        fn = node.func.id
        if node.keywords:
            raise _Refused(f"keyword arguments in {fn}(...)")
        if any(isinstance(a, ast.Starred) for a in node.args):
            raise _Refused(f"a starred argument in {fn}(...)")
        if fn in AGGREGATES:
            if len(node.args) != 1:
                extra = f"; for the {'smaller' if fn == 'min' else 'larger'} of two values use {fn}imum(a, b)" if fn in ("min", "max") else ""
                raise _Refused(f"{fn}(...) aggregates over the site's agents and takes one expression, got {len(node.args)}{extra}")
            if self.in_aggregate:
                raise _Refused("an aggregate inside an aggregate")
            outer_names, self.names, self.in_aggregate = self.names, [], True
            inner, spelled = self.print(node.args[0], d)
            self.inner_names.append(tuple(self.names))
            self.names, self.in_aggregate = outer_names, False
            k = len(self.aggregates)
            self.aggregates.append((fn, inner))
            return f"_agg{k}", f"{fn}({spelled})"
        arity = FUNCTIONS.get(fn)
        if arity is None:
            raise _Refused(
                f"the function {shown(fn, 40)!r}; an expression may call {', '.join(FUNCTIONS)} "
                f"and the aggregates {', '.join(AGGREGATES)}"
            )
        if len(node.args) != arity:
            raise _Refused(f"{fn}(...) takes {arity} argument{'s' if arity > 1 else ''}, got {len(node.args)}")
        parts = [self.print(a, d) for a in node.args]
        return f"{fn}({', '.join(a for a, _ in parts)})", f"{fn}({', '.join(b for _, b in parts)})"


def parse_expression(text: object, where: str, key: str, *, aggregates: bool = True) -> Parsed:
    """Check ``text`` against the grammar and split it for evaluation; run nothing.

    Args:
        text: the expression as the spec holds it (a TOML number is read as its text).
        where: the spec entry, e.g. ``[[dynamics]] entry 2 (state.x)``, for the error.
        key: the entry's key holding it (``next``, ``of``, ``queue.arrivals``...), for the error.
        aggregates: False where the text is itself the argument of an aggregate (``of``).

    Raises:
        InputError: naming ``where`` and ``key``: empty, longer than `MAX_LENGTH`, not Python
            expression syntax, deeper than `MAX_DEPTH`, or any construct outside the grammar.
    """
    if isinstance(text, bool) or not isinstance(text, str | int | float):
        raise InputError(f"{where}: {key} must be an expression (a string), got {shown(repr(text), 60)}", "spec")
    src = text if isinstance(text, str) else repr(text)

    def refuse(reason: str) -> InputError:
        return InputError(f"{where}: cannot read expression {key} = {shown(src)!r}: {reason}", "spec")

    if not src.strip():
        raise refuse("it is empty")
    if len(src) > MAX_LENGTH:
        raise refuse(f"longer than {MAX_LENGTH:,} characters")
    try:
        tree = ast.parse(src.strip(), mode="eval")
    except SyntaxError as e:
        raise refuse(f"not an expression ({e.msg})") from None
    except (RecursionError, MemoryError):  # the parser's own stack: deeper than any grammar allows
        raise refuse(f"nested more than {MAX_DEPTH} deep") from None
    except ValueError as e:  # a null byte
        raise refuse(f"not an expression ({e})") from None
    walk = _Walk()
    try:
        outer, printed = walk.print(tree.body, 0)
        _fold_bounded(tree.body)
        if walk.aggregates and not aggregates:
            raise _Refused(f"an aggregate inside an aggregate ({key} is already aggregated)")
    except _Refused as e:
        raise refuse(str(e)) from None
    return Parsed(outer, tuple(walk.aggregates), tuple(walk.names), tuple(walk.inner_names), printed)
