"""The local cloud's secret values: options, file, what a machine gets, and the search for leaks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localcloud.services.secret_store import SecretError, leaks, secret_values

HF = "projects/respawn-local/secrets/hf-token/versions/1"
WB = "projects/respawn-local/secrets/wandb/versions/latest"
JOB = {"HF_TOKEN": HF, "WANDB_KEY": WB}
VALUE = "hf_5ecret-value-7f3a"


def test_values_come_from_options_the_environment_and_a_file(tmp_path: Path) -> None:
    file = tmp_path / "secrets.env"
    file.write_text("# local values\n\nWANDB_KEY=wb=with=equals \nOTHER_JOB_SECRET=x\nHF_TOKEN=from-file\n")
    assert secret_values(JOB, [f"HF_TOKEN={VALUE}"], str(file)) == {HF: VALUE, WB: "wb=with=equals "}
    assert secret_values(JOB, ["HF_TOKEN", "WANDB_KEY=w"], environ={"HF_TOKEN": VALUE}) == {HF: VALUE, WB: "w"}
    assert secret_values({}, []) == {}


@pytest.mark.parametrize(
    ("options", "file_text", "environ", "text"),
    [
        ([f"HF_TOKN={VALUE}"], None, {}, "--secret HF_TOKN: the job has no secret HF_TOKN; its secrets: HF_TOKEN"),
        (["HF_TOKEN"], None, {}, "--secret HF_TOKEN: HF_TOKEN is not set in this environment"),
        ([f"HF_TOKEN={VALUE}"], None, {}, f"the job's secret WANDB_KEY ({WB}) has no local value"),
        ([f"HF_TOKEN={VALUE}\x00", "WANDB_KEY=w"], None, {}, "secret HF_TOKEN: the value contains a NUL"),
        ([], f"HF_TOKEN={VALUE}\nWANDB_KEY\n", {}, "line 2 is not NAME=VALUE"),
    ],
)
def test_a_secret_that_cannot_be_used_is_one_line_without_its_value(
    tmp_path: Path, options: list[str], file_text: str | None, environ: dict[str, str], text: str
) -> None:
    file = None
    if file_text is not None:
        (tmp_path / "secrets.env").write_text(file_text)
        file = str(tmp_path / "secrets.env")
    with pytest.raises(SecretError) as e:
        secret_values(JOB, options, file, environ)
    assert text in str(e.value) and VALUE not in str(e.value) and "\n" not in str(e.value)


def test_leaks_finds_a_value_written_as_is_or_json_escaped(tmp_path: Path) -> None:
    value = 'to"ken\nwith-escapes'
    (tmp_path / "runs" / "r1").mkdir(parents=True)
    (tmp_path / "runs" / "r1" / "timeline.jsonl").write_text(json.dumps({"env": {"T": value}}) + "\n")
    (tmp_path / "trainer.log").write_bytes(b"\x00binary " + VALUE.encode() + b"\xff")
    (tmp_path / "clean.log").write_text("step 1 loss 2.0\n")
    assert leaks([value, VALUE, "short"], [tmp_path]) == [
        str(tmp_path / "runs" / "r1" / "timeline.jsonl"),
        str(tmp_path / "trainer.log"),
    ]
    assert leaks(["step"], [tmp_path]) == []  # too short to search: it would match by chance
