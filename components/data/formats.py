"""Instruction-data formats, detected or declared, converted to one canonical row.

Chat formats (OpenAI ``messages``, ShareGPT ``conversations``, alpaca, prompt/completion) all become
``{"messages": [{"role", "content"}, ...]}``; plain ``text`` stays ``{"text": ...}``; preference rows
become ``{"prompt": [...], "chosen": [...], "rejected": [...]}`` (TRL's conversational preference
layout), kept for a later preference-tuning stage; prompt rows (``prompts``, the grpo stage's) become
``{"prompt": [...], "answer": "..."}`` (TRL's conversational prompt layout plus the optional reference answer the
verifiable rewards check, empty when absent). All text is normalised to Unicode NFC, because
Hangul often arrives decomposed and equal text must give equal tokens and equal duplicate hashes.
"""

from __future__ import annotations

import json
import unicodedata
from dataclasses import dataclass

CHAT_FORMATS = ("messages", "sharegpt", "alpaca", "prompt_completion")
FORMATS = (*CHAT_FORMATS, "text", "preference", "prompts")
# What a user may declare (prepare --format, the pipeline's dataset_format): a format, or auto to detect it.
DATASET_FORMATS = ("auto", *FORMATS)
ROLES = ("system", "user", "assistant")
# ShareGPT's speaker names, mapped to OpenAI roles.
SHAREGPT_ROLES = {"system": "system", "human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant"}
# The columns each format needs, by canonical name; a column mapping renames source columns onto these.
REQUIRED = {
    "messages": ("messages",),
    "sharegpt": ("conversations",),
    "alpaca": ("instruction", "output"),
    "prompt_completion": ("prompt", "completion"),
    "text": ("text",),
    "preference": ("prompt", "chosen", "rejected"),
    "prompts": ("prompt",),  # and an optional "answer" column: the reference the grpo stage's rewards check
}
# Detection order matters: preference rows also have ``prompt``, so they are recognised first. Prompt rows are never
# detected (a prompt_completion file missing its completions would pass for them): the grpo stage declares them.
DETECT_ORDER = ("messages", "sharegpt", "preference", "alpaca", "prompt_completion", "text")


@dataclass(frozen=True)
class Options:
    """How the data step's messages name what its user sets: the standalone command's flags (``COMMAND_LINE``), or a
    pipeline stage's settings (components/data/run.py). An empty name: the stage has no such setting (its format is
    fixed, or it maps no columns), and the message offers none."""

    source: str
    format: str
    columns: str
    max_bad_rows: str
    eval_size: str
    flags: bool  # ``--format alpaca`` (flags) or ``dataset_format=alpaca`` (settings)

    def set(self, option: str, value) -> str:
        """``option`` set to ``value``, as this user writes it."""
        name = getattr(self, option)
        return f"{name} {value}" if self.flags else f"{name}={value}"

    def mapping(self, canonical: str, column: str) -> str:
        """The column mapping of ``column`` onto the format's ``canonical`` name, as this user writes it."""
        if self.flags:
            return f"{self.columns} {canonical}={column}"
        return f"{self.columns}={json.dumps({canonical: column})}"


COMMAND_LINE = Options("--source", "--format", "--columns", "--max-bad-rows", "--eval-size", flags=True)


def _fixes(names: Options, column: str, yours: str) -> str:
    """What to set when a source's columns do not fit its format: the format, or a column mapping (those the stage
    has)."""
    fixes = [f"map your column names onto the format's, e.g. {names.mapping(column, yours)}"] if names.columns else []
    if names.format:
        fixes.append(f"{'pass' if names.flags else 'set'} {names.format} to the rows' format")
    return ", or ".join(fixes) or "give the stage rows with those columns"


class DataError(ValueError):
    """The data cannot be prepared; the message names the file/line/field and the fix."""


