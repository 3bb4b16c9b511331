"""The house's rules over functions/respawn: no file over 700 lines, no class over 300, no import circle.

An import is any `import respawn...` / `from respawn... import` statement of a module, at its top or inside a
function (a lazy import still closes a circle), except under `if TYPE_CHECKING:` (never run). For now
functions/respawn/local/ and adapters/startup.py are left out of the size rules while they are still over (the
local cloud is being moved into wings and the machine's scripts into shell files); each is checked once it is
under, and the import rule covers every module already.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "functions" / "respawn"
MAX_FILE_LINES = 700
MAX_CLASS_LINES = 300
# Over the limits today and being split elsewhere; checked as soon as they are under.
NOT_YET = ("local/", "adapters/startup.py")


def modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its __init__.py)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def sized(path: Path) -> bool:
    relative = path.relative_to(PACKAGE).as_posix()
    over = len(path.read_text().splitlines()) > MAX_FILE_LINES or any(
        n.end_lineno is not None and n.end_lineno - n.lineno + 1 > MAX_CLASS_LINES
        for n in ast.walk(ast.parse(path.read_text()))
        if isinstance(n, ast.ClassDef)
    )
    return not (over and relative.startswith(NOT_YET))


@pytest.mark.parametrize("name", [n for n, p in modules().items() if sized(p)])
def test_no_file_over_700_lines_and_no_class_over_300(name: str) -> None:
    path = modules()[name]
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_FILE_LINES, f"{path}: {lines} lines, at most {MAX_FILE_LINES}"
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
            length = node.end_lineno - node.lineno + 1
            assert length <= MAX_CLASS_LINES, f"{path}: class {node.name} is {length} lines, at most {MAX_CLASS_LINES}"


def imported(name: str, tree: ast.Module, known: set[str]) -> set[str]:
    """The package's modules `name` imports, outside `if TYPE_CHECKING:` blocks."""
    skipped = {
        id(n)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for n in ast.walk(block)
    }
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in out if m in known and m != name}


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
    known = modules()
    graph = {name: imported(name, ast.parse(path.read_text()), set(known)) for name, path in known.items()}
    # a package's __init__ importing its own modules is how a package opens, not a circle
    graph = {
        n: {m for m in deps if not (m.startswith(n + ".") and known[n].name == "__init__.py")}
        for n, deps in graph.items()
    }
    found = cycle(graph)
    assert found is None, "import circle: " + " -> ".join(found or [])


def test_the_circle_finder_finds_one() -> None:
    assert cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert cycle({"a": {"b"}, "b": set()}) is None
