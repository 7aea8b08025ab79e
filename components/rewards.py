"""The grpo stage's rewards: built-in verifiable rewards, the reward model, and a user's function.

``grpo_rewards`` (a setting) maps each reward source to its weight; GRPO's reward of a completion is the weighted
sum (TRL's ``reward_weights``, GRPOConfig). The sources:

- ``answer``: 1.0 when the answer the completion gives (the first group of ``grpo_answer_pattern``, matched anywhere in
  it) equals the row's reference ``answer`` (as numbers when both parse as numbers, else as trimmed, case-folded text),
  0.0 when it differs or there is none; ``None`` (TRL: not applicable, left out of that row's sum) for a row without a
  reference.
- ``format``: 1.0 when the completion contains a match of ``grpo_answer_pattern`` (the required answer format), else
  0.0.
- ``length``: 1.0 for a completion of at most ``grpo_length_budget`` tokens, falling linearly to 0.0 at twice the
  budget.
- ``model``: a reward model's score (a sequence-classification model with one label, TRL's ``RewardTrainer`` output):
  the run's ``rm`` stage, or ``grpo_reward_model`` (a Hub id or a folder). TRL loads and calls it itself
  (GRPOTrainer._calculate_rewards: a ``str`` reward is loaded with ``AutoModelForSequenceClassification``,
  ``num_labels=1``, and scores the chat-templated prompt + completion).
- ``function``: the user's ``grpo_reward_function``, ``FILE.py:NAME`` (a file on a mounted volume) or
  ``package.module:NAME``. TRL calls reward functions as ``f(prompts=..., completions=..., completion_ids=...,
  trainer_state=..., log_extra=..., log_metric=..., <every other dataset column>=...)`` and takes one float (or
  None) per completion (trl/trainer/grpo_trainer.py, ``_calculate_rewards``, TRL 1.16). The user's function must take
  ``prompts`` and ``completions`` by keyword (or ``**kwargs``); it gets only the other keywords it names (``answer``,
  ``completion_ids``, ...), so ``def reward(prompts, completions, answer, **kwargs)`` and
  ``def reward(completions, **kwargs)`` both work.

This module imports no ML library: validate_inputs imports the user's function with it before any GPU is requested,
and evaluation scores held-out answers with the same functions.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import importlib.util
import inspect
import math
import re
import sys
from collections.abc import Callable
from pathlib import Path

from components.settings import Settings
from components.stages import stage_trainer

BUILTIN_REWARDS = ("answer", "format", "length")
# Every name grpo_rewards may use: the built-ins, the reward model and the user's function.
REWARD_SOURCES = (*BUILTIN_REWARDS, "model", "function")
# The keywords TRL passes every reward function besides the dataset's columns (GRPOTrainer._calculate_rewards).
TRL_KEYWORDS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")


class RewardFunctionError(ValueError):
    """The user's reward function cannot be used; the message names grpo_reward_function and the fix."""


def completion_text(completion) -> str:
    """The text of one completion: TRL hands conversational completions as a list of turns, plain ones as a str."""
    if isinstance(completion, str):
        return completion
    return "".join(turn.get("content", "") for turn in completion if isinstance(turn, dict))


def _number(text: str) -> float | None:
    try:
        value = float(text.replace(",", "").strip())
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def answers_match(given: str, reference: str) -> bool:
    """Whether ``given`` states ``reference``: equal as numbers when both are numbers, else as trimmed, case-folded
    text."""
    a, b = _number(given), _number(reference)
    if a is not None and b is not None:
        return abs(a - b) <= 1e-6 * max(1.0, abs(b))
    return given.strip().casefold() == reference.strip().casefold()


def extract_answer(text: str, pattern: str) -> str | None:
    """The answer ``text`` gives: the first group of ``pattern``'s first match (the whole match without a group;
    None without a match, or when an optional group matched nothing)."""
    match = re.search(pattern, text, re.DOTALL)
    if match is None:
        return None
    return match.group(1) if match.re.groups else match.group(0)


def answer_reward(pattern: str) -> Callable:
    """The ``answer`` reward (module docstring) for the answer format ``pattern``."""

    def answer(prompts, completions, answer=None, **kwargs) -> list[float | None]:
        references = answer if answer is not None else [""] * len(completions)
        out: list[float | None] = []
        for completion, reference in zip(completions, references, strict=True):
            if not reference:
                out.append(None)
                continue
            given = extract_answer(completion_text(completion), pattern)
            out.append(1.0 if given is not None and answers_match(given, reference) else 0.0)
        return out

    return answer


def format_reward(pattern: str) -> Callable:
    """The ``format`` reward (module docstring): whether each completion contains the required answer format."""

    def format(prompts, completions, **kwargs) -> list[float]:  # noqa: A001 (TRL logs the function's name)
        return [1.0 if re.search(pattern, completion_text(c), re.DOTALL) else 0.0 for c in completions]

    return format


