"""Run by tests/train/trainer/test_hsdp_trainer.py under ``torchrun --nproc_per_node 4``: rank 0's host memory while
the trainer's export writes a Qwen3-MoE sharded over the ranks by transformers' FSDP2 (``parallelism`` hsdp).

Builds a small Qwen3-MoE (about 13 MB of fp32 weights per layer, 12 layers) in ``argv[1]/base``, loads it sharded,
samples rank 0's resident memory every half millisecond while ``export_gathered`` writes it in shards of one layer,
and writes ``argv[1]/report.json``: the peak above the memory before the export, one layer's and the whole model's
bytes, the shard size and the number of shards written.
"""

import json
import os
import sys
import threading
import time
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM
from transformers.distributed import DistributedConfig

from components.train.trainer.export import export_gathered, gather_dtensors

PAGE = os.sysconf("SC_PAGE_SIZE")
# What the allocator and gloo hold beside the buffers the export itself keeps: a gathered tensor lives on every rank
# for a moment (the largest here, one layer's fused experts, is 8 MiB) and glibc returns freed pages in its own time.
SLACK_BYTES = 24 * 2**20


def rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def main(root: Path) -> None:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    config = Qwen3MoeConfig(
        vocab_size=1024,
        hidden_size=256,
        intermediate_size=512,
        moe_intermediate_size=256,
        num_hidden_layers=12,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        num_experts=16,
        num_experts_per_tok=2,
        tie_word_embeddings=False,
    )
    base = root / "base"
    if rank == 0:
        torch.manual_seed(0)
        Qwen3MoeForCausalLM(config).save_pretrained(base)
    dist.barrier()
    model = AutoModelForCausalLM.from_pretrained(
        base, dtype=torch.float32, distributed_config=DistributedConfig(fsdp_size=world)
    )
    layer_bytes = sum(p.numel() * 4 for n, p in model.named_parameters() if n.startswith("model.layers.0."))
    model_bytes = sum(p.numel() * 4 for p in model.parameters())

    peak, before, sampling = [0], rss(), [True]

    def sample():
        while sampling[0]:
            peak[0] = max(peak[0], rss())
            time.sleep(0.0005)

    sampler = threading.Thread(target=sample, daemon=True)
    if rank == 0:
        sampler.start()
    export_gathered(model, str(root / "final"), max_shard_bytes=layer_bytes, gather=gather_dtensors)
    sampling[0] = False
    if rank == 0:
        sampler.join()
        report = {
            "peak_rss_delta_bytes": peak[0] - before,
            "layer_bytes": layer_bytes,
            "model_bytes": model_bytes,
            "max_shard_bytes": layer_bytes,
            "slack_bytes": SLACK_BYTES,
            "shards": len(list((root / "final").glob("model-*.safetensors"))),
        }
        (root / "report.json").write_text(json.dumps(report, indent=2))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
