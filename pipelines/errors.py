"""Errors the command-line entry points turn into one clear line and exit code 2."""


class UsageError(Exception):
    """Bad input from the user: the message names the field and the fix.

    Entry points print ``error: <message>`` and exit with code 2, without a traceback,
    before anything is submitted or any GPU is requested.
    """
