"""cloudbuild.yaml, checked offline: test, build and push the trainer image (both variants), plan and apply."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from tfconfig import REPO, Config

from respawn.machine import IMAGE_VARIANTS, TRAINER_IMAGES


@pytest.fixture(scope="module")
def build() -> dict[str, Any]:
    parsed: dict[str, Any] = yaml.safe_load((REPO / "cloudbuild.yaml").read_text(encoding="utf-8"))
    return parsed


def steps(build: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {step["id"]: step for step in build["steps"]}


def runs_after(build: dict[str, Any], later: str, earlier: str) -> bool:
    """Whether step `later` cannot start before `earlier` finished (Cloud Build's waitFor semantics)."""
    order = [step["id"] for step in build["steps"]]
    by_id = steps(build)

    def waits_for(step_id: str) -> list[str]:
        explicit = by_id[step_id].get("waitFor")
        return list(explicit) if explicit is not None else order[: order.index(step_id)]

    seen: set[str] = set()
    todo = waits_for(later)
    while todo:
        current = todo.pop()
        if current == earlier:
            return True
        if current not in seen:
            seen.add(current)
            todo.extend(waits_for(current))
    return False


def test_every_substitution_used_is_declared_and_every_declared_one_is_used(build: dict[str, Any]) -> None:
    text = (REPO / "cloudbuild.yaml").read_text(encoding="utf-8")
    used = set(re.findall(r"\$\{(_[A-Z_]+)\}", text))
    assert used == set(build["substitutions"])  # substitution_option MUST_MATCH
    assert {"_PROJECT", "_REGION", "_REPO", "_TF_STATE_BUCKET"} <= used
    assert build["options"]["substitution_option"] == "MUST_MATCH"
    assert build["options"]["dynamic_substitutions"] is True  # _PROJECT and _TAG default to built-ins


def test_the_suite_runs_before_anything_is_built_or_deployed(build: dict[str, Any]) -> None:
    test = steps(build)["test"]
    assert (test["entrypoint"], test["args"]) == ("make", ["test"])
    for later in (
        "build-trainer",
        "build-trainer-cuda",
        "terraform-init",
        "terraform-plan",
        "terraform-apply",
        "push-trainer",
        "push-trainer-cuda",
    ):
        assert runs_after(build, later, "test"), later


def image(name: str) -> str:
    return f"${{_REGION}}-docker.pkg.dev/${{_PROJECT}}/${{_REPO}}/{name}:${{_TAG}}"


@pytest.mark.parametrize("kind", sorted(TRAINER_IMAGES))
def test_each_kinds_trainer_image_is_built_tagged_and_pushed_after_the_repository_exists(
    build: dict[str, Any], kind: str
) -> None:
    """Both variants of trainer/Dockerfile: VARIANT=tpu as `trainer`, VARIANT=cuda as `trainer-cuda`, the names a
    job of each machine kind names (respawn.machine.TRAINER_IMAGES, terraform output trainer_images)."""
    tag = image(TRAINER_IMAGES[kind])
    (built,) = [
        s for s in build["steps"] if s["args"][0] == "build" and tag in s["args"] and s["args"][-1] == "trainer"
    ]
    args = built["args"]
    assert args[args.index("--build-arg") + 1] == f"VARIANT={IMAGE_VARIANTS[kind]}"
    assert args[args.index("--tag") + 1] == tag
    (pushed,) = [s for s in build["steps"] if s["args"] == ["push", tag]]
    assert runs_after(build, pushed["id"], built["id"]) and runs_after(build, pushed["id"], "terraform-apply")
    assert runs_after(build, built["id"], "test")
    assert tag in build["images"]


def test_exactly_the_two_variants_are_built_and_listed(build: dict[str, Any]) -> None:
    built = [s["args"] for s in build["steps"] if s["args"][0] == "build"]
    assert sorted(a[a.index("--build-arg") + 1] for a in built) == ["VARIANT=cuda", "VARIANT=tpu"]
    assert sorted(build["images"]) == sorted(image(name) for name in TRAINER_IMAGES.values())
    assert build["substitutions"]["_TAG"] == "${SHORT_SHA}"


def test_terraform_names_the_same_image_for_each_kind() -> None:
    """outputs.tf's trainer_images: REPOSITORY/NAME per machine kind, NAME the one Cloud Build pushes."""
    value = Config.load().outputs["trainer_images"]["value"]
    assert set(value) == set(TRAINER_IMAGES)
    for kind, name in TRAINER_IMAGES.items():
        assert value[kind].endswith(f"/{name}") and "trainer.repository_id" in value[kind], value[kind]


def test_terraform_applies_exactly_the_saved_plan(build: dict[str, Any]) -> None:
    by_id = steps(build)
    terraform = [by_id[i] for i in ("terraform-init", "terraform-plan", "terraform-apply")]
    assert {step["name"] for step in terraform} == {"hashicorp/terraform:${_TF_VERSION}"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", build["substitutions"]["_TF_VERSION"])  # a pinned version
    assert {step["dir"] for step in terraform} == {"infra/terraform"}
    init, plan, apply = (step["args"] for step in terraform)
    assert "-backend-config=bucket=${_TF_STATE_BUCKET}" in init
    assert plan[0] == "plan" and "-out=tfplan" in plan and "-var=project=${_PROJECT}" in plan
    assert apply == ["apply", "-input=false", "tfplan"]
    assert runs_after(build, "terraform-apply", "terraform-plan")
    assert runs_after(build, "terraform-plan", "terraform-init")


def test_the_wait_analysis_can_say_no(build: dict[str, Any]) -> None:
    assert not runs_after(build, "build-trainer", "terraform-apply")
    assert not runs_after(build, "test", "push-trainer")
