"""Keep MLflow out of a trainer process whose run does not report to it.

The trainer image installs MLflow for ``report_to: [mlflow]`` (transformers' MLflowCallback), and three libraries
import it whenever it is installed, whatever the run reports to: DeepSpeed (deepspeed/autotuning/autotuner.py,
``try: import mlflow`` for its autotuner), accelerate (accelerate/tracking.py) and transformers (their availability
checks, ``importlib.util.find_spec``). That import (MLflow with FastAPI, pydantic and OpenTelemetry) took 1.1 s of
every rank's start on the 2-core CPU machine (``PYTHONPROFILEIMPORTTIME=1``, 2026-11-29), for nothing.

``sys.modules[name] = None`` is Python's own mark for a module that is absent: ``import`` raises ImportError and
``importlib.util.find_spec`` returns None, which is what those checks call (they then take MLflow for uninstalled).
Set before the trainer's imports (``__main__``), from the run's config file; a config that cannot be read here
changes nothing (``config_file.parse_config`` reports it after the imports, as before). The one thing a user sees: a
grpo reward function of their own that imports MLflow gets ImportError ("import of mlflow halted") unless report_to
names mlflow.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

# The trackers this hides when the run does not name them in report_to, by report_to's name.
HIDDEN_UNLESS_REPORTED = ("mlflow",)


def config_path(argv: list[str]) -> str | None:
    """The ``--config`` value of the trainer's command line, or None."""
    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
    return None


def report_to(path: str) -> list[str] | None:
    """The config file's ``report_to`` as a list of names, or None where the file or the field cannot be read."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        if path.endswith((".yaml", ".yml")):
            import yaml  # only for a YAML config: the launcher writes JSON

            try:
                cfg = yaml.safe_load(text)
            except yaml.YAMLError:  # not a ValueError: config_file.parse_config reports it after the imports
                return None
        else:
            cfg = json.loads(text)
    except (OSError, ValueError):
        return None
    value = cfg.get("report_to") if isinstance(cfg, dict) else None
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    return None  # absent or odd: transformers' default ("all" in some versions) may want any tracker


def hide_unreported_trackers(argv: list[str]) -> list[str]:
    """Mark the trackers the config's report_to does not name as absent from this process; return their names."""
    path = config_path(argv)
    names = report_to(path) if path else None
    if names is None or "all" in names:
        return []
    hidden = [name for name in HIDDEN_UNLESS_REPORTED if name not in names and name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]
    return hidden
