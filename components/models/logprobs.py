"""Proof that the served model is the evaluated one: the server's log-probabilities and greedy answers against the
evaluation's own (issue 19, defect 8).

A server can load the exported folder and still compute another function: a library that reads the config
differently (transformers 4.x reads a transformers-5 config's RoPE base as 10,000 instead of Qwen3's 1,000,000), a
wrong dtype or a broken weight conversion. The model still answers a chat message, so a one-reply smoke test passes.
So the evaluate step writes a reference beside the model folder (``serving_check.json``, ``reference_path``) and the
deploy step compares the running server with it:

- **log-probabilities**: ``EXAMPLES`` held-out examples (the eval split's first, each cut to its first
  ``MAX_EXAMPLE_TOKENS`` tokens) as token ids, with the evaluation's log-probability of every scored (label) token.
  The server scores the same ids through the OpenAI completions API (``prompt`` as token ids, ``echo`` with
  ``logprobs``: the log-probability of each prompt token, as vLLM returns it). It passes when the mean absolute
  difference per scored token is at most ``LOGPROB_TOLERANCE`` (0.05 nats). That is the per-token comparison, not
  the difference of the two mean losses: a misread RoPE base moves tokens' log-probabilities by about a nat each,
  in both directions, while the mean loss can move by a few hundredths only.
- **greedy answers**: the first ``ANSWER_TOKENS`` greedy tokens the evaluation's model gives to the first
  ``PROMPTS`` evaluation prompts (chat template applied, as token ids), with the gap between the best and the
  second-best log-probability at each step. The server's greedy tokens must equal them as long as the two agree;
  where they part, the evaluation's choice must have led by less than ``TIE_MARGIN`` (a near tie: a rounding
  difference may pick the other token there, and what follows depends on which).

Why these tolerances: evaluation runs in float32 on a CPU and bf16 on GPUs; vLLM serves in bf16 (also on CPU).
Measured in the serving rehearsal (tests/deploy/test_serving_rehearsal.py: vLLM 0.32 in bf16 against the
evaluation's float32, tiny exports): 0.002-0.004 nats per token on average, 0.013 at most. Between two bf16
kernels on GPUs the differences are of the same order (bf16 keeps 8 bits of mantissa), so 0.05 leaves room, while
a RoPE base read as 10,000 instead of 1,000,000 moves them by about a nat (tests/deploy/test_serving_check.py).

A server whose completions API returns no log-probabilities (``transformers serve``, the local deployment) is
checked on the greedy answers alone, compared as text (``check_greedy_text``).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

from components.models.packing import IGNORE_INDEX, split_examples

REFERENCE_FILE = "serving_check.json"
FORMAT_VERSION = 1
EXAMPLES = 4
MAX_EXAMPLE_TOKENS = 512
PROMPTS = 2
ANSWER_TOKENS = 8
LOGPROB_TOLERANCE = 0.05
TIE_MARGIN = 0.2


class ServingMismatch(RuntimeError):
    """The server computes something other than the evaluated model."""


def reference_path(model_path: str) -> str:
    """Where the evaluation's reference for ``model_path`` lives: beside the model folder (the stage's folder)."""
    return os.path.join(os.path.dirname(os.path.normpath(model_path)), REFERENCE_FILE)


def write_reference(path: str, reference: dict) -> str:
    """Write ``reference`` to ``path`` atomically (a reader never sees half a file); return ``path``."""
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(reference, f)
    os.replace(tmp, path)
    return path


def read_reference(path: str) -> dict:
    """The reference the evaluate step wrote.

    Raises:
        FileNotFoundError: naming the file and the step that writes it.
        ValueError: a file of another format version.
    """
    try:
        with open(path) as f:
            reference = json.load(f)
    except FileNotFoundError:
        raise FileNotFoundError(
            f"{path} not found: evaluate_model writes the serving reference there (the held-out "
            "rows' log-probabilities and greedy answers the served model must reproduce); "
            "deploy a model the evaluate step of this package scored"
        ) from None
    if reference.get("version") != FORMAT_VERSION:
        raise ValueError(
            f"{path} has format version {reference.get('version')!r}, this package reads "
            f"{FORMAT_VERSION}: run the evaluation again with this version"
        )
    return reference


def scored_examples(rows, examples: int = EXAMPLES, max_tokens: int = MAX_EXAMPLE_TOKENS) -> list[dict]:
    """The first ``examples`` held-out examples (packed rows split back, as vLLM scoring does), each cut to its first
    ``max_tokens`` tokens: ``{"token_ids", "positions"}``, positions being the scored (label) tokens after the first."""
    chosen = []
    for i in range(len(rows)):
        for ids, labels in split_examples(dict(rows[i])):
            ids, labels = list(ids[:max_tokens]), list(labels[:max_tokens])
            # Position 0 has no context: no model scores it (vllm_scoring skips it too).
            positions = [p for p in range(1, len(ids)) if labels[p] != IGNORE_INDEX]
            if positions:
                chosen.append({"token_ids": ids, "positions": positions})
            if len(chosen) == examples:
                return chosen
    return chosen


def prompt_starts(tokenizer, prompts: list[list[dict]], count: int = PROMPTS) -> list[tuple[str, list[int]]]:
    """The first ``count`` evaluation prompts as generation starts from them: ``(text, token ids)``, the chat template
    applied with the generation prompt and tokenized as ``generate_answers`` does."""
    out = []
    for messages in prompts[:count]:
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        out.append((text, tokenizer(text, add_special_tokens=False)["input_ids"]))
    return out


def _eos_ids(model) -> set[int]:
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if eos is None:
        eos = model.config.eos_token_id
    return set(eos if isinstance(eos, list) else [] if eos is None else [eos])


def transformers_reference(model, tokenizer, rows, prompts: list[list[dict]]) -> dict:
    """The reference from the model the evaluation scored with transformers (``model`` as loaded for scoring)."""
    import torch

    examples = scored_examples(rows)
    with torch.no_grad():
        for ex in examples:
            batch = torch.tensor([ex["token_ids"]], device=model.device)
            logprobs = model(input_ids=batch, use_cache=False).logits[0].float().log_softmax(-1)
            # Labels are unshifted: the logits at p - 1 predict the token at p.
            ex["logprobs"] = [logprobs[p - 1, ex["token_ids"][p]].item() for p in ex["positions"]]
        greedy, eos = [], _eos_ids(model)
        for text, ids in prompt_starts(tokenizer, prompts):
            seq, answer, margins = list(ids), [], []
            for _ in range(ANSWER_TOKENS):
                logits = model(input_ids=torch.tensor([seq], device=model.device), use_cache=False).logits[0, -1]
                top = logits.float().log_softmax(-1).topk(2)
                token = int(top.indices[0])
                answer.append(token)
                margins.append(float(top.values[0] - top.values[1]))
                seq.append(token)
                if token in eos:
                    break
            greedy.append(_greedy_entry(tokenizer, text, ids, answer, margins))
    return _reference(examples, greedy, str(next(model.parameters()).dtype).removeprefix("torch."), "transformers")


def vllm_reference(llm, rows, prompts: list[list[dict]]) -> dict:
    """The reference from the vLLM engine (``vllm.LLM``) the evaluation scored with (evaluate/vllm_scoring.py)."""
    from vllm import SamplingParams

    examples = scored_examples(rows)
    prompt_outputs = llm.generate(
        [{"prompt_token_ids": ex["token_ids"]} for ex in examples], SamplingParams(max_tokens=1, prompt_logprobs=0)
    )
    for ex, out in zip(examples, prompt_outputs, strict=True):
        ex["logprobs"] = [out.prompt_logprobs[p][ex["token_ids"][p]].logprob for p in ex["positions"]]
    tokenizer = llm.get_tokenizer()
    starts = prompt_starts(tokenizer, prompts)
    answers = llm.generate(
        [{"prompt_token_ids": ids} for _, ids in starts],
        SamplingParams(temperature=0.0, max_tokens=ANSWER_TOKENS, logprobs=2),
    )
    greedy = []
    for (text, ids), out in zip(starts, answers, strict=True):
        margins = []
        for candidates in out.outputs[0].logprobs:  # one dict per generated token: its top 2 and itself
            values = sorted((c.logprob for c in candidates.values()), reverse=True)
            margins.append(values[0] - values[1] if len(values) > 1 else float("inf"))
        greedy.append(_greedy_entry(tokenizer, text, ids, list(out.outputs[0].token_ids), margins))
    return _reference(examples, greedy, str(llm.llm_engine.model_config.dtype).removeprefix("torch."), "vllm")


def _greedy_entry(tokenizer, text: str, ids: list[int], answer: list[int], margins: list[float]) -> dict:
    return {
        "token_ids": list(ids),
        "prompt_text": text,
        "answer_ids": answer,
        "margins": margins,
        "answer_text": tokenizer.decode(answer, skip_special_tokens=True),
        "decisive_text": tokenizer.decode(answer[: _decisive(margins)], skip_special_tokens=True).rstrip("\ufffd"),
    }


def _reference(examples: list[dict], greedy: list[dict], dtype: str, engine: str) -> dict:
    scored = [lp for ex in examples for lp in ex["logprobs"]]
    return {
        "version": FORMAT_VERSION,
        "engine": engine,
        "dtype": dtype,
        "examples": examples,
        "greedy": greedy,
        "loss": -sum(scored) / len(scored) if scored else None,
        "tokens": len(scored),
        "logprob_tolerance": LOGPROB_TOLERANCE,
        "tie_margin": TIE_MARGIN,
    }


def _decisive(margins: list[float], tie_margin: float = TIE_MARGIN) -> int:
    """How many leading greedy steps any faithful server must repeat: up to the first near tie (exclusive)."""
    return next((i for i, m in enumerate(margins) if m < tie_margin), len(margins))


def _post(url: str, body: dict, timeout: float, api_key: str = "") -> dict:
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as e:
        raise ServingMismatch(f"{url} answered HTTP {e.code}: {e.read()[:300]!r}") from None


def _token_id(token: str) -> int:
    # vLLM's return_tokens_as_token_ids spells each token "token_id:<id>".
    if not token.startswith("token_id:"):
        raise ServingMismatch(
            f"the server returned token {token!r} where it was asked for 'token_id:<id>' "
            "(return_tokens_as_token_ids): a vLLM OpenAI server is needed for this check"
        )
    return int(token.removeprefix("token_id:"))


def server_logprobs(
    base_url: str, model: str, token_ids: list[int], timeout: float = 120.0, api_key: str = ""
) -> list[float | None]:
    """The server's log-probability of each token of ``token_ids`` given the ones before it (None for the first);
    ``api_key``: the bearer token a server started with ``--api-key`` asks for."""
    payload = _post(
        base_url.rstrip("/") + "/completions",
        {
            "model": model,
            "prompt": token_ids,
            "max_tokens": 1,
            "temperature": 0,
            "echo": True,
            "logprobs": 0,
            "return_tokens_as_token_ids": True,
        },
        timeout,
        api_key,
    )
    logprobs = ((payload.get("choices") or [{}])[0].get("logprobs")) or {}
    values, tokens = logprobs.get("token_logprobs") or [], logprobs.get("tokens") or []
    if len(values) < len(token_ids) or len(tokens) < len(token_ids):
        raise ServingMismatch(
            f"{base_url}: the completions API returned {len(values)} log-probabilities for a "
            f"{len(token_ids)}-token prompt with echo: the server does not score prompts"
        )
    echoed = [_token_id(t) for t in tokens[: len(token_ids)]]
    if echoed != list(token_ids):
        first = next(i for i, (a, b) in enumerate(zip(echoed, token_ids, strict=True)) if a != b)
        raise ServingMismatch(
            f"{base_url}: the server echoed other tokens than the prompt's ids (first difference at position {first})"
        )
    return values[: len(token_ids)]


def server_greedy(
    base_url: str, model: str, token_ids: list[int], max_tokens: int, timeout: float = 120.0
) -> list[int]:
    """The server's greedy continuation of ``token_ids``, as token ids."""
    payload = _post(
        base_url.rstrip("/") + "/completions",
        # vLLM takes sampling defaults from the model's generation_config.json: a repetition penalty
        # there would move the argmax, so the request names the neutral one.
        {
            "model": model,
            "prompt": token_ids,
            "max_tokens": max_tokens,
            "temperature": 0,
            "logprobs": 0,
            "repetition_penalty": 1.0,
            "return_tokens_as_token_ids": True,
        },
        timeout,
    )
    tokens = (((payload.get("choices") or [{}])[0].get("logprobs")) or {}).get("tokens")
    if tokens is None:
        raise ServingMismatch(f"{base_url}: the completions API returned no tokens for a greedy answer")
    return [_token_id(t) for t in tokens]


