"""Errors the command-line entry points turn into one clear line and exit code 2; what a failed write says."""

import errno
import shutil
from pathlib import Path


class UsageError(Exception):
    """Bad input from the user: the message names the field and the fix.

    Entry points print ``error: <message>`` and exit with code 2, without a traceback,
    before anything is submitted or any GPU is requested.
    """


def exit_code(command) -> int:
    """Run ``command`` (no arguments; returns the exit code) as a command line does: a UsageError is ``error: ...``
    on stderr and exit 2, a RuntimeError (a server's refusal, a failed step) ``error: ...`` and exit 1."""
    import sys

    try:
        return command()
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except RuntimeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


def write_failure(exc: OSError, path) -> str:
    """What a failed write of ``path`` says: the reason, and for a full disk ENOSPC and the bytes free there."""
    if exc.errno == errno.ENOSPC:
        free = _free_bytes(path)
        return f"could not write {path}: No space left on device (ENOSPC; {free} bytes free on its filesystem)"
    return f"could not write {path}: {exc.strerror or exc}"


def _free_bytes(path) -> int | str:
    """The bytes free on the filesystem of ``path`` (or of its nearest folder that exists); '?' if unknown."""
    folder = Path(path).absolute()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return "?"
