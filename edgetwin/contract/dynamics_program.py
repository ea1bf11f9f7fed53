"""`DeclaredProgram`: a spec's declared dynamics evaluated in one compiled call per tick.

`DeclaredDynamics.next_state` evaluates each declaration's validated expressions with numexpr
(one program per expression part), reduces the aggregates over each site (`_site_total`), and
clips: at a twin's 1,000 agents a tick of the emulated cluster's three declarations is some 20
numpy / numexpr calls and the Python between them (~60 us, docs/benchmarks/scale), for a few
thousand additions. Here the same work is one `numba` call over registers of ``(N,)`` float64.

What it runs is numexpr's own program, not a re-reading of the expression: `compile_program`
takes the program numexpr compiled from the validated text (`edgetwin.contract.dynamics._program`,
after numexpr's own rewrites, e.g. a division by a float constant turned into a product by its
reciprocal, constant parts folded) and copies its instructions (``add`` / ``sub`` / ``mul`` /
``div`` / ``neg`` / ``copy`` on doubles, its constants as numexpr stored them) one for one. Each
instruction is one IEEE operation per row, as in numexpr's interpreter, so the values are
numexpr's to the bit; the site totals are `_site_total_kernel`'s additions in row order from 0.0
and its division, and the clips are ``np.clip``'s scalar rule (NaN stays NaN; a tie keeps the
bound). Nothing here parses text: the instructions come from numexpr's compiled program of a text
edgetwin printed from a tree it validated (`edgetwin.contract.expressions`), and nothing is ever
executed but this module's fixed kernel.

Where a declaration uses anything else (a declared function, a ``min`` / ``max`` aggregate, a
numexpr instruction outside that list: a transcendental function, a comparison, ``where``, an
integer constant part), `compile_program` returns None and the caller keeps `next_state`
(tests/test_declared_program.py checks both the bits and the fallback).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numba
import numpy as np

from edgetwin.contract.dynamics import DT_NAME, DeclaredDynamics, Expression, _constant, _program
from edgetwin.contract.expressions import variable

__all__ = ["DeclaredProgram", "compile_program"]

# instructions: rows of ``code (I, 4) int64`` = (op, destination register, a, b)
_LOAD, _CONST, _ADD, _SUB, _MUL, _DIV, _NEG, _COPY, _SITE = range(9)
#: numexpr's double-precision instructions this evaluator copies (anything else: no program)
_NUMEXPR_OPS = {b"add_ddd": _ADD, b"sub_ddd": _SUB, b"mul_ddd": _MUL, b"div_ddd": _DIV, b"neg_dd": _NEG, b"copy_dd": _COPY}


@numba.njit(fastmath=False, error_model="numpy", cache=True, nogil=True, boundscheck=False, inline="always")
def _clip(x: float, low: float, high: float) -> float:  # pragma: no cover - compiled
    """``np.clip``'s scalar rule for floats: ``min(max(x, low), high)``, each keeping a NaN ``x``
    and, on a tie, the bound."""
    y = x if x > low else low
    y = x if np.isnan(x) else y
    z = y if y < high else high
    return y if np.isnan(y) else z  # (selects, not branches: the row loops vectorise)


@numba.njit(fastmath=False, error_model="numpy", cache=True, nogil=True, boundscheck=False, inline="always")
def _first_nan(x: float, y: float, op: int) -> float:  # pragma: no cover - compiled
    """``x op y`` (2 +, 3 -, 4 *, 5 /) with the NaN that x86's scalar and packed instructions give
    numpy and numexpr: the first operand's when both are NaN. Why a branch: LLVM may swap a sum's
    or a product's operands, which changes only which NaN (its sign) comes out."""
    if np.isnan(x):
        return x
    if op == 2:
        return x + y
    if op == 3:
        return x - y
    if op == 4:
        return x * y
    return x / y


