"""Held-out loss and prompt answers with vLLM, for GPU nodes whose image has vLLM installed.

vLLM scores the held-out tokens with prompt log-probabilities (``prompt_logprobs=0`` returns the
log-probability of each actual prompt token) and answers the prompt set with greedy decoding, on all the
node's GPUs (tensor parallel). Packed rows are split back into their examples first, since vLLM sees one
sequence per request; the numbers are then the same token-weighted mean as the transformers path.
Run it through ``components.evaluate.isolated.run_isolated`` so each model's engine is torn down completely.
"""

from __future__ import annotations

import math

from components.models.packing import IGNORE_INDEX, split_examples


def score_with_vllm(
    model_path: str,
    rows: list[dict],
    prompts: list[list[dict]],
    max_new_tokens: int,
    gpus: int,
    serving_reference: bool = False,
) -> dict:
    """``eval_loss``, ``perplexity``, ``tokens``, ``rows`` and ``answers`` of ``model_path`` with vLLM on ``gpus``
    GPUs; with ``serving_reference`` also ``serving_reference`` (components/models/logprobs.py) from this engine."""
    # Lazy and optional: vLLM exists only in GPU images that install it; evaluation falls back to transformers.
    from vllm import LLM, SamplingParams

    examples = [ex for row in rows for ex in split_examples(row)]
    longest = max(len(ids) for ids, _ in examples)
    llm = LLM(
        model=model_path,
        tensor_parallel_size=gpus,
        dtype="bfloat16",
        max_model_len=max(longest + 1, 4096),
        enable_prefix_caching=False,
    )
    outputs = llm.generate(
        [{"prompt_token_ids": ids} for ids, _ in examples], SamplingParams(max_tokens=1, prompt_logprobs=0)
    )
    nll, tokens = 0.0, 0
    for out, (ids, labels) in zip(outputs, examples, strict=True):
        # prompt_logprobs[0] is None: the first token has no context. Labels are unshifted, like the trainer's.
        for pos in range(1, len(ids)):
            if labels[pos] != IGNORE_INDEX:
                nll -= out.prompt_logprobs[pos][ids[pos]].logprob
                tokens += 1
    answers = [o.outputs[0].text for o in llm.chat(prompts, SamplingParams(temperature=0.0, max_tokens=max_new_tokens))]
    loss = nll / tokens
    result = {
        "eval_loss": loss,
        "perplexity": math.exp(min(loss, 50.0)),
        "tokens": tokens,
        "rows": len(rows),
        "answers": answers,
    }
    if serving_reference:
        from components.models.logprobs import vllm_reference

        result["serving_reference"] = vllm_reference(llm, rows, prompts)
    return result
