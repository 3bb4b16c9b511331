"""The deployed functions' source is functions/: main.py, requirements.txt, the modules main.py imports and the files
they read, and nothing else. Every module under functions/ is reached from main.py, and both ways of deploying ship
all of functions/ but what is built or cached locally: there is no list of product files to keep out.

Both ways of deploying are read as they select files: Terraform's archive of functions/ (infra/terraform/functions.tf,
its `excludes`) and `gcloud functions deploy --source=functions` (functions/.gcloudignore). A module's imports are
every `import` and `from ... import` in it, at any depth (a function's lazy import counts too).
"""

from __future__ import annotations

import ast
import re
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest
from tfconfig import REPO, Config

FUNCTIONS = REPO / "functions"
ENTRY = "main"
LOCAL_CLOUD = "localcloud"


def _pattern(glob: str) -> re.Pattern[str]:
    """A glob of Terraform's fileset (archive_file's `excludes`) as a regular expression: `**/` any directories,
    `**` anything, `*` and `?` within one path segment."""
    out = ""
    i = 0
    while i < len(glob):
        if glob.startswith("**/", i):
            out, i = out + "(?:.*/)?", i + 3
        elif glob.startswith("**", i):
            out, i = out + ".*", i + 2
        else:
            out += {"*": "[^/]*", "?": "[^/]"}.get(glob[i], re.escape(glob[i]))
            i += 1
    return re.compile(out)


def source_files() -> list[str]:
    """Every file under functions/, relative, as the archive and the upload walk it."""
    return sorted(p.relative_to(FUNCTIONS).as_posix() for p in FUNCTIONS.rglob("*") if p.is_file())


def tracked_files() -> set[str]:
    """The files under functions/ that git tracks (the product's source, nothing built or cached), relative."""
    out = subprocess.run(["git", "ls-files", "-z", "."], cwd=FUNCTIONS, capture_output=True, check=True, text=True)
    return {f for f in out.stdout.split("\0") if f}


def terraform_archive() -> set[str]:
    """The files Terraform's archive_file holds: functions/ less its `excludes`."""
    archive = Config.load().data[("archive_file", "functions")]
    assert archive["source_dir"] == "${path.module}/../../functions"
    excludes = [_pattern(glob) for glob in archive["excludes"]]
    return {f for f in source_files() if not any(p.fullmatch(f) for p in excludes)}


