"""`transformers serve` on one localhost port, as every local server of a run starts it: the deploy step's
(components/deploy/local_server.py) and the evaluation's judge serving the base model (components/evaluate/judge.py).
One place for its flags and environment; the process is started, waited for and stopped by
components/models/server_process.py, the same for both."""

from __future__ import annotations

import os

from components import quick_exit


def transformers_serve(model_path: str, port: int) -> tuple[list[str], dict[str, str]]:
    """The command and environment of `transformers serve` for ``model_path`` on ``127.0.0.1:port``, on the CPU."""
    # In a process that skips the final garbage collection at exit: the callers' stop waits for it.
    cmd = quick_exit.command(
        "transformers.cli.transformers",
        "serve",
        model_path,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--device",
        "cpu",
        "--log-level",
        "warning",
    )
    # The CLI asks PyPI for a newer transformers once a day, for up to 2 s before it serves (and waits that long
    # where there is no network): a local server has no use for the hint.
    env = {**os.environ, "HF_HUB_DISABLE_UPDATE_CHECK": os.environ.get("HF_HUB_DISABLE_UPDATE_CHECK", "1")}
    return cmd, env
