"""Promises about spec expressions and the inputs of the same family (issue 37, items 1 and 7).

One test per promise; each failed on the code before `edgetwin.contract.expressions` existed:

- a spec expression is read on edgetwin's own grammar before any library sees it, so the issue's
  payload (numexpr's blacklist bypassed into Python's ``eval``) never runs: not from any key of a
  ``[[dynamics]]`` entry, not in ``logs validate``, not from a twin's ``layout.json`` or
  ``spec.toml`` (resealed), not from a federated ``twin_task`` a site parses;
- every construct outside the grammar is refused, naming the entry and the key;
- length and depth bombs are bad input (exit 2), not a RecursionError (exit 1);
- a declaration that is NaN on the log, or a ``[transition]`` function that cannot be called as
  one, is refused by ``logs validate`` (exit 2), not first by ``fit``;
- the decision wire refuses ``true``/``false`` among an observation's numbers;

and one that the grammar changed no number: every expression the repository ships evaluates to
the bits the old path (the spec's text handed to numexpr) gave.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
from pathlib import Path
from typing import Any

import numexpr
import numpy as np
import pandas as pd
import pytest
import tomli_w

from edgetwin.cli import main
from edgetwin.contract.dynamics import Expression, _reduce
from edgetwin.contract.errors import InputError
from edgetwin.contract.logs import write_table
from edgetwin.contract.manifest import write_manifest
from edgetwin.contract.spec import TwinSpec
from edgetwin.edge import decision_wire as W

REPO = Path(__file__).resolve().parents[2]

#: The issue's payload: a generator expression's own code object looks ``eval`` up in the builtins,
#: past numexpr's blacklist (which skips quoted text).
PAYLOAD = """(*(eval('__import__("os").system("touch {marker}")') for x in (1,)),)"""


def payload(marker: Path) -> str:
    return PAYLOAD.format(marker=marker)


def run(*argv: str) -> tuple[int, str, str]:
    """The CLI in-process: (exit code, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(argv))
            code = 0
        except SystemExit as e:
            code = int(e.code or 0)
    return code, out.getvalue(), err.getvalue()


# --------------------------------------------------------------------------------- a toy system
def toy_spec_dict(dynamics: list[dict[str, Any]] | None = None, **extra: Any) -> dict[str, Any]:
    """Two sites' CPU queue: a site constant (vCPUs), a site backlog, each agent's CPU."""
    d: dict[str, Any] = {
        "name": "toy-queue",
        "step_seconds": 60.0,
        "features": [
            {"name": "profile.vcpu", "low": 1.0, "scope": "site"},
            {"name": "state.backlog_s", "low": 0.0, "high": 10_000.0, "scope": "site"},
            {"name": "action.share", "low": 0.0, "high": 1.0},
            {"name": "kpi.cpu", "low": 0.0},
        ],
        "reward": {"weights": {"kpi.cpu": 1.0}},
        "dynamics": dynamics
        if dynamics is not None
        else [{"column": "state.backlog_s", "queue": {"arrivals": "sum(kpi.cpu) / profile.vcpu", "service": "1"}}],
    }
    d.update(extra)
    return d


def toy_log(steps: int = 6, agents: int = 4) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = []
    backlog = np.zeros(2)
    vcpu = np.array([2.0, 3.0])
    site = np.arange(agents) % 2
    for t in range(steps):
        share = rng.uniform(0, 1, agents)
        cpu = share * 1.5
        for i in range(agents):
            rows.append({"episode": "e0", "t": t, "agent": f"a{i}", "scenario": "web", "site": f"s{site[i]}",
                         "profile.vcpu": vcpu[site[i]], "state.backlog_s": backlog[site[i]],
                         "action.share": share[i], "kpi.cpu": cpu[i]})
        backlog = np.clip(backlog + (np.bincount(site, cpu, 2) / vcpu - 1.0) * 60.0, 0.0, 10_000.0)
    return pd.DataFrame(rows)