def check_server(base_url: str, model: str, reference: dict, timeout: float = 120.0) -> dict:
    """Compare the server at ``base_url`` (its OpenAI route, e.g. ``.../v1``) with the evaluation's ``reference``.

    Returns a summary: ``mean_abs_logprob_diff``, ``max_abs_logprob_diff``, ``tokens``, ``eval_loss`` and
    ``server_loss`` (mean negative log-probability of the scored tokens, each side), ``greedy_tokens_compared``.

    Raises:
        ServingMismatch: the log-probabilities differ by more than the reference's tolerance, or a greedy answer
            departs from the evaluation's before a near tie; the message gives the numbers.
        OSError: the server cannot be reached.
    """
    tolerance = reference.get("logprob_tolerance", LOGPROB_TOLERANCE)
    diffs, served, evaluated = [], [], []
    for ex in reference["examples"]:
        got = server_logprobs(base_url, model, ex["token_ids"], timeout)
        for p, want in zip(ex["positions"], ex["logprobs"], strict=True):
            served.append(got[p])
            evaluated.append(want)
            diffs.append(abs(got[p] - want))
    if not diffs:
        raise ServingMismatch("the serving reference holds no scored tokens: nothing to compare")
    summary = {
        "tokens": len(diffs),
        "mean_abs_logprob_diff": sum(diffs) / len(diffs),
        "max_abs_logprob_diff": max(diffs),
        "eval_loss": -sum(evaluated) / len(evaluated),
        "server_loss": -sum(served) / len(served),
        "logprob_tolerance": tolerance,
    }
    if summary["mean_abs_logprob_diff"] > tolerance:
        raise ServingMismatch(
            f"the served model's log-probabilities differ from the evaluated model's: mean |difference| "
            f"{summary['mean_abs_logprob_diff']:.4f} nats per token over {len(diffs)} held-out tokens (max "
            f"{summary['max_abs_logprob_diff']:.3f}), tolerance {tolerance}; loss on these tokens: evaluation "
            f"{summary['eval_loss']:.4f} ({reference.get('engine')}, {reference.get('dtype')}), server "
            f"{summary['server_loss']:.4f}. The serving runtime reads the exported model differently (its "
            "transformers version reading the config, dtype, weight names): serve it with the pinned runtime "
            "(manifests/serving)"
        )
    summary["greedy_tokens_compared"] = _check_greedy_ids(base_url, model, reference, timeout)
    return summary


