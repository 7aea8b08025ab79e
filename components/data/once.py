"""A run's data for one stage, prepared once: what the data step (components/data/component.py) calls.

The run's data step prepares the sft data first (its eval split is what evaluation scores, and the hyper-parameter
search trains on it); then each stage's slot runs the data step for its own stage, and the sft stage asks again for
the same data, into the same folder of the run. The folder records the request it was prepared for
(``request.json``): asked again for exactly that, the step takes the folder as it is, without resolving the model,
loading the tokenizer or even importing them (torch, transformers, datasets: the seconds that step used to take).
Any other request, and every new run (another folder), goes through ``prepare``, whose fingerprint cache
(components/data/caching.py) still reuses an earlier run's result when sources, tokenizer and options are unchanged.

This module imports nothing heavy at module level, and must not: that is the point of it.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

REQUEST_FILE = "request.json"

log = logging.getLogger("prepare_dataset")


def prepare_once(out_dir: str, model_name_or_path: str, model_cache: str, **options) -> dict:
    """Prepare ``options`` (``prepare``'s arguments) into ``out_dir`` with the tokenizer of ``model_name_or_path``,
    resolved under ``model_cache``; return the stats.

    When ``out_dir`` already holds the result of this very request, return its stats instead, with ``cache_hit``
    true and ``seconds`` this call's.
    """
    started = time.time()
    request = _canonical({"model_name_or_path": model_name_or_path, **options})
    stats = _prepared_for(Path(out_dir), request)
    if stats is not None:
        stats.update(cache_hit=True, seconds=round(time.time() - started, 2))
        log.info("%s was prepared for this request earlier in the run: reusing it as it is", out_dir)
        return stats
    # Here, not at the top: a request answered above needs neither.
    from components.data.prepare import PrepareOptions, prepare
    from components.models.resolve import resolve_model

    source = options.pop("source")
    stats = prepare(source, resolve_model(model_name_or_path, model_cache), out_dir, PrepareOptions(**options))
    _write_atomically(Path(out_dir) / REQUEST_FILE, request)
    return stats


def _canonical(request: dict) -> dict:
    """``request`` as it reads back from JSON (tuples become lists, paths strings), so equal requests compare equal."""
    return json.loads(json.dumps(request, sort_keys=True, default=str))


def _prepared_for(out_dir: Path, request: dict) -> dict | None:
    """The stats in ``out_dir`` when its recorded request is ``request``; None when it holds anything else."""
    try:
        if json.loads((out_dir / REQUEST_FILE).read_text(encoding="utf-8")) != request:
            return None
        return json.loads((out_dir / "stats.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):  # no folder, no record (not prepared by this module), or not JSON
        return None


def _write_atomically(path: Path, data: dict) -> None:
    """``data`` as JSON at ``path``, renamed into place: a reader sees no record or a whole one."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True), encoding="utf-8")
    os.replace(tmp, path)