def write_toy(tmp_path: Path, spec: dict[str, Any]) -> tuple[Path, Path]:
    log, spec_path = tmp_path / "log.csv", tmp_path / "log.spec.toml"
    write_table(toy_log(), log)
    spec_path.write_text(tomli_w.dumps(spec))
    return log, spec_path


# ------------------------------------------------------------------ 1. the payload never runs
def _entry_with(key: str, text: str) -> dict[str, Any]:
    if key == "next":
        return {"column": "state.backlog_s", "next": text}
    if key in ("of", "divide_by"):
        block = {"column": "state.backlog_s", "aggregate": "sum", "of": "kpi.cpu", "divide_by": "profile.vcpu"}
        return block | {key: text}
    q = {"arrivals": "sum(kpi.cpu) / profile.vcpu", "service": "1"}
    return {"column": "state.backlog_s", "queue": q | {key.removeprefix("queue."): text}}


@pytest.mark.parametrize("key", ["next", "of", "divide_by", "queue.arrivals", "queue.service"])
def test_the_payload_never_runs_from_any_key_of_a_declaration(tmp_path: Path, key: str) -> None:
    marker = tmp_path / "PWNED"
    spec_path = tmp_path / "toy.spec.toml"
    spec_path.write_text(tomli_w.dumps(toy_spec_dict([_entry_with(key, payload(marker))])))
    with pytest.raises(InputError) as e:
        TwinSpec.load(spec_path)
    assert not marker.exists()
    assert str(e.value).startswith(f"{spec_path}: [[dynamics]] entry 1 (state.backlog_s): cannot read expression {key} = ")


def test_the_payload_never_runs_in_logs_validate(tmp_path: Path) -> None:
    marker = tmp_path / "PWNED"
    log, spec = write_toy(tmp_path, toy_spec_dict([_entry_with("next", payload(marker))]))
    code, out, err = run("logs", "validate", str(log), "--spec", str(spec))
    assert not marker.exists()
    assert code == 2 and "Traceback" not in err
    assert "[[dynamics]] entry 1 (state.backlog_s)" in err and len(err.strip().splitlines()) == 1


@pytest.fixture(autouse=True)
def _allow_spec_code(monkeypatch: pytest.MonkeyPatch) -> None:
    """The specs here name functions of these modules: allowed, as a user would (issue 37.2: a spec's
    module is imported only where allowed; tests/security/test_artifacts.py tests the refusal)."""
    monkeypatch.setenv("EDGETWIN_ALLOW_CODE", "math,toy_fns,toy_acct")