def _check_greedy_ids(base_url: str, model: str, reference: dict, timeout: float) -> int:
    """Each prompt's greedy tokens, step by step while server and evaluation agree (so both saw the same context);
    where they part, the evaluation's own choice must have been a near tie. Returns the tokens found equal."""
    compared = 0
    tie = reference.get("tie_margin", TIE_MARGIN)
    for i, g in enumerate(reference["greedy"]):
        got = server_greedy(base_url, model, g["token_ids"], len(g["answer_ids"]), timeout)
        for step, (want, margin) in enumerate(zip(g["answer_ids"], g["margins"], strict=True)):
            if step < len(got) and got[step] == want:
                compared += 1
                continue
            if margin < tie:
                break  # either token is faithful here, and what follows depends on which
            raise ServingMismatch(
                f"the served model's greedy answer to evaluation prompt {i + 1} differs from the evaluated model's "
                f"at token {step + 1}: server {got[: step + 1]}, evaluation {g['answer_ids'][: step + 1]} "
                f"({g['answer_text']!r}), where the evaluation's choice led the runner-up by {margin:.3f} nats "
                f"(a near tie is under {tie})"
            )
    return compared


def check_greedy_text(base_url: str, model: str, reference: dict, timeout: float = 120.0) -> int:
    """The greedy check for a server without log-probabilities: each prompt's text (the chat template applied) as a
    completion, the answer compared as text up to the first near tie. Returns the prompts compared.

    Raises:
        ServingMismatch: an answer that does not start with the evaluation's decisive part.
    """
    compared = 0
    for i, g in enumerate(reference["greedy"]):
        want = g["decisive_text"]
        if not want:  # the first token was already a near tie
            continue
        # No temperature: `transformers serve` (this check's server) decodes as the model's generation config says,
        # greedy for the exports, and warns that a temperature sent with greedy decoding is not valid.
        payload = _post(
            base_url.rstrip("/") + "/completions",
            {"model": model, "prompt": g["prompt_text"], "max_tokens": len(g["answer_ids"])},
            timeout,
        )
        got = ((payload.get("choices") or [{}])[0].get("text")) or ""
        if not got.startswith(want):
            raise ServingMismatch(
                f"the served model's greedy answer to evaluation prompt {i + 1} differs from the "
                f"evaluated model's: server {got!r}, evaluation {want!r}"
            )
        compared += 1
    return compared
