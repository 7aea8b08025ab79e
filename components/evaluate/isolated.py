"""Run one function in a fresh (spawned) process and return its result.

Scoring the base and then the tuned model with vLLM (or lm-evaluation-harness on vLLM) in one process
leaves the first engine's GPU memory and tensor-parallel workers behind; a process per model gets every
byte back when it exits.
"""

from __future__ import annotations

import multiprocessing
import traceback


def _child(conn, fn, args, kwargs):
    try:
        conn.send(("ok", fn(*args, **kwargs)))
    except BaseException as exc:  # report everything, KeyboardInterrupt included, to the parent
        conn.send(("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}"))
    finally:
        conn.close()


def run_isolated(fn, *args, **kwargs):
    """``fn(*args, **kwargs)`` in a spawned, non-daemonic process (vLLM starts its own workers from it).

    ``fn`` must be importable at module level and its arguments and result picklable.

    Raises:
        RuntimeError: the function raised (with its traceback) or the process died without an answer.
    """
    ctx = multiprocessing.get_context("spawn")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(child, fn, args, kwargs))
    proc.start()
    child.close()
    try:
        status, value = parent.recv()
    except EOFError:
        proc.join()
        raise RuntimeError(
            f"{fn.__module__}.{fn.__name__} died without a result (exit code {proc.exitcode}; "
            "out of host memory is the usual cause)"
        ) from None
    finally:
        parent.close()
    proc.join()
    if status == "error":
        raise RuntimeError(f"{fn.__module__}.{fn.__name__} failed in its subprocess: {value}")
    return value
