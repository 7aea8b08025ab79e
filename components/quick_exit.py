"""``python -m components.quick_exit MODULE [ARG ...]``: ``python -m MODULE ARG ...`` in a process that skips
CPython's final garbage collection at exit, as every process importing this package does (components/__init__.py).

The local backends start the programs they do not own this way: torchrun (``torch.distributed.run``, which loads
torch) and ``transformers serve`` (torch and transformers), each of which spent a second or more of the laptop run
collecting its heap at exit while the step waited for it.
"""

from __future__ import annotations

import runpy
import sys

MODULE = "components.quick_exit"  # this module's name, also when it runs as __main__


def command(module: str, *args: str) -> list[str]:
    """The command line that runs ``python -m module args...`` this way, with this Python."""
    return [sys.executable, "-m", MODULE, module, *args]


def main(argv: list[str]) -> None:
    """Run ``argv[0]`` as ``__main__`` with ``argv`` as its command line (``sys.argv[0]`` is then its file)."""
    if not argv:
        print(f"usage: python -m {MODULE} MODULE [ARG ...]", file=sys.stderr)
        sys.exit(2)
    sys.argv = list(argv)
    runpy.run_module(argv[0], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
