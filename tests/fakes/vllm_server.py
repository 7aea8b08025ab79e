"""A local stand-in for vLLM's OpenAI server that computes its answers with a real model (transformers, float32).

It answers what the deploy step's checks ask (components/models/logprobs.py) the way vLLM 0.32's
``/v1/completions`` does (``vllm/entrypoints/openai/completion/``, checked against the real engine in
tests/deploy/test_serving_rehearsal.py): ``prompt`` as token ids or text; with ``echo`` the prompt's tokens come
first in ``logprobs`` (``token_logprobs[0]`` is None: the first token has no context); ``logprobs: k`` gives the top
k of each position besides the token itself; ``return_tokens_as_token_ids`` spells tokens ``token_id:<id>``;
``temperature: 0`` is greedy. ``/v1/chat/completions`` answers the smoke test.

``read_config`` stands for the serving runtime's library reading ``config.json``: it gets the JSON and returns the
config the model is built with, e.g. as transformers 4.x reads a transformers-5 export (``as_transformers4_reads``).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

# transformers 4.57's Qwen3Config.__init__ defaults (models/qwen3/configuration_qwen3.py): what it uses for a key
# the file does not have. It never reads ``rope_parameters``.
TRANSFORMERS4_QWEN3_DEFAULTS = {"rope_theta": 10000.0, "rope_scaling": None}


def as_transformers4_reads(config: dict) -> dict:
    """The RoPE settings transformers 4.x takes from ``config`` (its ``rope_theta``/``rope_scaling`` or the defaults),
    put where transformers 5 reads them, so a transformers-5 model computes what a 4.x-based server computes."""
    theta = config.get("rope_theta", TRANSFORMERS4_QWEN3_DEFAULTS["rope_theta"])
    scaling = config.get("rope_scaling", TRANSFORMERS4_QWEN3_DEFAULTS["rope_scaling"]) or {"rope_type": "default"}
    return {**config, "rope_parameters": {**scaling, "rope_theta": theta}}


class VLLMServer:
    """Serves ``model_dir`` under ``served_name`` on a free localhost port; ``url`` is the base (add ``/v1``).
    ``requests`` records ``(path, body)`` of each request."""

    def __init__(self, model_dir: str | Path, served_name: str = "served", read_config=lambda config: config):
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        raw = json.loads(Path(model_dir, "config.json").read_text())
        config = AutoConfig.for_model(**read_config(raw))
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, config=config, dtype=torch.float32).eval()
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.served_name, self.requests = served_name, []
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append((self.path, body))
                if body.get("model") != outer.served_name:
                    status, payload = 404, {"error": {"message": f"The model `{body.get('model')}` does not exist."}}
                elif self.path == "/v1/completions":
                    with outer._lock:
                        status, payload = 200, outer.completion(body)
                elif self.path == "/v1/chat/completions":
                    reply = {"index": 0, "message": {"role": "assistant", "content": "Hi"}}
                    status, payload = 200, {"object": "chat.completion", "model": outer.served_name, "choices": [reply]}
                else:
                    status, payload = 404, {"detail": "Not Found"}
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def _logprobs(self, ids: list[int]):
        import torch

        with torch.no_grad():
            return self.model(input_ids=torch.tensor([ids]), use_cache=False).logits[0].float().log_softmax(-1)

    def completion(self, body: dict) -> dict:
        prompt = body["prompt"]
        if isinstance(prompt, list):
            ids = list(prompt)
        else:
            ids = self.tokenizer(prompt, add_special_tokens=False)["input_ids"]
        top_k = body.get("logprobs")
        as_ids = body.get("return_tokens_as_token_ids", False)

        def spell(token: int) -> str:
            return f"token_id:{token}" if as_ids else self.tokenizer.decode([token])

        def top(row, token: int) -> dict:
            values, indices = row.topk(top_k) if top_k else (row[:0], [])
            best = {spell(int(i)): v.item() for v, i in zip(values, indices, strict=True)}
            return {spell(token): row[token].item(), **best}

        tokens, token_logprobs, top_logprobs = [], [], []
        if body.get("echo"):
            rows = self._logprobs(ids)
            tokens, token_logprobs, top_logprobs = [spell(ids[0])], [None], [None]
            for p in range(1, len(ids)):
                tokens.append(spell(ids[p]))
                token_logprobs.append(rows[p - 1, ids[p]].item())
                top_logprobs.append(top(rows[p - 1], ids[p]))
        seq, answer = list(ids), []
        for _ in range(body.get("max_tokens", 16)):
            row = self._logprobs(seq)[-1]
            token = int(row.argmax())  # every request of the checks is greedy (temperature 0)
            answer.append(token)
            tokens.append(spell(token))
            token_logprobs.append(row[token].item())
            top_logprobs.append(top(row, token))
            seq.append(token)
            if token == self.tokenizer.eos_token_id:
                break
        text = (self.tokenizer.decode(ids) if body.get("echo") else "") + self.tokenizer.decode(
            answer, skip_special_tokens=True
        )
        choice = {"index": 0, "text": text, "finish_reason": "length"}
        if top_k is not None:
            choice["logprobs"] = {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs}
        return {"object": "text_completion", "model": self.served_name, "choices": [choice]}

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