def length_reward(budget: int) -> Callable:
    """The ``length`` reward (module docstring): 1 up to ``budget`` completion tokens, 0 from twice as many."""

    def length(prompts, completions, completion_ids=None, **kwargs) -> list[float]:
        sizes = (
            [len(ids) for ids in completion_ids]
            if completion_ids is not None
            else [len(completion_text(c).split()) for c in completions]
        )
        return [max(0.0, min(1.0, 2.0 - n / budget)) for n in sizes]

    return length


def builtin_reward(name: str, pattern: str, length_budget: int) -> Callable:
    """The built-in reward ``name`` (one of ``BUILTIN_REWARDS``)."""
    if name == "answer":
        return answer_reward(pattern)
    if name == "format":
        return format_reward(pattern)
    if name == "length":
        return length_reward(length_budget)
    raise ValueError(f"grpo_rewards: {name!r} is not a built-in reward; use one of {', '.join(BUILTIN_REWARDS)}")


def _import(spec: str):
    target, _, name = spec.rpartition(":")
    where = f"grpo_reward_function {spec!r}"
    if not target or not name:
        raise RewardFunctionError(f"{where}: expected FILE.py:NAME (a file on a mounted volume) or package.module:NAME")
    if target.endswith(".py"):
        path = Path(target)
        if not path.is_file():
            raise RewardFunctionError(
                f"{where}: {target} is not a file; put the file on a mounted volume (e.g. "
                "/mnt/data/rewards.py) and give its path"
            )
        # A name of its own per file, so two runs' files never share a module.
        module_name = "user_reward_" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
        module_spec = importlib.util.spec_from_file_location(module_name, path)
        assert module_spec is not None and module_spec.loader is not None  # a .py file always has a loader
        module = importlib.util.module_from_spec(module_spec)
        try:
            sys.modules[module_name] = module  # dataclasses and pickling look the module up by name
            module_spec.loader.exec_module(module)
        except Exception as exc:  # whatever the user's module raises on import
            sys.modules.pop(module_name, None)
            raise RewardFunctionError(f"{where}: importing {target} failed: {type(exc).__name__}: {exc}") from None
    else:
        try:
            module = importlib.import_module(target)
        except Exception as exc:  # ImportError, or whatever the module raises on import
            raise RewardFunctionError(
                f"{where}: importing module {target!r} failed: {type(exc).__name__}: {exc}; "
                "give FILE.py:NAME for a file on a mounted volume"
            ) from None
    function = getattr(module, name, None)
    if function is None or not callable(function):
        found = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_"))
        raise RewardFunctionError(f"{where}: {target} has no function {name!r} (its functions: {found})")
    return function


def load_reward_function(spec: str) -> Callable:
    """The user's reward function named by ``spec`` (module docstring), wrapped to receive only the keywords it names;
    a RewardFunctionError naming the setting and the fix when it does not import or cannot take
    ``prompts=..., completions=...``."""
    function = _import(spec)
    where = f"grpo_reward_function {spec!r}"
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        raise RewardFunctionError(f"{where}: cannot read the signature of {function!r}") from None
    params = signature.parameters.values()
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params)
    keywords = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    required = [p.name for p in params if p.default is p.empty and p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)]
    positional_only = [p.name for p in params if p.kind is p.POSITIONAL_ONLY]
    fix = (
        "define it as def NAME(prompts, completions, **kwargs) -> list[float] (one reward per completion; dataset "
        "columns such as answer arrive as keywords)"
    )
    problems = []
    if positional_only:
        problems.append(f"takes {positional_only} by position only, and TRL passes everything by keyword")
    if "completions" not in keywords and not takes_any:
        problems.append("does not take completions")
    unknown_required = [n for n in required if n not in TRL_KEYWORDS and n != "answer"]
    if unknown_required:
        problems.append(f"requires {unknown_required}, which neither TRL nor the prompt data (prompt, answer) pass")
    if problems:
        raise RewardFunctionError(f"{where}: {function.__name__}{signature} " + " and ".join(problems) + f"; {fix}")

    @functools.wraps(function)
    def reward(**kwargs):
        return function(**(kwargs if takes_any else {k: v for k, v in kwargs.items() if k in keywords}))

    return reward


def check_reward_function(spec: str) -> str | None:
    """The error for ``spec`` (import and signature, ``load_reward_function``), or None."""
    try:
        load_reward_function(spec)
    except RewardFunctionError as exc:
        return str(exc)
    return None


def grpo_function_error(s: Settings) -> str | None:
    """The grpo stage's user reward function imported here (the grpo data step, which mounts the data volume): the
    error naming grpo_reward_function, or None (also when the stage uses no function)."""
    p = stage_trainer(s, "grpo").preference
    rewards = p.grpo_rewards if isinstance(p.grpo_rewards, dict) else {}
    if not rewards.get("function") or not p.grpo_reward_function.strip():
        return None
    return check_reward_function(p.grpo_reward_function.strip())
