"""The prompt set both models answer for the report: the bundled Korean/English prompts or a user's JSONL file.

One conversation per line, the same shape as the training data without the answer:
``{"messages": [{"role": "user", "content": "..."}]}`` (a system message may come first).
"""

from __future__ import annotations

import json
from pathlib import Path

BUILTIN_PROMPTS = "builtin:sample"
SAMPLE_PROMPTS = Path(__file__).parents[1] / "data" / "sample" / "eval_prompts.jsonl"
_ROLES = ("system", "user", "assistant")


def load_prompts(source: str) -> list[list[dict]]:
    """The conversations in ``source`` (``builtin:sample`` or a JSONL path), each ending with a user turn.

    Raises:
        ValueError: naming the file and line, for a missing file, bad JSON, or a conversation that does not
            end with a user message.
    """
    path = SAMPLE_PROMPTS if source == BUILTIN_PROMPTS else Path(source)
    if not path.is_file():
        raise ValueError(
            f"eval_prompts: {source!r} is not a file; pass a JSONL file of "
            f'{{"messages": [...]}} lines, or {BUILTIN_PROMPTS!r} for the bundled prompts'
        )
    prompts = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"eval_prompts: {path}:{number}"
            try:
                messages = json.loads(line).get("messages")
            except (json.JSONDecodeError, AttributeError) as exc:
                raise ValueError(f'{where}: not a JSON object ({exc}); expected {{"messages": [...]}}') from None
            if (
                not isinstance(messages, list)
                or not messages
                or any(
                    not isinstance(m, dict) or m.get("role") not in _ROLES or not isinstance(m.get("content"), str)
                    for m in messages
                )
            ):
                raise ValueError(
                    f"{where}: 'messages' must be a non-empty list of {{\"role\": one of {list(_ROLES)}, "
                    '"content": str}'
                )
            if messages[-1]["role"] != "user":
                raise ValueError(f"{where}: the last message must be the user's (the models write the answer)")
            prompts.append([{"role": m["role"], "content": m["content"]} for m in messages])
    if not prompts:
        raise ValueError(f"eval_prompts: {path} has no prompts")
    return prompts