@pytest.fixture(scope="module")
def sealed(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A small real twin of the emulated cluster (its spec declares three columns) and a policy."""
    from edgetwin.emulator.cluster import ClusterConfig
    from edgetwin.emulator.logs import generate_logs
    from edgetwin.policies.export import export_policy
    from edgetwin.policies.heuristics import UniformRandom
    from edgetwin.twin.twin import Twin

    d = tmp_path_factory.mktemp("sealed")
    log, spec = generate_logs(ClusterConfig(n_agents=6, steps=6), episodes=3, policy="random", seed=1)
    assert any("next" in dec.raw for dec in spec.dynamics)
    twin = Twin.fit(log, spec, members=1, seed=0, progress=False, population_model="empirical",
                    response_model="bc", bc_epochs=1)
    twin.save(d / "twin")
    export_policy(UniformRandom(spec, seed=0), d / "policy", spec)
    return {"dir": d, "log": log, "spec": spec}


def _poison(doc: dict[str, Any], text: str) -> int:
    """Put ``text`` in the first ``next`` of a spec dict; returns that entry's number."""
    for i, entry in enumerate(doc["dynamics"], start=1):
        if "next" in entry:
            entry["next"] = text
            return i
    raise AssertionError("no next entry")


@pytest.mark.parametrize("file", ["layout.json", "spec.toml"])
def test_the_payload_never_runs_from_a_resealed_twin(sealed: dict[str, Any], tmp_path: Path, file: str) -> None:
    from edgetwin.twin.twin import Twin

    marker = tmp_path / "PWNED"
    t = tmp_path / "twin"
    shutil.copytree(sealed["dir"] / "twin", t)
    if file == "layout.json":
        doc = json.loads((t / file).read_text())
        i = _poison(doc["spec"], payload(marker))
        (t / file).write_text(json.dumps(doc))
    else:
        import tomllib

        doc = tomllib.loads((t / file).read_text())
        i = _poison(doc, payload(marker))
        (t / file).write_text(tomli_w.dumps(doc))
    write_manifest(t, "twin")  # the attacker reseals: the manifest proves integrity, not authorship
    with pytest.raises(InputError, match=re.escape(f"[[dynamics]] entry {i} (state.")):
        Twin.load(t)
    assert not marker.exists()
    code, _, err = run("evaluate", str(sealed["dir"] / "policy"), str(t), "--on", "twin", "--episodes", "1")
    assert not marker.exists()
    assert code == 2 and "Traceback" not in err and f"[[dynamics]] entry {i}" in err


def test_the_payload_never_runs_from_a_federated_twin_task(sealed: dict[str, Any], tmp_path: Path) -> None:
    """The site's own code for a task (`TwinSiteAgent._answer`, what its subscription runs on every
    ``twin_task``) parses the coordinator's layout: a task carrying the payload is an InputError."""
    from edgetwin.edge.bus.memory_bus import InMemoryBus, MemoryBroker
    from edgetwin.federation.twin.fit import FitOptions
    from edgetwin.federation.twin.messages import make_task
    from edgetwin.federation.twin.runner import TwinSiteAgent

    marker = tmp_path / "PWNED"
    log = sealed["log"]
    agent = TwinSiteAgent("site-a", log, sealed["spec"], InMemoryBus(MemoryBroker(), name="site-a"), "fit0")
    _, labels = agent.fitter.hello()
    layout = json.loads((sealed["dir"] / "twin" / "layout.json").read_text())
    i = _poison(layout["spec"], payload(marker))
    ctx = {"scenarios": labels["scenarios"], "columns": labels["columns"], "has_reward": "reward" in log.columns,
           "options": FitOptions().to_dict(), "layout": layout, "transformer": {}}
    with pytest.raises(InputError, match=re.escape(f"[[dynamics]] entry {i} (state.")):
        agent._answer(make_task("twin-coordinator", "fit0", 1, "summary", 0, 0, ctx))
    assert not marker.exists()


# ------------------------------------------------------------- 2. only the grammar is read
@pytest.mark.parametrize(
    "text, reason",
    [
        ("kpi.cpu.real", "an attribute"),
        ("profile.vcpu.__class__", "an attribute"),
        ("kpi.cpu[0]", "a subscript"),
        ("open('x')", "the function 'open'"),
        ("__import__('os')", "the function '__import__'"),
        ("sqrt(x=kpi.cpu)", "keyword arguments"),
        ("'a string'", "str literal"),
        ("b'x'", "bytes literal"),
        ("True + 1", "bool literal"),
        ("None", "NoneType literal"),
        ("1j", "complex literal"),
        ("(lambda: 1)()", "a call of something that is not a listed function"),
        ("lambda: 1", "a lambda"),
        ("[x for x in (1,)]", "a comprehension"),
        ("(x for x in (1,))", "a generator expression"),
        ("maximum(*(1, 2))", "a starred argument"),
        ("(1, 2)", "a tuple"),
        ("1 if kpi.cpu else 2", "a conditional"),
        ("kpi.cpu and 1", "'and'/'or'"),
        ("0 < kpi.cpu < 1", "a chained comparison"),
        ("min(kpi.cpu, 1)", "use minimum(a, b)"),
        ("sqrt(kpi.cpu, 1)", "takes 1 argument, got 2"),
        ("sum(sum(kpi.cpu))", "an aggregate inside an aggregate"),
        ("x", "unknown name(s) ['x']"),
        ("where", "is a function"),
        ("f'{1}'", "a string"),
        ("(y := 1)", "an assignment"),
        ("kpi.cpu // 2", "the operator FloorDiv"),
        ("1e999", "non-finite number"),
        ("kpi.cpu +", "not an expression"),
        ("", "it is empty"),
    ],
)
def test_every_construct_outside_the_grammar_is_refused_naming_the_entry(text: str, reason: str) -> None:
    d = toy_spec_dict([{"column": "state.backlog_s", "next": text}])
    with pytest.raises(InputError) as e:
        TwinSpec.from_dict(d, "toy.spec.toml")
    msg = str(e.value)
    assert msg.startswith("toy.spec.toml: [[dynamics]] entry 1 (state.backlog_s): cannot read expression next = ")
    assert reason in msg, msg
    assert "\n" not in msg


# ----------------------------------------------------------------- 3. length and depth bombs
@pytest.mark.parametrize(
    "bomb",
    [
        "kpi.cpu + " * 50_000 + "1",  # 500 KB
        "-" * 3_000 + "1",  # deep, short
        "(" * 300 + "1" + ")" * 300,  # more parentheses than Python's parser nests
        "sqrt(" * 150 + "kpi.cpu" + ")" * 150,  # nested calls
        " + ".join(["sum(kpi.cpu)"] * 200),  # a long flat chain is deep on its left
    ],
    ids=["500KB", "unary-chain", "parentheses", "calls", "flat-chain"],
)
def test_length_and_depth_bombs_are_bad_input(tmp_path: Path, bomb: str) -> None:
    log, spec = write_toy(tmp_path, toy_spec_dict([{"column": "state.backlog_s", "next": bomb}]))
    code, _, err = run("logs", "validate", str(log), "--spec", str(spec))
    assert code == 2, err
    assert "Traceback" not in err and "RecursionError" not in err
    assert "[[dynamics]] entry 1 (state.backlog_s): cannot read expression next" in err
    assert len(err) < 1_000  # the message shows the start of the text, not 500 KB of it


def test_the_bounds_leave_room_for_real_expressions() -> None:
    """A formula of 40 terms and a few nested calls is well inside both bounds."""
    from edgetwin.contract.expressions import MAX_DEPTH, MAX_LENGTH, parse_expression

    text = " + ".join(f"maximum(kpi.c{i} * 0.5, sqrt(abs(state.s{i})))" for i in range(40))
    assert len(text) < MAX_LENGTH
    parsed = parse_expression(text, "entry", "next")
    assert len(parsed.outer_names) == 80 and MAX_DEPTH >= 40 + 4


def test_more_columns_than_numexpr_takes_is_bad_input_when_the_spec_is_read() -> None:
    """numexpr compiles 70 operands and fails only when it runs (numpy's iterator takes 64): the
    expression is run once on one agent when the spec is read, so that is an error naming the entry."""
    feats = [{"name": f"kpi.c{i}"} for i in range(70)]
    d = toy_spec_dict([{"column": "state.backlog_s", "next": "sum(" + " + ".join(f"kpi.c{i}" for i in range(70)) + ")"}])
    d["features"] += feats
    with pytest.raises(InputError, match=r"\[\[dynamics\]\] entry 1 \(state.backlog_s\): cannot compile expression next = .*too many inputs"):
        TwinSpec.from_dict(d, "toy.spec.toml")


# --------------------------------------------------- 4. a declaration that is NaN on the log
@pytest.mark.parametrize("expr", ["sum((kpi.cpu - kpi.cpu) / 0)", "sqrt(0 - 1 - profile.vcpu)", "mean(kpi.cpu) * 0 / 0"])
def test_a_declaration_that_is_nan_on_the_log_is_refused_by_validate(tmp_path: Path, expr: str) -> None:
    log, spec = write_toy(tmp_path, toy_spec_dict([{"column": "state.backlog_s", "next": expr}]))
    code, out, err = run("logs", "validate", str(log), "--spec", str(spec), "--json")
    assert code == 2, out + err
    (p,) = [p for p in json.loads(out)["problems"] if p["code"] == "dynamics_not_finite"]
    assert p["severity"] == "fatal" and p["column"] == "state.backlog_s"
    assert "[[dynamics]] entry 1 (state.backlog_s)" in p["message"] and p["count"] == 24 and p["rows"] == [0, 1, 2, 3, 4]
    # and the same log with a finite declaration is usable
    good = toy_spec_dict()
    spec.write_text(tomli_w.dumps(good))
    assert run("logs", "validate", str(log), "--spec", str(spec))[0] == 0


def test_a_transition_function_that_cannot_be_one_is_refused_by_validate(tmp_path: Path) -> None:
    """``math:sqrt`` imports and is callable; the twin calls ``fn(state, action, response)``."""
    d = toy_spec_dict(transition={"function": "math:sqrt"})
    log, spec = write_toy(tmp_path, d)
    code, out, err = run("logs", "validate", str(log), "--spec", str(spec))
    assert code == 2, out + err
    assert "[transition] function 'math:sqrt' cannot be called as fn(state (N, S), action (N, A), response (N, R))" in out


def test_a_function_of_the_right_arity_but_the_wrong_shape_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "toy_fns.py").write_text(
        "import numpy as np\n"
        "def transition(state, action, response):\n    return state.sum()\n"
        "def reward(columns):\n    return np.full(len(columns['kpi.cpu']), np.inf)\n"
        "def good(state, action, response):\n    return state + action[:, :1]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    log, spec = write_toy(tmp_path, toy_spec_dict(transition={"function": "toy_fns:transition"}))
    code, out, _ = run("logs", "validate", str(log), "--spec", str(spec))
    assert code == 2 and "returned shape () for 3 agents; it must return (3, 1)" in out
    spec.write_text(tomli_w.dumps(toy_spec_dict(reward={"function": "toy_fns:reward"})))
    code, out, _ = run("logs", "validate", str(log), "--spec", str(spec))
    assert code == 2 and "[reward] function 'toy_fns:reward' returned values that are not finite" in out
    spec.write_text(tomli_w.dumps(toy_spec_dict(transition={"function": "toy_fns:good"})))
    assert run("logs", "validate", str(log), "--spec", str(spec))[0] == 0


# ---------------------------------------------------------------- 5. booleans on the wire
@pytest.mark.parametrize("obs", [[1, True, 2], [[1.5, False, 2.0]], [[1, 2, 3], [4, True, 6]]])
def test_the_decision_wire_refuses_booleans_among_numbers(obs: list[Any]) -> None:
    body = json.dumps({"obs": obs}).encode()
    with pytest.raises(W.BadDecisionRequest, match="true/false, which are not numbers") as e:
        W.parse_request(body, {}, None, "edge-a")
    assert e.value.code == 400
    # numbers alone, and a column named "true", still go through
    ok = W.parse_request(json.dumps({"obs": [1, 2, 3], "columns": ["true", "b", "c"]}).encode(), {}, None, "edge-a")
    assert ok.obs.tolist() == [[1.0, 2.0, 3.0]]


# --------------------------------------------------- 6. the grammar changed no number
_ROLE = re.compile(r"\b(profile|state|action|response|kpi)\.([A-Za-z_][A-Za-z0-9_]*)")
_AGG = re.compile(r"\b(sum|mean|min|max)\s*\(")


def _old_evaluate(text: str, cols: dict[str, np.ndarray], site: np.ndarray, n_sites: int, dt: float) -> np.ndarray:
    """The evaluation before the grammar: the spec's text, split at its aggregates by a regex,
    handed to ``numexpr.evaluate`` (safe here: these are the repository's own expressions)."""
    local = {k.replace(".", "__"): v for k, v in cols.items()} | {"dt": np.float64(dt)}
    outer, pos, k = [], 0, 0
    for m in _AGG.finditer(text):
        if m.start() < pos:
            continue
        depth, end = 1, m.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            end += 1
        inner = _ROLE.sub(r"\1__\2", text[m.end() : end - 1])
        per = np.broadcast_to(np.asarray(numexpr.evaluate(inner, local_dict=dict(local)), np.float64), (len(site),))
        local[f"_agg{k}"] = _reduce(m.group(1), per, site, n_sites)[site]
        outer.append(text[pos : m.start()] + f"_agg{k}")
        pos, k = end, k + 1
    outer.append(text[pos:])
    out = numexpr.evaluate(_ROLE.sub(r"\1__\2", "".join(outer)), local_dict=local)
    return np.broadcast_to(np.asarray(out, np.float64), (len(site),))


def shipped_expressions() -> list[str]:
    """Every expression the repository ships: in the docs and README, the package's docstrings and
    constants (the emulated cluster's declarations), and the tests' valid declarations."""
    from edgetwin.emulator.cluster import DECLARED_DYNAMICS

    found: set[str] = set()
    key = r"(?:next|of|divide_by|arrivals|service)"
    pattern = re.compile(rf"""(?:\b{key}\s*=\s*|"{key}"\s*:\s*)"([^"\n]*)\"""")
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "edgetwin").rglob("*.py"))]
    for f in files:
        found.update(pattern.findall(f.read_text(encoding="utf-8")))
    for entry in DECLARED_DYNAMICS:
        if "aggregate" in entry:
            found.add(f"({entry['aggregate']}({entry['of']})) / ({entry['divide_by']})")
        found.update(v for k, v in entry.items() if k in ("next", "of", "divide_by"))
        found.update(entry.get("queue", {}).values())
    # tests/test_dynamics.py and tests/test_scale.py
    found |= {"sum(kpi.site_cpu) / profile.vcpu", "1", "0.05", "kpi.site_cpu * 2", "max(kpi.x * dt) - 1",
              "state.bg ** 2 / (dt + 1)", "sum(kpi.x) / profile.cap + state.bg"}
    # and what the grammar's own documentation shows
    found |= {"where((kpi.x > 1) & (state.bg < 0.5), 1, 0)", "maximum(state.bg - 1, 0)", "(state.bg + 1) ** 2",
              "-kpi.x ** 2 % 3 + +1e-3", "sqrt(abs(state.bg - kpi.x)) * exp(-dt / 3600)", "minimum(kpi.x, 2) / mean(kpi.x)"}
    return sorted(e for e in found if not e.startswith(("module", "mypkg")))


