"""Images and package stay one release: tags come from the version, Dockerfiles install the pins."""

import re
import tomllib

from components import version
from tests.helpers.repo import ROOT

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _pins(requirements) -> dict:
    return dict(re.match(r"^([A-Za-z0-9_.\-\[\]]+)==(\S+)$", r).groups() for r in requirements if "==" in r)


def _dockerfile_pins(name: str) -> dict:
    text = (ROOT / "images" / name / "Dockerfile").read_text()
    return dict(re.findall(r"\b([a-z][a-z0-9_\-]*)==([0-9][^\s\"]*)", text))


def test_image_tags_derive_from_the_package_version():
    assert version.COMPONENTS_IMAGE.endswith(f"/components:{version.__version__}")
    assert version.TRAINER_IMAGE.endswith(f"/trainer:{version.__version__}")
    assert version.COMPONENTS_IMAGE.split("/components:")[0] == version.TRAINER_IMAGE.split("/trainer:")[0]


def test_dockerfiles_install_this_package_and_pin_what_pyproject_pins():
    extras = PYPROJECT["project"]["optional-dependencies"]
    pinned = {**_pins(PYPROJECT["project"]["dependencies"]), **_pins(extras["local"]), **_pins(extras["train"])}
    for image in ("components", "trainer"):
        text = (ROOT / "images" / image / "Dockerfile").read_text()
        assert "COPY components ./components" in text and "COPY pipelines ./pipelines" in text
        for package, pin in _dockerfile_pins(image).items():
            if package in pinned:
                assert pin == pinned[package], (
                    f"images/{image}/Dockerfile pins {package}=={pin}, pyproject {pinned[package]}"
                )
    trainer = (ROOT / "images" / "trainer" / "Dockerfile").read_text()
    assert 'pip install ".[train]"' in trainer  # deepspeed, peft, bitsandbytes come from pyproject's pins
    components_image = (ROOT / "images/components/Dockerfile").read_text()
    assert "torch==" + pinned["torch"] in trainer and "torch==" + pinned["torch"] in components_image
    # lm_eval_tasks are scored (evaluate_model) and checked (validate_inputs) in the components image, and the model
    # registered there (components/publish/model_registry.py)
    assert 'pip install ".[eval,registry]"' in components_image and "lm_eval" in components_image


def test_compiled_pipeline_uses_the_versioned_images():
    text = (ROOT / "compiled" / "llm_finetune.yaml").read_text()
    images = set(re.findall(r"^ +image: (\S+)$", text, re.M))
    assert images == {version.COMPONENTS_IMAGE}
    assert version.TRAINER_IMAGE in text  # the trainer_image parameter's default


# What each report_to choice (components/settings/) needs installed: transformers' integration imports these.
TRACKER_PACKAGES = {"tensorboard": "tensorboard", "mlflow": "mlflow-skinny", "wandb": "wandb"}


def test_every_report_to_choice_is_installed_in_the_trainer_image_by_its_extra():
    """A cluster run with report_to=wandb used to fail in the pods: neither wandb nor mlflow was in the image."""
    from components.settings import specs

    choices = set(specs()["report_to"].choices)
    assert choices == set(TRACKER_PACKAGES), "a report_to choice without its package here"
    train = _pins(PYPROJECT["project"]["optional-dependencies"]["train"])
    assert {TRACKER_PACKAGES[c] for c in choices} <= set(train), train
    trainer = (ROOT / "images" / "trainer" / "Dockerfile").read_text()
    assert 'pip install ".[train]"' in trainer
    smoke = re.search(r'python -c "import ([^"]+)"', trainer).group(1)
    imported = {name.strip() for name in smoke.split(",")}
    assert {"tensorboard", "mlflow", "wandb"} <= imported, imported  # the image's build proves they import


COMPONENTS_DIGEST = "sha256:" + "c0" * 32
TRAINER_DIGEST = "sha256:" + "7a" * 32


def test_compiled_pipeline_pins_the_images_by_digest_when_asked(tmp_path):
    """A tag can be pushed over; a digest cannot: with the digests of the pushed images in the environment at compile
    time, every step and the trainer_image default name the image by digest (tag@digest, which runtimes pull by the
    digest), so a run starts exactly the bytes that were reviewed."""
    import os
    import subprocess
    import sys

    out = tmp_path / "pinned.yaml"
    env = {
        **os.environ,
        "LLM_PIPELINES_COMPONENTS_DIGEST": COMPONENTS_DIGEST,
        "LLM_PIPELINES_TRAINER_DIGEST": TRAINER_DIGEST,
    }
    done = subprocess.run(
        [sys.executable, "-m", "pipelines.compile", "--output", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "wrote" not in done.stdout.replace(f"wrote {out}", "")  # the repository's derived files left as they are
    text = out.read_text()
    images = set(re.findall(r"^ +image: (\S+)$", text, re.M))
    assert images == {f"{version.COMPONENTS_IMAGE}@{COMPONENTS_DIGEST}"}
    assert f"{version.TRAINER_IMAGE}@{TRAINER_DIGEST}" in text
    # A digest that is not one: one line naming the variable, and nothing written.
    env["LLM_PIPELINES_TRAINER_DIGEST"] = "7a7a7a"
    bad = subprocess.run(
        [sys.executable, "-m", "pipelines.compile", "--output", str(tmp_path / "bad.yaml")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and not (tmp_path / "bad.yaml").exists()
    assert bad.stderr.strip().count("\n") == 0 and "LLM_PIPELINES_TRAINER_DIGEST='7a7a7a'" in bad.stderr, bad.stderr
