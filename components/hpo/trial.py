"""One Katib trial in one pod: write the trial's trainer config, then become the trainer's ``torchrun``.

    python -m components.hpo.trial --base-config /mnt/models/runs/RUN/train/train_config.json \\
        --trial-dir /mnt/models/runs/RUN/hpo/TRIAL --max_steps 50 --save_strategy no --learning_rate 3.1e-05 \\
        -- torchrun --nnodes 2 --nproc_per_node 8 -m components.train.trainer \\
           --config /mnt/models/runs/RUN/hpo/TRIAL/train_config.json

The container command of every pod of a trial (components/hpo/katib.py builds it; why this way is said there).
The trial's config is the run's, with the ``--<trainer field> <value>`` overrides (the fields in
``katib.SEARCHABLE`` under their trainer names, plus ``katib.TRIAL_FIELDS``) and ``output_dir`` = the trial's
folder. Every pod writes the same file, atomically, so no pod reads a partial one and none waits for another.
The process then execs the command after ``--``, which must read that file: signals, exit code and output are
the trainer's own. A bad argument is one line on stderr and exit code 2, as for the trainer's config errors.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from pathlib import Path

from components.hpo.katib import SEARCHABLE, TRAINER_FIELD, TRIAL_FIELDS

# Trainer field -> type of every value a trial may set.
FIELD_TYPES = {**{TRAINER_FIELD.get(n, n): kind for n, kind in SEARCHABLE.items()}, **TRIAL_FIELDS}
CONFIG_NAME = "train_config.json"


def _value(field: str, text: str):
    kind = FIELD_TYPES[field]
    if kind is str:
        return text
    try:
        number = float(text)
    except ValueError:
        raise ValueError(f"--{field} must be a number, got {text!r}") from None
    if kind is int:
        if not number.is_integer():
            raise ValueError(f"--{field} must be an integer, got {text!r}")
        return int(number)
    return number


def parse_args(argv: list[str]) -> tuple[str, str, dict, list[str]]:
    """``(base_config, trial_dir, overrides, command)`` from the command line; ValueError names the argument."""
    if "--" not in argv:
        raise ValueError("no command: end the arguments with -- torchrun ... --config <trial dir>/train_config.json")
    at = argv.index("--")
    options, command = argv[:at], argv[at + 1 :]
    if len(options) % 2:
        raise ValueError(f"every option takes one value: {options}")
    pairs = dict(zip(options[::2], options[1::2], strict=True))
    if len(pairs) != len(options) // 2:
        raise ValueError(f"an option is given twice: {options[::2]}")
    base_config, trial_dir = pairs.pop("--base-config", ""), pairs.pop("--trial-dir", "")
    if not base_config or not trial_dir:
        raise ValueError("--base-config FILE and --trial-dir DIR are required")
    overrides = {}
    for flag, text in pairs.items():
        field = flag.removeprefix("--")
        if not flag.startswith("--") or field not in FIELD_TYPES:
            raise ValueError(
                f"{flag} is not a setting a trial can set; those are {', '.join('--' + f for f in sorted(FIELD_TYPES))}"
            )
        overrides[field] = _value(field, text)
    config = os.path.join(trial_dir, CONFIG_NAME)
    if "--config" not in command[:-1] or command[command.index("--config") + 1] != config:
        raise ValueError(f"the command after -- must read the trial's config (--config {config}): {command}")
    return base_config, trial_dir, overrides, command


def write_trial_config(base_config: str, trial_dir: str, overrides: dict) -> str:
    """Write the run's config with ``overrides`` and ``output_dir=trial_dir`` to ``<trial_dir>/train_config.json``."""
    try:
        base = json.loads(Path(base_config).read_text())
    except FileNotFoundError:
        raise ValueError(f"--base-config {base_config}: no such file (the run's trainer config)") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"--base-config {base_config}: not valid JSON: {exc}") from None
    if not isinstance(base, dict):
        raise ValueError(f"--base-config {base_config}: not a JSON object")
    config = {**base, **overrides, "output_dir": trial_dir}
    path = Path(trial_dir, CONFIG_NAME)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Each pod writes its own temporary file and renames it over the config: same content, never half a file.
    tmp = path.with_name(f".{CONFIG_NAME}.{socket.gethostname()}.{os.getpid()}")
    tmp.write_text(json.dumps(config, indent=2, sort_keys=True))
    os.replace(tmp, path)
    return str(path)


def main(argv: list[str] | None = None) -> None:
    """Write the trial's config and exec the trainer's command on it."""
    try:
        base_config, trial_dir, overrides, command = parse_args(sys.argv[1:] if argv is None else argv)
        path = write_trial_config(base_config, trial_dir, overrides)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        raise SystemExit(2) from None
    print(f"trial config {path}: " + " ".join(f"{k}={v}" for k, v in overrides.items()), flush=True)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