def test_every_shipped_expression_reads_and_gives_the_same_numbers() -> None:
    exprs = shipped_expressions()
    assert len(exprs) >= 12 and "sum(kpi.edge_cpu) / profile.site_vcpu + state.site_background" in exprs
    rng = np.random.default_rng(3)
    n, n_sites = 400, 7
    site = rng.integers(0, n_sites, n)
    for text in exprs:
        e = Expression.compile(text, "shipped", "next")
        cols = {c: rng.lognormal(0.0, 1.0, n) for c in sorted(e.names - {"dt"})}
        got = e.evaluate(cols, site, n_sites, 300.0)
        want = _old_evaluate(text, cols, site, n_sites, 300.0)
        assert got.tobytes() == np.ascontiguousarray(want).tobytes(), text
        assert np.isfinite(got).all(), text


def test_a_declared_function_that_raises_on_the_log_is_refused_by_validate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It passes the spec's probe (3 agents of ones) and raises on the log's own rows: the twin
    would call it on ticks like these, so validate names the entry (it was a warning)."""
    (tmp_path / "toy_acct.py").write_text(
        "import numpy as np\n"
        "def backlog(columns, site):\n"
        "    if (columns['kpi.cpu'] != 1.0).any():\n        raise ZeroDivisionError('no idle site')\n"
        "    return np.zeros(len(site))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    log, spec = write_toy(tmp_path, toy_spec_dict([{"column": "state.backlog_s", "function": "toy_acct:backlog"}]))
    code, out, err = run("logs", "validate", str(log), "--spec", str(spec), "--json")
    assert code == 2, out + err
    (p,) = [p for p in json.loads(out)["problems"] if p["code"] == "dynamics_failed"]
    assert p["severity"] == "fatal"
    assert p["message"] == "[[dynamics]] entry 1 (state.backlog_s) fails on the log's rows (ZeroDivisionError: no idle site)"
