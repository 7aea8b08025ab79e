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
    # lm_eval_tasks are scored (evaluate_model) and checked (validate_inputs) in the components image
    assert 'pip install ".[eval]"' in components_image and "lm_eval" in components_image


def test_compiled_pipeline_uses_the_versioned_images():
    text = (ROOT / "compiled" / "llm_finetune.yaml").read_text()
    images = set(re.findall(r"^ +image: (\S+)$", text, re.M))
    assert images == {version.COMPONENTS_IMAGE}
    assert version.TRAINER_IMAGE in text  # the trainer_image parameter's default


# What each report_to choice (components/settings.py) needs installed: transformers' integration imports these.
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
