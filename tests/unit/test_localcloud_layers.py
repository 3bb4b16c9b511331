"""The local cloud's wings import only what their docstrings allow (localcloud/__init__.py: each wing may import
the ones before it), and the local cloud never imports the demo trainer (`trainer`): it runs it, as a cloud runs
an image."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import localcloud

ROOT = Path(str(localcloud.__file__)).parent
# wing -> the local cloud's wings it may import (itself included); the top-level modules may import every wing
ALLOWED = {
    "timeline": set(),
    "services": {"services", "timeline"},
    "apis": {"apis", "services"},
    "machines": {"machines", "apis", "services", "timeline"},
    "readout": {"readout", "machines", "services", "timeline"},
}


def imported(text: str) -> set[str]:
    """Every module an `import` or `from ... import` in the source names, at any depth (lazy imports too)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            found.add("." * node.level + (node.module or ""))
            found |= {f"{node.module}.{alias.name}" for alias in node.names if node.module and not node.level}
    return found


def wing_of(path: Path) -> str | None:
    """The wing a file is in (a top-level module's stem when it is one of ALLOWED's), None for the orchestration."""
    relative = path.relative_to(ROOT)
    name = relative.parts[0] if len(relative.parts) > 1 else relative.stem
    return name if name in ALLOWED else None


def problems(path: Path, text: str) -> list[str]:
    """What the file at `path` (holding `text`) imports that it may not: the demo trainer, a relative import, a
    wing above its own."""
    names = imported(text)
    found = [f"imports the demo trainer ({n})" for n in sorted(names) if n == "trainer" or n.startswith("trainer.")]
    found += [f"relative import {n}" for n in sorted(names) if n.startswith(".")]
    wing = wing_of(path)
    if wing is not None:
        reached = {n.split(".")[1] for n in names if n.startswith("localcloud.")}
        found += [f"{wing} imports localcloud.{r}" for r in sorted(reached - ALLOWED[wing])]
    return found


FILES = sorted(ROOT.rglob("*.py"))


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_each_wing_imports_only_the_wings_below_it_and_no_demo_trainer(path: Path) -> None:
    assert problems(path, path.read_text(encoding="utf-8")) == []


def test_every_folder_opens_with_a_docstring_saying_what_it_holds_and_may_import() -> None:
    folders = [ROOT, *sorted(p.parent for p in ROOT.rglob("__init__.py") if p.parent != ROOT)]
    assert len(folders) >= 6
    for folder in folders:
        doc = ast.get_docstring(ast.parse((folder / "__init__.py").read_text(encoding="utf-8")))
        assert doc and "may import" in doc.lower(), f"{folder}: no docstring saying what it may import"


def test_the_check_catches_a_wing_reaching_up_and_the_demo_trainer() -> None:
    text = "from localcloud.machines.nodes import Nodes\nfrom localcloud.timeline import Timeline\n"
    text += "def f():\n    import trainer.config\n    from . import x\n"
    assert problems(ROOT / "services" / "new.py", text) == [
        "imports the demo trainer (trainer.config)",
        "relative import .",
        "services imports localcloud.machines",
    ]
    assert problems(ROOT / "cloud.py", "from localcloud.machines.nodes import Nodes\n") == []