def gcloud_upload() -> set[str]:
    """The files `gcloud functions deploy --source=functions` uploads: functions/ less .gcloudignore, read with
    gitignore's rules as far as the file uses them (`dir/` a directory anywhere, a pattern with a `/` anchored at
    functions/, one without matching a name at any depth)."""
    lines = (FUNCTIONS / ".gcloudignore").read_text(encoding="utf-8").splitlines()
    rules = [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    assert not [r for r in rules if r.startswith("!")], "negations are not read here: extend gcloud_upload()"

    def ignored(path: str) -> bool:
        parts = path.split("/")
        for rule in rules:
            if rule.endswith("/"):  # a directory, at any depth
                if any(_pattern(rule[:-1]).fullmatch(d) for d in parts[:-1]):
                    return True
            elif "/" in rule.strip("/"):  # anchored at functions/
                if _pattern(rule.lstrip("/")).fullmatch(path):
                    return True
            elif any(_pattern(rule).fullmatch(name) for name in parts):
                return True
        return False

    return {f for f in source_files() if not ignored(f)}


def module_of(path: str) -> str:
    """functions/-relative file -> module name (a package's __init__.py is the package)."""
    module = path.removesuffix(".py").replace("/", ".")
    return module.removesuffix(".__init__")


def imports_of(module: str, files: dict[str, str]) -> set[str]:
    """The modules (and packages) `module` imports, absolute, that exist among `files` (module -> path); a
    package's modules bring their packages (whose __init__ runs first)."""
    path = FUNCTIONS / files[module]
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module.split(".") if is_package else module.split(".")[:-1]
                anchor = package[: len(package) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            names = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        for name in names:
            parts = name.split(".")
            found |= {".".join(parts[:i]) for i in range(1, len(parts) + 1)}
    return found


def closure(start: str, files: dict[str, str]) -> set[str]:
    """Every module of `files` (module -> path) that `start` reaches by imports, `start` included."""
    reached: set[str] = set()
    todo = [start]
    while todo:
        module = todo.pop()
        if module in reached or module not in files:
            continue
        reached.add(module)
        todo += sorted(imports_of(module, files))
    return reached


def python_files(files: Iterable[str]) -> dict[str, str]:
    return {module_of(f): f for f in files if f.endswith(".py")}


@pytest.fixture(scope="module")
def shipped() -> set[str]:
    return terraform_archive()


def test_terraform_and_gcloud_ship_the_same_files(shipped: set[str]) -> None:
    uploaded = gcloud_upload()
    assert sorted(shipped - uploaded) == [], "Terraform's archive holds what .gcloudignore leaves out"
    assert sorted(uploaded - shipped) == [], "gcloud uploads what Terraform's archive_file excludes"


def test_the_deployed_source_is_main_py_and_what_it_imports(shipped: set[str]) -> None:
    tracked = tracked_files()
    every = python_files(tracked)
    reached = {every[m] for m in closure(ENTRY, every)}
    unreached = sorted(f for f in every.values() if f not in reached)
    assert unreached == [], (
        f"these are under functions/ but main.py never imports them: {unreached}; a tool that is not deployed lives "
        "beside functions/ (respawn_cli/, respawn_ops/, localcloud/)"
    )
    sources = "".join((FUNCTIONS / f).read_text(encoding="utf-8") for f in reached)
    data = sorted(f for f in tracked if not f.endswith(".py") and f not in ("requirements.txt", ".gcloudignore"))
    unnamed = [f for f in data if f'"{Path(f).name}"' not in sources]  # a module reads it by its name, quoted
    assert unnamed == [], f"these are under functions/ but no deployed module reads them: {unnamed}"


def test_both_ways_of_deploying_ship_every_tracked_file(shipped: set[str]) -> None:
    """The exclusions name only what is built or cached locally: every file git tracks ships but .gcloudignore."""
    left_out = sorted(tracked_files() - shipped - {".gcloudignore"})
    assert left_out == [], f"tracked files that Terraform's archive (and gcloud) leave out: {left_out}"
    assert not [f for f in shipped if "__pycache__" in f or f.endswith(".pyc")]


def test_pyyaml_is_not_deployed() -> None:
    """Job files (YAML) are the command line's; the functions read JSON messages only."""
    requirements = (FUNCTIONS / "requirements.txt").read_text(encoding="utf-8").lower()
    assert "pyyaml" not in requirements
    every = python_files(tracked_files())
    assert "yaml" not in set().union(*(imports_of(m, every) for m in closure(ENTRY, every)))


def test_the_deployed_source_holds_no_local_cloud_code(shipped: set[str]) -> None:
    assert not (FUNCTIONS / LOCAL_CLOUD).exists() and not (FUNCTIONS / "respawn" / "local").exists()
    modules = python_files(shipped)
    for module in modules:
        imported = imports_of(module, modules)
        assert LOCAL_CLOUD not in imported, f"{modules[module]} imports the local cloud"
    assert (REPO / LOCAL_CLOUD / "__init__.py").is_file()  # the local cloud's own package, beside functions/


def test_the_closure_follows_lazy_imports_and_the_globs_match_as_terraform_does() -> None:
    """What the checks above rest on: bootstrap.py's providers are imported inside functions, and the closure sees
    them; the fileset globs match as Terraform's do."""
    every = python_files(source_files())
    assert "respawn.adapters.gcs_store" in imports_of("respawn.bootstrap", every)
    assert {"respawn", "respawn.service", "respawn.parsing", "respawn.adapters.gcs_store"} <= closure(ENTRY, every)
    assert _pattern("**/__pycache__/**").fullmatch("respawn/adapters/__pycache__/x.pyc")
    assert not _pattern("respawn/cli.py").fullmatch("respawn/adapters/cli.py")
