"""What the serving tests share: the rehearsal's preconditions and timeout (the real vLLM CPU engine in private
namespaces, tests/fakes/serving_image.py), and real LoRA adapter folders of the tiny model with their serving
references (tests/deploy/test_lora_serving_*.py)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

from components.models.logprobs import transformers_reference

PROMPTS = [[{"role": "user", "content": "Repeat apple twice."}], [{"role": "user", "content": "Name a river."}]]
# The engine's start on two busy cores: a minute or more; CUDA graphs are off on CPU.
READY_TIMEOUT_SECONDS = 900


def rehearsal_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "the serving rehearsal needs root (network and mount namespaces, the bind mount at /mnt/models)"
    for tool in ("unshare", "setpriv"):
        if shutil.which(tool) is None:
            return f"the serving rehearsal needs util-linux `{tool}`"
    probe = subprocess.run(
        ["unshare", "--net", "--mount", "--pid", "--fork", "--uts", "--propagation", "private", "true"],
        capture_output=True,
        text=True,
    )
    if probe.returncode != 0:
        return f"`unshare` cannot create network/mount/PID/UTS namespaces here: {probe.stderr.strip()}"
    return None


def rows(tokenizer) -> list[dict]:
    """Two held-out rows as the data step packs them: the chat template applied, the answer's tokens scored."""
    out = []
    for word in ("apple", "river"):
        conv = [
            {"role": "user", "content": f"Repeat {word} twice."},
            {"role": "assistant", "content": f"{word} {word}. Done."},
        ]
        prompt = tokenizer.apply_chat_template(conv[:1], tokenize=True, add_generation_prompt=True, return_dict=False)
        ids = tokenizer.apply_chat_template(conv, tokenize=True, return_dict=False)
        out.append(
            {
                "input_ids": ids,
                "labels": [-100] * len(prompt) + ids[len(prompt) :],
                "position_ids": list(range(len(ids))),
            }
        )
    return out


def build_adapter(base: str, final: Path, seed: int, rank: int) -> dict:
    """A LoRA adapter of ``base`` in ``final`` as export writes one (merge_lora=false); returns the evaluate step's
    serving reference for it (transformers + PEFT, float32)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    torch.manual_seed(seed)
    config = LoraConfig(
        r=rank,
        lora_alpha=2 * rank,
        target_modules=["q_proj", "v_proj", "gate_proj"],
        init_lora_weights=False,
        task_type="CAUSAL_LM",
    )
    peft_model = get_peft_model(model, config)
    with torch.no_grad():  # a visible change: PEFT's random init without training is small on a tiny model
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.mul_(20)
    peft_model.save_pretrained(final)
    tokenizer.save_pretrained(final)
    (final / "model.json").write_text(
        json.dumps({"base_model": "builtin:tiny-qwen3", "base_model_path": base, "method": "lora", "merged": False})
    )
    peft_model.eval()
    return transformers_reference(peft_model, tokenizer, rows(tokenizer), PROMPTS)


def serving_vllm() -> str:
    """The serving virtualenv's interpreter (vLLM's CPU build), built first when it is absent, as the serving
    rehearsal builds it (tests/fakes/serving_image.py; a clean clone has none until a test builds it). Skips where
    it cannot be built; with ``CI=true`` that is a failure."""
    import pytest

    from components.deploy.local_server import vllm_python
    from tests.fakes import serving_image

    try:
        serving_image.ensure_venv()
        return vllm_python()
    except (FileNotFoundError, RuntimeError, subprocess.SubprocessError) as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"CI must run the LoRA serving tests: {exc}")
        pytest.skip(str(exc))
