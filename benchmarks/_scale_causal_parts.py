"""Where a causal fit's and a MAIL-MMSG fit's CPU time goes, by part, with the training work of each
(issue 47: the causal fit against MAIL-MMSG's, ``scale.py --causal-profile``).

`watch_parts` wraps, for the duration of one fit, the functions each part runs in — the causal
model's cross-fitted choice of λ (`select_invariance`), its training stacks (`NetStack.run`), the
engines' and clients' behaviour cloning (`behaviour_clone`, inside or outside `fit_engines`) and
MAIL-MMSG's GAIL rounds (`gail_round`) — and adds up the CPU seconds spent inside each (the
process's CPU clock, no profiler: a wrapper costs microseconds a call, and these functions are
called tens of times a fit) and the work each trained: Adam steps, rows a step, nets a stack.
Why not cProfile: it inflates a fit in proportion to its Python calls, MAIL-MMSG's far more
than the causal fit's (docs/benchmarks/scale/README.md), so its shares are not the unprofiled ones.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

#: the parts, in the page's order: (key, what the page calls it)
PARTS = (
    ("selection", "choosing λ: the cross-fitting (`select_invariance`; 3 folds x a stack of the λ alive)"),
    ("final", "the members' final causal fits (`NetStack.run` outside the selection)"),
    ("engines_bc", "the engines' behaviour cloning (`fit_engines`; the same in both fits)"),
    ("clients_bc", "the clients' behaviour cloning (MAIL-MMSG's pre-training)"),
    ("gail", "the GAIL rounds (MAIL-MMSG's adversarial rounds: PPO in the training world + discriminator)"),
    ("other", "the rest (step tables, output noise, support index, layout)"),
)


@contextmanager
def watch_parts() -> Iterator[dict[str, Any]]:
    """For the ``with`` block: ``{"cpu": {part: CPU s}, "work": [...], "total_cpu_s": ...}``, filled
    as the fit runs (``work``: one record per training call: part, nets, rows a step, steps).
    Restores every wrapped function on exit."""
    import edgetwin.imitation.causal as causal
    import edgetwin.imitation.mail as mail
    import edgetwin.twin.twin as twin

    rec: dict[str, Any] = {"cpu": {k: 0.0 for k, _ in PARTS}, "work": []}
    where: list[str] = []  # the part being timed (innermost last)
    saved: list[tuple[Any, str, Any]] = []

    def patch(obj: Any, name: str, make: Callable[[Any], Any]) -> None:
        orig = getattr(obj, name)
        saved.append((obj, name, orig))
        setattr(obj, name, make(orig))

    def timed(part: str, orig: Any, work: Callable[..., dict[str, Any] | None] | None = None) -> Any:
        def run(*a: Any, **k: Any) -> Any:
            outer = where[-1] if where else None
            where.append(part)
            c = time.process_time()
            try:
                return orig(*a, **k)
            finally:
                spent = time.process_time() - c
                where.pop()
                rec["cpu"][part] += spent
                if outer is not None:  # an inner part's time is not its outer part's
                    rec["cpu"][outer] -= spent
                if work is not None and (w := work(*a, **k)) is not None:
                    rec["work"].append({"part": part, "cpu_s": spent, **w})
        return run

    def stack_run(orig: Any) -> Any:
        def run(self: Any, until: int, history: Any = None) -> None:
            first = self.step
            nets, rows = len(self), int(self.member.shape[1])
            part = "selection" if where and where[-1] == "selection" else "final"
            if part == "final":
                timed("final", orig)(self, until, history)
            else:
                orig(self, until, history)
            rec["work"].append({"part": part, "nets": nets, "rows": rows, "steps": int(until - first),
                                "rows_per_policy": [int(v) for v in self.sizes]})
        return run

    def bc_work(x: Any, y: Any, policy: Any, epochs: int, seed: int, batch_size: int = 256,
                max_steps: int | None = None, **_: Any) -> dict[str, Any]:
        return {"nets": 1, "rows": int(min(batch_size, len(x))), "steps": int(mail.bc_steps(len(x), epochs, batch_size, max_steps))}

    def bc(orig: Any) -> Any:
        def run(*a: Any, **k: Any) -> Any:
            part = "engines_bc" if where and where[-1] == "engines_bc" else "clients_bc"
            if part == "engines_bc":  # the engines' part is timed by `fit_engines`: count the work only
                out = orig(*a, **k)
                rec["work"].append({"part": part, **bc_work(*a, **k)})
                return out
            return timed(part, orig, bc_work)(*a, **k)
        return run

    patch(causal, "select_invariance", lambda o: timed("selection", o))
    patch(causal.NetStack, "run", stack_run)
    patch(mail, "fit_engines", lambda o: timed("engines_bc", o))
    patch(twin, "fit_engines", lambda o: timed("engines_bc", o))
    patch(mail, "behaviour_clone", bc)
    patch(mail, "gail_round", lambda o: timed("gail", o))
    c = time.process_time()
    try:
        yield rec
    finally:
        rec["total_cpu_s"] = time.process_time() - c
        rec["cpu"]["other"] = rec["total_cpu_s"] - sum(v for k, v in rec["cpu"].items() if k != "other")
        for obj, name, orig in reversed(saved):
            setattr(obj, name, orig)


def summary(rec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Per part of one fit's `watch_parts` record: CPU s, training calls, Adam steps (each call's;
    a stack's steps summed over its checks), rows a step, and the work in millions of
    net-row-steps (nets x rows a step x steps: the GEMM work, for nets of one size)."""
    out: dict[str, dict[str, Any]] = {}
    for key, _ in PARTS:
        work = [w for w in rec["work"] if w["part"] == key]
        out[key] = {"cpu_s": float(rec["cpu"].get(key, 0.0)), "calls": len(work),
                    "steps": int(sum(w["steps"] for w in work)),
                    "rows_per_step": sorted({int(w["rows"]) for w in work}),
                    "nets": sorted({int(w["nets"]) for w in work}),
                    "mrow_steps": float(sum(w["nets"] * w["rows"] * w["steps"] for w in work)) / 1e6}
    return out