@numba.njit(fastmath=False, error_model="numpy", cache=True, nogil=True, boundscheck=False)
def _run(
    code: np.ndarray, value: np.ndarray, profile: np.ndarray, state: np.ndarray, action: np.ndarray,
    outputs: np.ndarray, site: np.ndarray, n_sites: int, reg: np.ndarray, decl: np.ndarray, dnum: np.ndarray, nxt: np.ndarray,
) -> None:  # pragma: no cover - compiled
    """Run the instructions ``code`` over every row into the registers ``reg (R, N)``, then write
    each declaration's clipped value into its column of ``nxt (N, S)``.

    ``decl (D, 5)`` int64 per declaration: (form 0 next / 1 queue, value or arrivals register,
    service register, its state column in ``nxt``, the state column the queue reads now);
    ``dnum (D, 5)`` float64: (queue dt, queue cap, low bound, high bound, unused)."""
    n = reg.shape[1]
    for k in range(code.shape[0]):
        op, d, a, b = code[k, 0], code[k, 1], code[k, 2], code[k, 3]
        if op == 0:  # a column of a block (a: 0 profile, 1 state, 2 action, 3 outputs)
            src = profile if a == 0 else state if a == 1 else action if a == 2 else outputs
            for i in range(n):
                reg[d, i] = src[i, b]
        elif op == 1:
            for i in range(n):
                reg[d, i] = value[k]
        elif op == 2:  # + - * /, each a select the compiler can vectorise (`_first_nan`'s numbers)
            for i in range(n):
                x = reg[a, i]
                v = x + reg[b, i]
                reg[d, i] = x if np.isnan(x) else v
        elif op == 3:
            for i in range(n):
                x = reg[a, i]
                v = x - reg[b, i]
                reg[d, i] = x if np.isnan(x) else v
        elif op == 4:
            for i in range(n):
                x = reg[a, i]
                v = x * reg[b, i]
                reg[d, i] = x if np.isnan(x) else v
        elif op == 5:
            for i in range(n):
                x = reg[a, i]
                v = x / reg[b, i]
                reg[d, i] = x if np.isnan(x) else v
        elif op == 6:
            for i in range(n):
                reg[d, i] = -reg[a, i]
        elif op == 7:
            for i in range(n):
                reg[d, i] = reg[a, i]
        else:  # the sum (b = 1: the mean) of register a over each row's site, as `_site_total_kernel`
            sums = np.zeros(n_sites)
            for i in range(n):
                sums[site[i]] += reg[a, i]
            if b == 1:
                counts = np.zeros(n_sites, np.int64)
                for i in range(n):
                    counts[site[i]] += 1
                for s in range(n_sites):
                    sums[s] = sums[s] / np.float64(max(counts[s], 1))
            for i in range(n):
                reg[d, i] = sums[site[i]]
    for j in range(decl.shape[0]):
        form, r, rs, col, now_col = decl[j, 0], decl[j, 1], decl[j, 2], decl[j, 3], decl[j, 4]
        dt, cap, low, high = dnum[j, 0], dnum[j, 1], dnum[j, 2], dnum[j, 3]
        if form == 0:
            for i in range(n):
                nxt[i, col] = _clip(reg[r, i], low, high)
        else:  # next = clip(now + (arrivals - service) * dt, 0, max)
            for i in range(n):
                step = _first_nan(_first_nan(reg[r, i], reg[rs, i], 3), dt, 4)
                v = _clip(_first_nan(state[i, now_col], step, 2), 0.0, cap)
                nxt[i, col] = _clip(v, low, high)


@dataclass(frozen=True)
class DeclaredProgram:
    """A `DeclaredDynamics` as instructions for `_run` (see the module doc); built by `compile_program`.

    Attributes:
        code: ``(I, 4)`` int64 instructions; value: ``(I,)`` float64 each constant's value.
        registers: how many ``(N,)`` registers the instructions use.
        decl: ``(D, 5)`` int64 and dnum ``(D, 5)`` float64: per declaration, what `_run` writes.
    """

    code: np.ndarray
    value: np.ndarray
    registers: int
    decl: np.ndarray
    dnum: np.ndarray

    def apply(
        self, profile: np.ndarray, state: np.ndarray, action: np.ndarray, outputs: np.ndarray,
        site: np.ndarray, nxt: np.ndarray, n_sites: int,
    ) -> np.ndarray:
        """``nxt (N, S)`` float64 with every declared state column computed from the tick, in place
        (`edgetwin.imitation.layout.Layout.apply_declared`'s numbers to the bit): the raw ``profile
        (N, P)``, ``state (N, S)`` at t, ``action (N, A)``, outputs ``(N, Y)``, ``site (N,)`` ids."""
        n = len(nxt)
        reg = np.empty((self.registers, n), np.float64)
        _run(self.code, self.value, _f64(profile), _f64(state), _f64(action), _f64(outputs),
             np.ascontiguousarray(site, np.int64), int(n_sites), reg,
             self.decl, self.dnum, nxt)
        return nxt


def _f64(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float64)


