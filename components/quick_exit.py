"""``python -m components.quick_exit MODULE [ARG ...]``: ``python -m MODULE ARG ...`` in a process that skips
CPython's final garbage collection at exit (``freeze_heap_at_exit``), as this package's own programs do; and the
pause of the collector while an entry point loads its libraries (``pause_collection``, ``resume_collection``: the
trainer's ranks, and here the module's packages, torch for torchrun).

The local backends start the programs they do not own this way: torchrun (``torch.distributed.run``, which loads
torch) and ``transformers serve`` (torch and transformers), each of which spent a second or more of the laptop run
collecting its heap at exit while the step waited for it.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import runpy
import sys

MODULE = "components.quick_exit"  # this module's name, also when it runs as __main__


def freeze_heap_at_exit() -> None:
    """Skip CPython's last garbage collections when this process exits.

    The package's programs (each KFP step, the trainer's ranks, the data command line) load torch, transformers or
    datasets: millions of objects, which CPython walks at exit (1-3 s per process on 2 CPU cores, paid once per step
    and rank). Freezing them at exit skips that walk; the operating system frees the memory. Every atexit handler
    registered earlier still runs (they run last-in, first-out), and what the program closes itself is closed: only
    garbage in reference cycles goes uncollected, whose finalizers CPython does not promise to run at exit either.
    Called by the entry points, never on import: a library user's process keeps its own exit.
    """
    atexit.register(gc.freeze)


def pause_collection() -> None:
    """Collect no cyclic garbage until ``resume_collection``: an entry point calls it before it imports torch,
    transformers and datasets. Those imports create millions of objects, none of them garbage, and CPython's collector
    walked them again and again as they were created: about 1 of the 6 s a trainer rank takes to import its
    libraries on 2 CPU cores (``python -c 'import torch, datasets; from transformers import Trainer'``: 6.1-6.7 s with
    the collector, 5.4-5.8 s without)."""
    gc.disable()


def resume_collection() -> None:
    """Collect cyclic garbage again, the loaded libraries' objects frozen first: they live as long as the process, and
    the collector never walks them again (as ``freeze_heap_at_exit`` spares the last walk)."""
    gc.freeze()
    gc.enable()


def command(module: str, *args: str) -> list[str]:
    """The command line that runs ``python -m module args...`` this way, with this Python."""
    return [sys.executable, "-m", MODULE, module, *args]


def main(argv: list[str]) -> None:
    """Run ``argv[0]`` as ``__main__`` with ``argv`` as its command line (``sys.argv[0]`` is then its file)."""
    if not argv:
        print(f"usage: python -m {MODULE} MODULE [ARG ...]", file=sys.stderr)
        sys.exit(2)
    sys.argv = list(argv)
    freeze_heap_at_exit()
    package = argv[0].rpartition(".")[0]
    if package:
        # run_module imports the module's packages first: here, with the collector paused (torchrun's torch).
        pause_collection()
        try:
            importlib.import_module(package)
        finally:
            resume_collection()
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