def parts_lines(rounds: list[dict[str, Any]]) -> list[str]:
    """The page's table: per part, the median over the rounds of each fit's CPU seconds, with the
    training work of the last round's fits (the work is the same every round: the same seed)."""
    if not rounds or "parts" not in rounds[0].get("causal", {}):
        return []
    lines = ["Where each fit's CPU time goes (the rounds above, no profiler: CPU seconds inside each part, medians over "
             "the rounds; the work from the last round, the same every round: Adam steps summed over the part's "
             "training calls, rows a step (all policies' draws together), nets a stack, and millions of net-row-steps = "
             "nets x rows a step x steps, the GEMM work of nets of one size):", "",
             "| fit | part | CPU s | share | training calls | Adam steps | rows a step | nets | M net-row-steps |",
             "|---|---|---:|---:|---:|---:|---|---|---:|"]
    for model, name in (("causal", "causal"), ("mail", "MAIL-MMSG")):
        total = float(np.median([r[model]["parts_total_cpu_s"] for r in rounds]))
        last = rounds[-1][model]["parts"]
        for key, label in PARTS:
            cpu = float(np.median([r[model]["parts"][key]["cpu_s"] for r in rounds]))
            p = last[key]
            if p["calls"] == 0 and cpu < 0.05 and key != "other":
                continue
            rows = ", ".join(f"{v:,}" for v in p["rows_per_step"]) if p["rows_per_step"] else "—"
            nets = ", ".join(str(v) for v in p["nets"]) if p["nets"] else "—"
            calls = str(p["calls"]) if p["calls"] else "—"
            steps = f"{p['steps']:,}" if p["calls"] else "—"
            mrs = f"{p['mrow_steps']:.1f}" if p["calls"] else "—"
            lines.append(f"| {name} | {label} | {cpu:.1f} | {cpu / total:.0%} | {calls} | {steps} | {rows} | {nets} | {mrs} |")
        lines.append(f"| {name} | the whole fit | {total:.1f} | 100% | | | | | |")
    return lines + [""]
