"""tests/data/SOURCES.md names a public source for every captured fixture and every local-cloud API shape."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from tfconfig import REPO

from localcloud.apis import apicore, cloudapi, offerings, tpu_api
from localcloud.apis.compute import (
    api,
    checks,
    common,
    instances,
    mig_views,
    migs,
    operations,
    resize_requests,
    state,
    templates,
)

DATA = REPO / "tests" / "data"
COMPUTE = (api, checks, common, instances, mig_views, migs, operations, resize_requests, state, templates)
API_MODULES = {m.__name__.rpartition(".")[2]: m for m in (apicore, cloudapi, offerings, tpu_api, *COMPUTE)}
API_SECTION = "The local TPU / Compute API (localcloud/apis)"
SOURCES = DATA / "SOURCES.md"
ROW = re.compile(r"^\| `(?P<first>[^`]+)` \|(?P<rest>.*)\|$")
URL = re.compile(r"https://[^\s;)|]+")


def section(title: str) -> list[str]:
    """The lines of one `## title` section of SOURCES.md."""
    text = SOURCES.read_text(encoding="utf-8")
    parts = re.split(r"^## ", text, flags=re.MULTILINE)
    found = [p for p in parts if p.startswith(title + "\n")]
    assert len(found) == 1, f"SOURCES.md has no single section '## {title}'"
    return found[0].splitlines()[1:]


def fixture_rows() -> dict[str, str]:
    rows: dict[str, str] = {}
    for line in section("Fixtures"):
        m = ROW.match(line)
        if m:
            assert m["first"] not in rows, f"{m['first']} has two rows in SOURCES.md"
            rows[m["first"]] = m["rest"]
    return rows


def fixture_files() -> set[str]:
    return {p.name for p in DATA.iterdir() if p.is_file() and p != SOURCES and not p.name.startswith(".")}


def test_every_fixture_has_a_row_and_every_row_a_fixture() -> None:
    rows = set(fixture_rows())
    assert sorted(fixture_files() - rows) == [], "add a row to tests/data/SOURCES.md for each new fixture"
    assert sorted(rows - fixture_files()) == [], "SOURCES.md names fixtures that do not exist"


@pytest.mark.parametrize("name", sorted(fixture_files()))
def test_every_row_cites_a_source_and_says_what_was_checked_and_changed(name: str) -> None:
    row = fixture_rows().get(name)
    assert row is not None, f"{name} has no row in tests/data/SOURCES.md"
    cells = [c.strip() for c in row.split(" | ")]
    assert len(cells) == 4 and all(cells), f"{name}: want 'what | sources | checked | changed', got {cells}"
    sources = cells[1]
    same_as = re.fullmatch(r"as `([^`]+)`", sources)  # the sources of another row
    assert URL.search(sources) or (same_as and URL.search(fixture_rows()[same_as[1]])), f"{name}: no source URL"


def test_every_local_api_row_names_functions_the_api_modules_have() -> None:
    rows = [line.split(" | ") for line in section(API_SECTION)]
    rows = [r for r in rows if len(r) == 5 and r[1].startswith("`")]
    assert len(rows) >= 10  # node, states, operations, errors, stockouts, lists, for TPU and Compute
    for shape, served_by, sources, _checked, _differs in rows:
        assert URL.search(sources), f"{shape}: no source URL"
        for name in re.findall(r"`([\w.]+)`", served_by):
            module, _, path = name.partition(".")
            assert module in API_MODULES and path, f"{shape}: `{name}` is not MODULE.NAME of {sorted(API_MODULES)}"
            target: object = API_MODULES[module]
            for attr in path.split("."):
                assert hasattr(target, attr), f"SOURCES.md names {name}, which does not exist"
                target = getattr(target, attr)


def test_the_row_parser_reads_this_file() -> None:
    assert len(fixture_rows()) >= 15 and Path(SOURCES).stat().st_size > 5000
