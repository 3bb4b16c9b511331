"""The docs say what the code does: the state machine and the job message's defaults are written once, in the code.

docs/architecture.md embeds `python -m respawn.jobs` (the TRANSITIONS table) between two markers, and
docs/job-message.md lists each field's default; both are checked against the code here, so a doc that drifts
fails.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from respawn.jobs import LEGAL_TRANSITIONS, TERMINAL, TRANSITIONS, Status, transitions_markdown
from respawn.spec import SUBMIT

DOCS = Path(__file__).parent.parent.parent / "docs"
BEGIN = "<!-- transitions: begin (python -m respawn.jobs) -->\n"
END = "\n<!-- transitions: end -->"


def embedded_transitions(doc: str) -> str:
    """The generated block of a doc, between its markers."""
    assert doc.count(BEGIN) == 1 and doc.count(END) == 1, "the doc has lost its transitions markers"
    return doc.split(BEGIN, 1)[1].split(END, 1)[0]


def transition_drift(doc: str) -> list[str]:
    """What a doc's transitions block says that TRANSITIONS does not, and the reverse (empty: in step)."""
    shown, wanted = embedded_transitions(doc).splitlines(), transitions_markdown().splitlines()
    return [f"docs only: {line}" for line in shown if line not in wanted] + [
        f"code only: {line}" for line in wanted if line not in shown
    ]


def test_architecture_doc_shows_the_transitions_of_the_code() -> None:
    doc = (DOCS / "architecture.md").read_text()
    assert transition_drift(doc) == [], "run `python -m respawn.jobs` and paste it into docs/architecture.md"
    assert embedded_transitions(doc) == transitions_markdown()  # the same lines in the same order


def test_a_drifted_doc_fails() -> None:
    doc = (DOCS / "architecture.md").read_text()
    without_a_row = doc.replace("| RUNNING | SUCCEEDED |", "| RUNNING | PENDING |")
    assert transition_drift(without_a_row) == [
        "docs only: | RUNNING | PENDING | the trainer reported `completed` |",
        "code only: | RUNNING | SUCCEEDED | the trainer reported `completed` |",
    ]
    stale_arrow = doc.replace("    RUNNING --> RECOVERING\n", "")
    assert transition_drift(stale_arrow) == ["code only:     RUNNING --> RECOVERING"]


def test_python_m_respawn_jobs_prints_the_block() -> None:
    out = subprocess.run([sys.executable, "-m", "respawn.jobs"], capture_output=True, text=True, check=True).stdout
    assert out == transitions_markdown() + "\n"


def test_legal_transitions_are_the_table() -> None:
    assert set(LEGAL_TRANSITIONS) == {None, *Status}
    pairs = {(before, after) for before, afters in TRANSITIONS.items() for after in afters}
    assert {(before, after) for before, afters in LEGAL_TRANSITIONS.items() for after in afters} == pairs
    for status in TERMINAL - {Status.REJECTED}:
        assert LEGAL_TRANSITIONS[status] == frozenset(), f"{status} is terminal"
    whens = [when for afters in TRANSITIONS.values() for when in afters.values()]
    assert all(when and "\n" not in when and "|" not in when for when in whens)


def test_status_docstring_points_at_the_table_instead_of_repeating_it() -> None:
    assert "TRANSITIONS" in (Status.__doc__ or "") and "->" not in (Status.__doc__ or "")


# ---------------------------------------------------------------------------- the job message's defaults


def documented_defaults() -> dict[str, str]:
    """field -> the default column of docs/job-message.md's table."""
    rows = re.findall(r"^\| `(\w+)` \| [^|]+ \| ([^|]+) \|", (DOCS / "job-message.md").read_text(), re.M)
    return {name: default.strip() for name, default in rows}


def documented_value(cell: str) -> Any:
    """`48h` -> "48h", `[]` -> [], `null` -> None: a message value as the table writes it."""
    text = cell.strip("`")
    try:
        return json.loads(text)
    except ValueError:
        return text


@pytest.mark.parametrize("field", [f for f in SUBMIT.fields if f.name != "tiers"], ids=lambda f: f.name)
def test_job_message_doc_states_each_default_of_the_table(field: Any) -> None:
    documented = documented_defaults()[field.name]
    if field.name == "image":  # absent, the functions fill it from the deployment (RESPAWN_TRAINER_IMAGES)
        assert (
            field.name not in SUBMIT.defaults and documented == "the deployment's trainer image of the machine's kind"
        )
    elif field.name not in SUBMIT.defaults:
        assert documented == "required"
    else:
        assert field.parse(documented_value(documented), field.name) == SUBMIT.defaults[field.name]


def test_a_default_read_from_the_message_is_the_models() -> None:
    """parse(render(default)) == default: an absent field and a field holding its shown default mean the same."""
    from respawn.spec import GPU_MACHINE, MOVE_ON, TIER, TPU_MACHINE

    for shape in (SUBMIT, TPU_MACHINE, GPU_MACHINE, TIER, MOVE_ON):
        for name, default in shape.defaults.items():
            field = shape.by_name[name]
            if field.omitted_when_default:  # a default never written (no tiers, no reservation) is never read back
                continue
            assert field.parse(field.render(default), name) == default, name
