"""The bundled samples a laptop run trains on: chat (shipped), and domain text and preference pairs the package
writes itself from the chat sample, so every stage (cpt, sft, dpo) has data without a download.

- ``builtin:sample``: 537 bilingual (Korean/English) conversations about training and serving LLMs;
- ``builtin:domain-text``: the same knowledge as plain text, one document per conversation (question as the
  opening line, then the answers): what continued pretraining reads;
- ``builtin:arithmetic``: prompts with numeric reference answers for the grpo stage (components/data/arithmetic.py);
- ``builtin:preference``: one pair per single-turn conversation, for a preference in style that the chat data does
  not teach: the same answer, opened by acknowledging the question (``chosen``: "Good question." in the prompt's
  language) or by a filler (``rejected``: "Well,", "Honestly,", ... in turn). A model tuned on the chat data alone
  has no reason to prefer either opening (it prefers the chosen one for some fillers and not for others);
  preference tuning is what moves it to the preferred opening.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from components.data.arithmetic import arithmetic_prompts

SAMPLE_PATH = Path(__file__).with_name("sample") / "instructions.jsonl"
BUILTIN = ("builtin:sample", "builtin:domain-text", "builtin:preference", "builtin:arithmetic")


def _conversations() -> list[list[dict]]:
    with SAMPLE_PATH.open(encoding="utf-8") as f:
        return [json.loads(line)["messages"] for line in f if line.strip()]


def _is_korean(text: str) -> bool:
    return any("\uac00" <= ch <= "\ud7a3" for ch in text)


def domain_text() -> list[dict]:
    """``{"text": ...}`` documents: each conversation's questions and answers as prose."""
    return [
        {"text": "\n\n".join(m["content"] for m in messages if m["role"] != "system")} for messages in _conversations()
    ]


# The preferred opening and the fillers it is preferred to, by whether the prompt is Korean.
PREFERRED = {True: "좋은 질문입니다. ", False: "Good question. "}
FILLERS = {True: ("음, ", "솔직히, ", "그러니까, ", "글쎄요, "), False: ("Well, ", "Honestly, ", "Okay, so ", "Hmm, ")}


def preference_pairs() -> list[dict]:
    """TRL's conversational preference rows from the single-turn conversations (module docstring)."""
    single = [m for m in _conversations() if [t["role"] for t in m if t["role"] != "system"] == ["user", "assistant"]]
    pairs = []
    for i, messages in enumerate(single):
        prompt, answer = [t for t in messages if t["role"] != "assistant"], messages[-1]["content"]
        korean = _is_korean(prompt[-1]["content"])
        filler = FILLERS[korean][i % len(FILLERS[korean])]
        pairs.append(
            {
                "prompt": prompt,
                "chosen": [{"role": "assistant", "content": PREFERRED[korean] + answer}],
                "rejected": [{"role": "assistant", "content": filler + answer}],
            }
        )
    return pairs


def builtin_path(source: str) -> str:
    """The JSONL file behind a ``builtin:`` source; the derived ones are written once per content, atomically."""
    if source == "builtin:sample":
        return str(SAMPLE_PATH)
    rows = {
        "builtin:domain-text": domain_text,
        "builtin:preference": preference_pairs,
        "builtin:arithmetic": arithmetic_prompts,
    }[source]()
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    folder = Path(tempfile.gettempdir()) / "llm-post-training-samples"
    path = folder / f"{source.split(':')[1]}-{digest}.jsonl"
    if not path.exists():
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)  # concurrent steps write the same bytes: whichever rename wins is right
    return str(path)
