"""The code's shape, checked on its syntax trees (no import, no model): no import cycle among the
project's modules, the layers of pyproject.toml's import-linter contract (`lint-imports`) kept and
naming every module, and functions that fit on one screen."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

from conftest import require_extra

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("rllib_ragen", "envs")
# Lines of a function's code: its statements after the docstring (a builder's signature and
# per-argument docstring are long by RLlib's convention and are not counted).
MAX_FUNCTION_LINES = 60
CODE_DIRS = ("rllib_ragen", "envs", "scripts", "benchmarks", "tuned_examples")


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for package in PACKAGES for p in (REPO / package).rglob("*.py")}


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """Project modules `name` imports anywhere in its code, deferred (function-level) imports too."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                submodule = f"{node.module}.{alias.name}"
                found.add(submodule if submodule in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in modules and m != name}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []
    for root, children_of_root in graph.items():
        if root in index:
            continue
        work = [(root, iter(sorted(children_of_root)))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle_among_the_projects_modules():
    modules = _modules()
    assert "rllib_ragen.training.learner" in modules and "envs.registry" in modules
    graph = {name: _imports(name, path, modules) for name, path in modules.items()}
    assert _cycles(graph) == []


def _function_code_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    body = node.body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
        body = body[1:]
    return body[-1].end_lineno - body[0].lineno + 1 if body else 0


def test_no_function_is_longer_than_a_screen():
    long = []
    for directory in CODE_DIRS:
        for path in (REPO / directory).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    lines = _function_code_lines(node)
                    if lines > MAX_FUNCTION_LINES:
                        long.append(f"{path.relative_to(REPO)}:{node.lineno} {node.name}: {lines} lines")
    assert not long, long


def test_envs_do_not_depend_on_the_trainer():
    # Plain gymnasium text envs, usable without Ray or a model: why `envs` is its own top-level package.
    modules = _modules()
    for name, path in modules.items():
        if name.startswith("envs"):
            assert not {m for m in _imports(name, path, modules) if m.startswith("rllib_ragen")}, name


def _layers() -> list[list[str]]:
    """The import-linter layers contract of pyproject.toml, top layer first, each a list of modules."""
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["type"] == "layers"]
    return [[name.strip() for name in layer.replace("|", ":").split(":")] for layer in contract["layers"]]


def test_every_module_is_in_a_layer():
    # A module outside every layer would escape the contract: e.g. a new top-level module of rllib_ragen.
    layered = {name for layer in _layers() for name in layer}
    modules = _modules()
    outside = sorted(
        name for name in modules
        if name not in PACKAGES and not any(name == m or name.startswith(f"{m}.") for m in layered)
    )
    assert not outside, f"add these to a layer in pyproject.toml's [tool.importlinter]: {outside}"
    assert layered <= set(modules), sorted(layered - set(modules))


def test_lint_imports_keeps_the_layers_contract():
    require_extra("importlinter", "cpu,test")
    command = "import sys; from importlinter.cli import lint_imports; sys.exit(lint_imports(no_cache=True, no_logo=True))"
    out = subprocess.run([sys.executable, "-c", command], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_module_basename_in_the_package_is_unique() -> None:
    """A name says what a module holds wherever it is read: no two `registry.py` or `settings.py`
    (package markers `__init__.py` and `__main__.py` are names Python fixes)."""
    seen: dict[str, list[str]] = {}
    for path in (REPO / "rllib_ragen").rglob("*.py"):
        if path.name not in ("__init__.py", "__main__.py"):
            seen.setdefault(path.name, []).append(str(path.relative_to(REPO)))
    duplicates = {name: paths for name, paths in seen.items() if len(paths) > 1}
    assert not duplicates, f"module basenames used more than once: {duplicates}"
