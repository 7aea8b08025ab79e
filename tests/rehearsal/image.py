"""The "trainer image": a virtualenv with this package installed from a wheel, as images/trainer/Dockerfile does.

The Dockerfile copies ``pyproject.toml README.md pipelines components`` and runs ``pip install ".[train]"``: a
regular (non-editable) install into the image's site-packages. Here:

- the same four paths are copied to a build folder and built into a wheel (``pip wheel --no-deps
  --no-build-isolation``): package data that the wheel leaves out is missing in the pods, as in the image;
- a fresh virtualenv gets that wheel (``--no-deps``), so ``components`` is imported from the image's
  site-packages and nowhere else;
- the heavy dependencies (torch, transformers, DeepSpeed, ...) are not installed again: one path line in a
  ``.pth`` file appends the development environment's site-packages to ``sys.path``. A plain path line does
  not make that folder a site directory, so the ``.pth`` files in it (among them the editable install's
  finder, ``__editable__*.pth``) are never processed: the dev install stays invisible;
- ``bin/torchrun`` is the console script pip writes when it installs torch, pointing at the image's python;
- the image's ``TORCH_EXTENSIONS_DIR`` is the development environment's torch extension folder (the dependencies
  are the same). The CPU trainer builds no DeepSpeed op: it leaves out the shared-memory allreduce op, which only
  DeepSpeed's inference layers use (components/train/trainer/common.py ``init_deepspeed_comm``).

``TrainerImage.deps`` lists the dependency folders the pods must still see where the cluster hides the
repository (a venv inside the repository: tests/rehearsal/cluster.py binds them back).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

# What images/trainer/Dockerfile copies into the image before `pip install ".[train]"`.
COPIED = ("pyproject.toml", "README.md", "pipelines", "components")
TORCHRUN = """#!{python}
# -*- coding: utf-8 -*-
import re
import sys
from torch.distributed.run import main
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit(main())
"""
# The image's own environment (Dockerfile ENV) besides PATH; the pod's env overrides it.
IMAGE_ENV = {"PYTHONUNBUFFERED": "1", "PIP_NO_CACHE_DIR": "1", "DEBIAN_FRONTEND": "noninteractive"}
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class TrainerImage:
    """A built image: its virtualenv, its site-packages and the dependency folders it borrows."""

    venv: Path
    site_packages: Path
    wheel: Path
    deps: tuple[str, ...]  # the dev environment's site-packages, appended by the .pth line

    @property
    def bin(self) -> Path:
        return self.venv / "bin"

    def env(self) -> dict:
        """The image's environment: its bin first on PATH (so ``torchrun`` is the image's), Dockerfile ENV,
        the pre-built ops."""
        return {"PATH": f"{self.bin}:{SYSTEM_PATH}", **IMAGE_ENV, "TORCH_EXTENSIONS_DIR": torch_extensions_dir()}


def torch_extensions_dir() -> str:
    """Where torch builds and finds JIT extensions in this environment (its default, or TORCH_EXTENSIONS_DIR)."""
    default = os.path.join(os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "torch_extensions")
    return os.environ.get("TORCH_EXTENSIONS_DIR") or default


def _run(cmd: list[str], **kwargs) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, **kwargs)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} exited {proc.returncode}:\n{proc.stdout}\n{proc.stderr}")
    return proc.stdout


def _dev_site_packages() -> tuple[str, ...]:
    paths = []
    for key in ("purelib", "platlib"):
        path = sysconfig.get_paths()[key]
        if path not in paths:
            paths.append(path)
    return tuple(paths)


def build(repo: Path, dest: Path) -> TrainerImage:
    """Build the image from ``repo`` into ``dest`` (a new folder): 15-30 s."""
    src, wheels, venv = dest / "src", dest / "wheels", dest / "venv"
    src.mkdir(parents=True)
    for name in COPIED:
        path = repo / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(path, src / name)
    # Without build isolation when this environment can build (setuptools, as pyproject.toml requires):
    # no index needed. Python 3.12+ venvs come without setuptools; pip then fetches it, as docker build does.
    isolation = ["--no-build-isolation", "--no-index"] if importlib.util.find_spec("setuptools") else []
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", *isolation, "-q", "-w", str(wheels), str(src)])
    (wheel,) = wheels.glob("*.whl")
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site_packages = Path(_run([str(python), "-I", "-c", purelib]).strip())
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)])
    deps = _dev_site_packages()
    (site_packages / "_rehearsal_image_deps.pth").write_text("".join(f"{p}\n" for p in deps))
    torchrun = venv / "bin" / "torchrun"
    torchrun.write_text(TORCHRUN.format(python=python))
    torchrun.chmod(0o755)
    image = TrainerImage(venv=venv, site_packages=site_packages, wheel=wheel, deps=deps)
    check(image, cwd=dest)
    return image


def check(image: TrainerImage, cwd: Path) -> None:
    """What the Dockerfile's smoke test checks (and builds), plus: ``components`` comes from the image, not the
    dev install."""
    probe = (
        "import json, components, components.train.trainer.__main__, deepspeed, peft, tensorboard; "
        "from importlib.metadata import distribution as d; "
        "print(json.dumps([components.__file__, str(d('kubeflow-llm-post-training')._path)]))"
    )
    env = {**image.env(), "HOME": str(cwd)}
    out = _run([str(image.bin / "python"), "-c", probe], cwd=cwd, env=env, timeout=900).strip().splitlines()[-1]
    import json

    module, dist = json.loads(out)
    for what, path in (("components", module), ("the distribution", dist)):
        if not Path(path).resolve().is_relative_to(image.site_packages.resolve()):
            raise RuntimeError(
                f"trainer image: {what} is imported from {path}, not from the image's "
                f"{image.site_packages} (the dev install leaks into the image)"
            )
    shebang = (image.bin / "torchrun").read_text().splitlines()[0]
    found = shutil.which("torchrun", path=env["PATH"])
    if shebang != f"#!{image.bin / 'python'}" or found != str(image.bin / "torchrun"):
        raise RuntimeError(f"trainer image: torchrun on the image PATH is not the image's ({shebang})")
    if os.environ.get("PYTHONPATH"):
        # The pods never inherit it (tests/rehearsal/cluster.py builds their env from scratch); say so.
        print(f"note: PYTHONPATH={os.environ['PYTHONPATH']} is set here and not passed to the pods")
