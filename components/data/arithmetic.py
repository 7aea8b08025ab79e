"""``builtin:arithmetic``: the grpo stage's bundled prompts, short arithmetic and word problems in Korean and English
with numeric reference answers and a required answer format: the reply ends with ``Answer: N`` (English) or
``정답은 N입니다.`` (Korean), the closing line the bundled chat sample's 124 worked math problems use, so that a model
fine-tuned on that sample already writes it now and then and rewards can make it the rule.

Rows are the prompt layout the data step keeps for the grpo stage (components/data/formats.py, format ``prompts``):
``{"prompt": [{"role": "user", "content": ...}], "answer": "7"}``. They are generated from a fixed seed, so every run
gets the same rows and the same held-out split (the data step's seeded hash decides it, as for every source).

Small numbers (sums and differences of one- and two-digit numbers, products of one-digit numbers) and the format
instruction in every prompt: what a 1M-parameter model can start to learn from rewards in a few minutes on CPU.
"""

from __future__ import annotations

import random

# The answer format every prompt asks for, the grpo stage's default grpo_answer_pattern: the answer line's opening, and
# the number after it as the answer. The number is optional to the format: the format reward pays for the answer line
# (which a model fine-tuned on the chat sample writes in about a fifth of its sampled replies to these prompts, so
# GRPO's groups see it), the answer reward for the right number in it (a few percent).
ANSWER_PATTERN = r"(?:Answer:|정답은)\s*\$?(-?\d[\d,]*(?:\.\d+)?)?"
ROWS = 480
SEED = 21

_FORMAT = {"en": " End with 'Answer: N'.", "ko": " 마지막에 '정답은 N입니다.'라고 쓰세요."}
# (template, operation) per language; {a} and {b} are the operands.
_TEMPLATES = {
    "en": [
        ("What is {a} + {b}?", "+"),
        ("What is {a} - {b}?", "-"),
        ("What is {a} times {b}?", "*"),
        ("Tom has {a} apples and buys {b} more. How many apples does he have now?", "+"),
        ("A box holds {a} pens. {b} pens are taken out. How many pens are left?", "-"),
        ("There are {a} rows of chairs with {b} chairs in each row. How many chairs are there?", "*"),
    ],
    "ko": [
        ("{a} 더하기 {b}는 얼마입니까?", "+"),
        ("{a} 빼기 {b}는 얼마입니까?", "-"),
        ("{a} 곱하기 {b}는 얼마입니까?", "*"),
        ("민수는 사과 {a}개를 가지고 있고 {b}개를 더 샀습니다. 사과는 모두 몇 개입니까?", "+"),
        ("상자에 연필이 {a}자루 있습니다. {b}자루를 꺼냈습니다. 남은 연필은 몇 자루입니까?", "-"),
        ("의자가 한 줄에 {b}개씩 {a}줄 있습니다. 의자는 모두 몇 개입니까?", "*"),
    ],
}


def _operands(rng: random.Random, op: str) -> tuple[int, int]:
    if op == "*":
        return rng.randint(2, 9), rng.randint(2, 9)
    a, b = rng.randint(1, 30), rng.randint(1, 20)
    return (max(a, b), min(a, b)) if op == "-" else (a, b)  # no negative answers


def arithmetic_prompts(rows: int = ROWS, seed: int = SEED) -> list[dict]:
    """``rows`` prompt rows, alternating English and Korean, each with its numeric reference answer."""
    rng = random.Random(seed)
    out: list[dict] = []
    seen: set[str] = set()
    while len(out) < rows:
        lang = "en" if len(out) % 2 == 0 else "ko"
        template, op = rng.choice(_TEMPLATES[lang])
        a, b = _operands(rng, op)
        question = template.format(a=a, b=b)
        if question in seen:  # the data step drops exact duplicates: draw another
            continue
        seen.add(question)
        answer = a + b if op == "+" else a - b if op == "-" else a * b
        out.append({"prompt": [{"role": "user", "content": question + _FORMAT[lang]}], "answer": str(answer)})
    return out