class _Builder:
    """Instructions being written: registers are handed out in order; an expression part evaluated
    at one ``dt`` is compiled once (as `DeclaredDynamics.next_state`'s memo evaluates it once)."""

    def __init__(self, where: dict[str, tuple[int, int]]) -> None:
        self.where = where  # column name -> (block, column) of `DeclaredProgram.apply`'s arrays
        self.code: list[tuple[int, int, int, int]] = []
        self.value: list[float] = []
        self.registers = 0
        self.done: dict[tuple[str, float], int] = {}

    def emit(self, op: int, a: int = 0, b: int = 0, value: float = 0.0, dst: int | None = None) -> int:
        if dst is None:
            dst = self.registers
            self.registers += 1
        self.code.append((op, dst, a, b))
        self.value.append(value)
        return dst

    def column(self, name: str) -> int | None:
        hit = self.where.get(name)
        return None if hit is None else self.emit(_LOAD, *hit)

    def numexpr(self, text: str, inputs: dict[str, int]) -> int | None:
        """numexpr's program of ``text`` copied instruction for instruction, its variables read from
        the registers ``inputs`` (by numexpr variable name); the register of its result, or None
        when the program holds an instruction `_run` does not have."""
        from numexpr.necompiler import disassemble

        names, uses_vml, program = _program(text)
        if uses_vml or program.signature != b"d" * len(names) or any(v not in inputs for v in names):
            return None
        regs: dict[int, int] = {1 + i: inputs[v] for i, v in enumerate(names)}
        for k, c in enumerate(program.constants):  # numexpr's constant registers follow its inputs
            if not isinstance(c, (float, np.floating)):
                return None
            regs[1 + len(names) + k] = self.emit(_CONST, value=float(c))
        for row in disassemble(program):  # r0 the result, r<i> the inputs, c<k> constants, t<k> temporaries
            op = _NUMEXPR_OPS.get(row[0])
            if op is None:
                return None
            args = [_register(r) for r in row[1:] if r is not None]
            if not args or any(r is None for r in args):
                return None
            dst, *src = [int(r) for r in args if r is not None]
            if any(r not in regs for r in src):
                return None
            if dst not in regs:  # the result or a temporary: a register of its own
                regs[dst] = self.registers
                self.registers += 1
            ins = [regs[r] for r in src] + [0, 0]
            self.code.append((op, regs[dst], ins[0], ins[1]))
            self.value.append(0.0)
        return regs.get(0)

    def expression(self, e: Expression, dt: float) -> int | None:
        """The register of ``e``'s ``(N,)`` values at step ``dt`` (`Expression.evaluate`'s), or None."""
        key = (e.text, float(dt))
        if key in self.done:
            return self.done[key]
        if not e.aggregates and not e.outer_names:  # a constant: numexpr's value, as `evaluate` takes it
            out: int | None = self.emit(_CONST, value=_constant(e.outer))
        else:
            inputs: dict[str, int] = {DT_NAME: self.emit(_CONST, value=float(np.float64(dt)))}
            for name in e.names - {DT_NAME}:
                reg = self.column(name)
                if reg is None:
                    return None
                inputs[variable(name)] = reg
            for k, ((op, inner), names) in enumerate(zip(e.aggregates, e.inner_names, strict=True)):
                if op not in ("sum", "mean"):
                    return None
                if len(names) == 1 and inner == variable(names[0]):
                    per_agent: int | None = inputs[inner]
                else:
                    per_agent = self.numexpr(inner, inputs)
                if per_agent is None:
                    return None
                inputs[f"_agg{k}"] = self.emit(_SITE, per_agent, int(op == "mean"))
            out = self.numexpr(e.outer, inputs)
        if out is not None:
            self.done[key] = out
        return out


def _register(text: object) -> int | None:
    """numexpr's register number in a disassembled argument (``b'r1[x]'``, ``b't5'``, ``b'c3[0.5]'``)."""
    if not isinstance(text, bytes):
        return None
    head = text.split(b"[", 1)[0]
    return int(head[1:]) if head[:1] in (b"r", b"t", b"c") and head[1:].isdigit() else None


def compile_program(
    dynamics: DeclaredDynamics, blocks: Sequence[Sequence[str]], state: Sequence[str]
) -> DeclaredProgram | None:
    """``dynamics`` as a `DeclaredProgram` reading the columns named ``blocks`` (profile, state,
    action and output column names, in the order of `DeclaredProgram.apply`'s arrays) and writing
    the declared columns of ``state`` (the names of ``nxt``'s columns), or None where it cannot be
    one (the module doc): then `DeclaredDynamics.next_state` is the evaluator."""
    if len(blocks) != 4 or any(d.function is not None for d in dynamics.declarations):
        return None
    where = {c: (b, j) for b, names in enumerate(blocks) for j, c in enumerate(names)}
    build = _Builder(where)
    decl, dnum = [], []
    for d in dynamics.declarations:
        if d.column not in state:
            return None
        low, high = dynamics.bounds.get(d.column, (None, None))
        lo, hi = -np.inf if low is None else float(low), np.inf if high is None else float(high)
        if d.next is not None:
            r = build.expression(d.next, dynamics.step_seconds)
            if r is None:
                return None
            decl.append((0, r, 0, state.index(d.column), 0))
            dnum.append((0.0, 0.0, lo, hi, 0.0))
        elif d.arrivals is not None and d.service is not None:
            dt = d.dt if d.dt is not None else dynamics.step_seconds
            cap = d.max if d.max is not None else (np.inf if high is None else high)
            a, s = build.expression(d.arrivals, dt), build.expression(d.service, dt)
            if a is None or s is None or d.column not in where or where[d.column][0] != 1:
                return None
            decl.append((1, a, s, state.index(d.column), where[d.column][1]))
            dnum.append((float(dt), float(cap), lo, hi, 0.0))
        else:
            return None
    return DeclaredProgram(
        np.asarray(build.code, np.int64).reshape(-1, 4), np.asarray(build.value, np.float64), max(build.registers, 1),
        np.asarray(decl, np.int64).reshape(-1, 5), np.asarray(dnum, np.float64).reshape(-1, 5),
    )
