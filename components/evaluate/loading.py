"""The model evaluation scores, loaded the same way for the held-out loss, the answers and the preference pairs."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM


def load_causal_lm(model_path: str):
    """The model for scoring: bf16 spread over every GPU (``device_map="auto"``), or float32 on CPU."""
    if torch.cuda.is_available():
        return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.bfloat16, device_map="auto").eval()
    return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