class RowError(ValueError):
    """One row cannot be used; ``reason`` is the stats key it is counted under when skipped."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def detect_format(columns, where: str, names: Options = COMMAND_LINE) -> str:
    """The format whose required columns are all present in ``columns``; an error listing what was found and what
    to set (``names``: the user's names for the options)."""
    for fmt in DETECT_ORDER:
        if all(c in columns for c in REQUIRED[fmt]):
            return fmt
    yours = next(iter(sorted(columns)), "your_column")
    raise ValueError(
        f"{where}: cannot tell the format from the columns {sorted(columns)}; expected one of "
        + ", ".join(f"{f} ({'/'.join(REQUIRED[f])})" for f in DETECT_ORDER)
        + f"; {_fixes(names, 'messages', yours)}"
    )


def check_columns(fmt: str, columns, where: str, names: Options = COMMAND_LINE) -> None:
    """Raise when ``fmt``'s required columns are not all in ``columns``, naming those found and what to set."""
    missing = [c for c in REQUIRED[fmt] if c not in columns]
    if missing:
        raise ValueError(
            f"{where}: format {fmt!r} needs column(s) {missing} but found {sorted(columns)}; "
            f"{_fixes(names, missing[0], next(iter(sorted(columns)), 'your_column'))}"
        )


def nfc(text) -> str:
    """``text`` as a Unicode NFC string (``None`` becomes empty)."""
    return unicodedata.normalize("NFC", "" if text is None else str(text))


def _turns(messages, role_key: str, content_key: str, role_names: dict) -> list[dict]:
    if not isinstance(messages, list):
        raise RowError("malformed", f"expected a list of turns, got {type(messages).__name__}")
    out = []
    for turn in messages:
        if not isinstance(turn, dict):
            raise RowError("malformed", f"expected each turn to be an object, got {type(turn).__name__}")
        role = role_names.get(turn.get(role_key))
        if role is None:
            raise RowError("unknown_role", f"unknown role {turn.get(role_key)!r}; use one of {sorted(role_names)}")
        out.append({"role": role, "content": nfc(turn.get(content_key))})
    return out


def _user_assistant(prompt, answer, system=None) -> list[dict]:
    turns = [{"role": "system", "content": nfc(system)}] if system else []
    return turns + [{"role": "user", "content": nfc(prompt)}, {"role": "assistant", "content": nfc(answer)}]


def _side(value, role: str) -> list[dict]:
    """A preference field: a string, or already a list of turns."""
    if isinstance(value, list):
        return _turns(value, "role", "content", {r: r for r in ROLES})
    return [{"role": role, "content": nfc(value)}]


def to_canonical(fmt: str, row: dict) -> dict:
    """Convert one source row (already column-mapped) of format ``fmt`` to the canonical row."""
    if fmt == "messages":
        return {"messages": _turns(row["messages"], "role", "content", {r: r for r in ROLES})}
    if fmt == "sharegpt":
        return {"messages": _turns(row["conversations"], "from", "value", SHAREGPT_ROLES)}
    if fmt == "alpaca":
        prompt = nfc(row["instruction"])
        if row.get("input"):
            prompt = f"{prompt}\n\n{nfc(row['input'])}"
        return {"messages": _user_assistant(prompt, row["output"], row.get("system"))}
    if fmt == "prompt_completion":
        return {"messages": _user_assistant(row["prompt"], row["completion"], row.get("system"))}
    if fmt == "text":
        return {"text": nfc(row["text"])}
    if fmt == "prompts":
        answer = row.get("answer")
        return {"prompt": _side(row["prompt"], "user"), "answer": "" if answer is None else nfc(answer)}
    return {
        "prompt": _side(row["prompt"], "user"),
        "chosen": _side(row["chosen"], "assistant"),
        "rejected": _side(row["rejected"], "assistant"),
    }


def clean(row: dict) -> dict:
    """Raise :class:`RowError` for rows with nothing to learn from; return the row unchanged otherwise."""
    if "text" in row:
        if not row["text"].strip():
            raise RowError("empty_text", "the text is empty")
        return row
    if "answer" in row:  # a prompt row: the prompt must say something, the reference may be absent
        turns = row["prompt"]
    else:
        turns = row["messages"] if "messages" in row else row["prompt"] + row["chosen"] + row["rejected"]
    if any(not t["content"].strip() for t in turns):
        raise RowError("empty_turn", "a turn is empty or whitespace only")
    if "messages" in row and not any(t["role"] == "assistant" for t in turns):
        raise RowError("no_assistant_turn", "no assistant turn; there is nothing to learn from this conversation")
    return row
