"""Issue 46's size rules, read from the source (an AST walk over ``edgetwin/``, no import):

- no module over 1,000 lines;
- no function or method over 150 lines (``def`` to its last line, decorators excluded);
- no CLI command (a function decorated ``@<app>.command(...)``) over 20 parameters.

`KNOWN_OVER` lists offenders that are allowed for now (with why); it is empty. A listed offender
that is no longer over its limit fails too, so the list cannot go stale.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "edgetwin"
MAX_MODULE_LINES = 1_000
MAX_FUNCTION_LINES = 150
MAX_COMMAND_PARAMETERS = 20

#: (kind, "path relative to edgetwin/:qualified name") -> the helper who owns the file this round
KNOWN_OVER: dict[tuple[str, str], str] = {}


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def _functions(tree: ast.AST, prefix: str = "") -> list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function and method with its qualified name (``Class.method``, ``outer.inner``)."""
    found: list[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]] = []
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = f"{prefix}{node.name}"
            found.append((name, node))
            found += _functions(node, f"{name}.")
        elif isinstance(node, ast.ClassDef):
            found += _functions(node, f"{prefix}{node.name}.")
        else:
            found += _functions(node, prefix)
    return found


def _is_command(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Decorated ``@something.command(...)`` (typer's app or a sub-app)."""
    return any(
        isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr == "command"
        for d in fn.decorator_list
    )


def _parameters(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    a = fn.args
    return len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)


def offenders(root: Path = ROOT) -> dict[tuple[str, str], int]:
    """``(kind, "relpath[:name]") -> size`` for everything over its limit under ``root``."""
    over: dict[tuple[str, str], int] = {}
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        n = _lines(path)
        if n > MAX_MODULE_LINES:
            over[("module", rel)] = n
        for name, fn in _functions(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            length = int(fn.end_lineno or fn.lineno) - fn.lineno + 1
            if length > MAX_FUNCTION_LINES:
                over[("function", f"{rel}:{name}")] = length
            if _is_command(fn) and _parameters(fn) > MAX_COMMAND_PARAMETERS:
                over[("command", f"{rel}:{name}")] = _parameters(fn)
    return over


def test_no_module_function_or_command_over_its_limit() -> None:
    new = {k: v for k, v in offenders().items() if k not in KNOWN_OVER}
    assert not new, (
        f"over the limits (module {MAX_MODULE_LINES} lines, function {MAX_FUNCTION_LINES} lines, command "
        f"{MAX_COMMAND_PARAMETERS} parameters): {new}"
    )


def test_the_allow_list_holds_only_current_offenders() -> None:
    stale = sorted(set(KNOWN_OVER) - set(offenders()))
    assert not stale, f"no longer over the limit, remove from KNOWN_OVER: {stale}"


def test_the_walk_finds_each_kind_of_offender(tmp_path: Path) -> None:
    """The rule can fail: a long module, a long nested method and a 21-parameter command are found."""
    params = ", ".join(f"p{i}: int = 0" for i in range(MAX_COMMAND_PARAMETERS + 1))
    body = "\n".join(f"        x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    src = (
        "import typer\napp = typer.Typer()\n\n"
        f"@app.command('big')\ndef big({params}) -> None:\n    pass\n\n"
        f"class K:\n    def long(self) -> None:\n{body}\n"
    )
    src += "\n" * (MAX_MODULE_LINES + 1 - src.count("\n"))
    (tmp_path / "m.py").write_text(src)
    (tmp_path / "small.py").write_text("@app.command()\ndef ok(a: int) -> None:\n    pass\n")
    found = offenders(tmp_path)
    assert found == {
        ("module", "m.py"): MAX_MODULE_LINES + 1,
        ("command", "m.py:big"): MAX_COMMAND_PARAMETERS + 1,
        ("function", "m.py:K.long"): MAX_FUNCTION_LINES + 1,
    }
