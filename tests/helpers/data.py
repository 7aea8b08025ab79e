"""Chat conversations and JSONL files for the data preparation tests."""

import json


def conversation(i: int, lang: str = "en") -> dict:
    """The ``i``-th chat of the test corpus: English with a system turn and answers of varied length, or Korean."""
    if lang == "ko":
        return {
            "messages": [
                {"role": "user", "content": f"{i} 더하기 {i}는 무엇입니까?"},
                {"role": "assistant", "content": f"정답은 {2 * i}입니다."},
            ]
        }
    return {
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": f"What is {i} plus {i}?"},
            {"role": "assistant", "content": f"The answer is {2 * i}." + " Indeed." * (i % 7)},
        ]
    }


def write_jsonl(path, rows):
    """Write ``rows`` (dicts, or strings written as they are) one a line, UTF-8; return ``path``."""
    path.write_text(
        "\n".join(r if isinstance(r, str) else json.dumps(r, ensure_ascii=False) for r in rows), encoding="utf-8"
    )
    return path
