"""The house's rules over every product folder: no file over 700 lines, no class over 300, no function over 80, no
import circle. No module is left out.

The product is what pyproject.toml installs (its `[tool.setuptools.packages.find]`: respawn, respawn_cli, respawn_ops,
localcloud, trainer, respawn_trainer) and the functions' entry point, functions/main.py. Each module is named as it
imports: functions/respawn/decide.py is `respawn.decide`, trainer/config.py `trainer.config`,
trainer/respawn_trainer/env.py `respawn_trainer.env`. Every Python file under a product folder must have such a name,
and every top-level folder holding Python is product or one of NOT_PRODUCT, so a new package cannot escape the rules.

An import is any import statement naming one of these modules, absolute or relative, at a module's top, inside a
function (a lazy import still closes a circle) or under `if TYPE_CHECKING:` (a circle the type checker follows is one
a reader follows too).
"""

from __future__ import annotations

import ast
import functools
import tomllib
from collections.abc import Iterable
from pathlib import Path

import pytest
from setuptools import find_namespace_packages

ROOT = Path(__file__).resolve().parents[2]
MAX_FILE_LINES = 700
MAX_CLASS_LINES = 300
MAX_FUNCTION_LINES = 80
# Top-level folders whose Python is not the product: the suite, the benchmarks, the example programs.
NOT_PRODUCT = ("tests", "bench", "examples")
# The entry points the functions deploy with `--source=functions`, outside any package.
ENTRY_FOLDER = "functions"


@functools.cache
def packages() -> dict[str, Path]:
    """Every package pyproject.toml installs, by dotted name, and its folder (found as setuptools finds them)."""
    found = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    out: dict[str, Path] = {}
    for where in found["where"]:
        for name in find_namespace_packages(ROOT / where, include=found["include"], exclude=found.get("exclude", ())):
            out[name] = ROOT / where / name.replace(".", "/")
    return out


@functools.cache
def modules() -> dict[str, Path]:
    """Every product module by dotted name (a package by its __init__.py)."""
    out: dict[str, Path] = {}
    for package, folder in packages().items():
        for path in sorted(folder.glob("*.py")):
            out[package if path.stem == "__init__" else f"{package}.{path.stem}"] = path
    for path in sorted((ROOT / ENTRY_FOLDER).glob("*.py")):
        out[path.stem] = path
    return out


def product_folders() -> set[str]:
    return {path.relative_to(ROOT).parts[0] for path in modules().values()}


def oversized(source: str, lines: int | None = None) -> list[str]:
    """What in `source` breaks the size rules: the file's length, each class and function over its limit."""
    found = []
    lines = len(source.splitlines()) if lines is None else lines
    if lines > MAX_FILE_LINES:
        found.append(f"{lines} lines, at most {MAX_FILE_LINES}")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef):
            what, limit = "class", MAX_CLASS_LINES
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            what, limit = "function", MAX_FUNCTION_LINES
        else:
            continue
        length = (node.end_lineno or node.lineno) - node.lineno + 1
        if length > limit:
            found.append(f"{what} {node.name} (line {node.lineno}) is {length} lines, at most {limit}")
    return found


def python_files(folder: Path) -> list[Path]:
    """The Python files under `folder`, outside hidden folders (virtual environments) and installed node modules."""
    return [
        path
        for path in folder.rglob("*.py")
        if not any(part.startswith(".") or part == "node_modules" for part in path.relative_to(ROOT).parts)
    ]


def test_every_python_folder_is_product_or_named_as_not() -> None:
    folders = [folder for folder in ROOT.iterdir() if folder.is_dir() and not folder.name.startswith(".")]
    holding = {folder.name for folder in folders if python_files(folder)}
    unknown = holding - product_folders() - set(NOT_PRODUCT)
    assert not unknown, f"folders of Python neither installed by pyproject.toml nor in NOT_PRODUCT: {sorted(unknown)}"
    loose = sorted(path.name for path in ROOT.glob("*.py"))
    assert not loose, f"modules at the repository's top, in no package: {loose}"


def test_every_file_of_a_product_folder_is_a_module() -> None:
    named = set(modules().values())
    loose = [
        str(path.relative_to(ROOT))
        for folder in product_folders()
        for path in python_files(ROOT / folder)
        if path not in named
    ]
    assert not loose, f"Python files no import reaches as a module of the product: {sorted(loose)}"


def test_the_product_holds_the_known_packages() -> None:
    tops = {name.split(".")[0] for name in modules()}
    assert {"main", "respawn", "respawn_cli", "respawn_ops", "localcloud", "trainer", "respawn_trainer"} <= tops
    assert modules()["respawn_trainer"] == ROOT / "trainer" / "respawn_trainer" / "__init__.py"


@pytest.mark.parametrize("name", sorted(modules()))
def test_no_file_over_700_lines_class_over_300_or_function_over_80(name: str) -> None:
    path = modules()[name]
    found = oversized(path.read_text())
    assert not found, f"{path.relative_to(ROOT)}: " + "; ".join(found)


def test_the_size_rules_find_a_long_class_and_function() -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(300))
    assert oversized(f"class Long:\n{body}\n") == ["class Long (line 1) is 301 lines, at most 300"]
    assert oversized(f"class Fits:\n{body[: body.rindex(chr(10))]}\n") == []
    body = "\n".join(f"    x{i} = {i}" for i in range(80))
    assert oversized(f"async def long():\n{body}\n") == ["function long (line 1) is 81 lines, at most 80"]
    assert oversized("x = 1\n", lines=701) == ["701 lines, at most 700"]


def imported(name: str, path: Path, tree: ast.Module, known: Iterable[str]) -> set[str]:
    """The product's modules `name` imports, anywhere in it (a relative import resolved against its package)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            out |= {base} | {f"{base}.{a.name}" for a in node.names}
    return {m for m in out if m in set(known) and m != name}


def graph() -> dict[str, set[str]]:
    """module -> the product's modules it imports; a package's __init__ importing its own modules is how a package
    opens, not an arrow of a circle."""
    known = modules()
    edges = {name: imported(name, path, ast.parse(path.read_text()), known) for name, path in known.items()}
    return {
        n: {m for m in deps if not (m.startswith(n + ".") and known[n].name == "__init__.py")}
        for n, deps in edges.items()
    }


def cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle of the graph, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)) is not None:
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)) is not None:
            return found
    return None


def test_no_import_circle() -> None:
    found = cycle(graph())
    assert found is None, "import circle: " + " -> ".join(found or [])


def test_the_circle_finder_finds_one() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None


def test_imports_resolve_relative_and_type_checking_ones() -> None:
    source = (
        "from typing import TYPE_CHECKING\nfrom . import b\nfrom ..c import d\n"
        "if TYPE_CHECKING:\n    from p.e import f\ndef g():\n    import p.h\n"
    )
    known = {"p.q.a", "p.q.b", "p.c", "p.c.d", "p.e", "p.h"}
    assert imported("p.q.a", Path("a.py"), ast.parse(source), known) == {"p.q.b", "p.c", "p.c.d", "p.e", "p.h"}
