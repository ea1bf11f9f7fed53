"""The package's layout: every import runs down DESIGN.md's layer order, and no two modules import each other.

The layers (DESIGN.md, "Layout: one package, layered"): a subpackage imports only from the ones above
it in this table, never from a lower row::

    1 contract   2 generative, imitation   3 twin   4 policies   5 emulator   6 edge   7 loop, federation
    8 cli, demo

and the edge package (what runs at a site) never imports the emulator, although it sits below it.

Every import counts, wherever it is written: at the top of a module, inside a function, under
``if TYPE_CHECKING:``, and the names a package's ``__init__`` exports lazily (its ``_WHERE`` table of
name -> module). A cycle is any loop in the module graph, package ``__init__`` s included, so a
submodule that imports its own package's ``__init__`` (which exports from that submodule) is one.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import edgetwin

LAYERS = {
    "contract": 1,
    "generative": 2,
    "imitation": 2,
    "twin": 3,
    "policies": 4,
    "emulator": 5,
    "edge": 6,
    "loop": 7,
    "federation": 7,
    "cli": 8,
    "demo": 8,
}
PACKAGES = ("contract", "generative", "imitation", "twin", "policies", "emulator", "edge", "loop", "federation")
#: (importer, imported) package pairs that are forbidden although the layer order allows them
FORBIDDEN = (("edge", "emulator"),)
ROOT = Path(edgetwin.__file__).parent


def module_files(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every ``.py`` under ``root`` (a package directory)."""
    out = {}
    for f in sorted(root.rglob("*.py")):
        parts = f.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = f
    return out


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of ``known`` that module ``name`` (file ``path``) imports, anywhere in it."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            targets += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            # `from pkg import sub` imports the submodule `pkg.sub`; `from mod import name` imports mod
            targets += [f"{mod}.{a.name}" if f"{mod}.{a.name}" in known else mod for a in node.names]
        elif (
            isinstance(node, ast.Assign)
            and any(getattr(t, "id", None) == "_WHERE" for t in node.targets)
            and isinstance(node.value, ast.Dict)
        ):  # a lazy export table: name -> defining module
            targets += [v.value for v in node.value.values if isinstance(v, ast.Constant)]
    out = set()
    for t in targets:
        while t and t not in known:
            t = t.rpartition(".")[0]
        if t and t != name:
            out.add(t)
    return out


def layer_of(module: str) -> int | None:
    parts = module.split(".")
    return LAYERS.get(parts[1]) if len(parts) > 1 else 0  # the top package itself sits above all


def layout_problems(root: Path) -> list[str]:
    """Every import against the layer order, every module outside a layer, and every import cycle."""
    files = module_files(root)
    known = set(files)
    graph = {m: imports_of(m, f, known) for m, f in files.items()}
    problems = []
    for m in sorted(graph):
        a = layer_of(m)
        if a is None:
            problems.append(f"{m} is in no layer of DESIGN.md")
            continue
        for d in sorted(graph[m]):
            b = layer_of(d)
            if b is not None and b > a:
                problems.append(f"{m} (layer {a}) imports {d} (layer {b}), a lower layer")
            pair = (m.split(".")[1] if "." in m else "", d.split(".")[1] if "." in d else "")
            if pair in FORBIDDEN:
                problems.append(f"{m} imports {d}: edgetwin.{pair[0]} never imports edgetwin.{pair[1]}")
    # cycles: Tarjan's strongly connected components
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                members = set(component)
                pairs = sorted((x, y) for x in members for y in graph[x] if y in members)
                edges = ", ".join(f"{x} -> {y}" for x, y in pairs)
                problems.append(f"import cycle between {' and '.join(sorted(component))} ({edges})")

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return problems


def test_every_import_runs_down_the_layers_and_no_two_modules_import_each_other() -> None:
    problems = layout_problems(ROOT)
    assert not problems, "\n".join(problems)


def test_the_checker_names_an_upward_import_and_a_cycle_hidden_in_functions(tmp_path: Path) -> None:
    pkg = tmp_path / "edgetwin"
    for sub in ("contract", "twin"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text('"""x"""\n')
    (pkg / "__init__.py").write_text("")
    # an upward import, lazily inside a function, and a cycle through a TYPE_CHECKING import
    (pkg / "contract" / "spec.py").write_text("def f():\n    from edgetwin.twin.twin import Twin\n")
    (pkg / "twin" / "twin.py").write_text("from edgetwin.twin import envs\n")
    (pkg / "twin" / "envs.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from edgetwin.twin.twin import Twin\n"
    )
    (pkg / "twin" / "report.py").write_text("from ..contract.spec import f\n")  # relative, downward: fine
    (pkg / "cli_tool.py").write_text("")
    problems = layout_problems(pkg)
    assert "edgetwin.contract.spec (layer 1) imports edgetwin.twin.twin (layer 3), a lower layer" in problems
    assert any(
        p.startswith("import cycle between edgetwin.twin.envs and edgetwin.twin.twin") for p in problems
    ), problems
    assert "edgetwin.cli_tool is in no layer of DESIGN.md" in problems
    assert len(problems) == 3, problems


def test_the_checker_names_an_edge_module_that_imports_the_emulator(tmp_path: Path) -> None:
    """The edge runs at a site: it never imports the emulated system, although the layer order would allow it."""
    pkg = tmp_path / "edgetwin"
    for sub in ("emulator", "edge", "loop"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text('"""x"""\n')
    (pkg / "__init__.py").write_text("")
    (pkg / "emulator" / "cluster.py").write_text("")
    (pkg / "edge" / "runtime.py").write_text("def f():\n    from edgetwin.emulator.cluster import X\n")
    (pkg / "loop" / "fleet.py").write_text("from edgetwin.emulator.cluster import X\n")  # the loop may
    problems = layout_problems(pkg)
    assert problems == ["edgetwin.edge.runtime imports edgetwin.emulator.cluster: edgetwin.edge never imports edgetwin.emulator"]


def test_a_package_that_exports_lazily_counts_its_table_as_imports(tmp_path: Path) -> None:
    pkg = tmp_path / "edgetwin"
    (pkg / "edge").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "edge" / "__init__.py").write_text('_WHERE = {"Bus": "edgetwin.edge.bus"}\n')
    (pkg / "edge" / "bus.py").write_text("from edgetwin.edge import Bus\n")  # through its own package
    problems = layout_problems(pkg)
    assert problems == ["import cycle between edgetwin.edge and edgetwin.edge.bus "
                        "(edgetwin.edge -> edgetwin.edge.bus, edgetwin.edge.bus -> edgetwin.edge)"]


@pytest.mark.parametrize("package", PACKAGES)
def test_each_package_says_what_it_owns_and_exports_its_public_names(package: str) -> None:
    mod = importlib.import_module(f"edgetwin.{package}")
    assert mod.__doc__ and len(mod.__doc__.split()) >= 10, f"edgetwin.{package} has no docstring saying what it owns"
    public = getattr(mod, "__all__", None)
    assert public, f"edgetwin.{package} exports no public names (__all__)"
    for name in public:
        assert getattr(mod, name) is not None, f"edgetwin.{package}.{name}"


def test_the_public_imports_a_user_types() -> None:
    from edgetwin.emulator import EdgeCluster
    from edgetwin.policies import load_policy, train_policy
    from edgetwin.twin import Twin

    assert Twin.__module__ == "edgetwin.twin.twin"
    assert EdgeCluster.__module__ == "edgetwin.emulator.cluster"
    assert load_policy.__module__ == "edgetwin.policies.export"
    assert train_policy.__module__ == "edgetwin.policies.train"
