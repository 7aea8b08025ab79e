"""The plan's comparison of layouts for the Qwen3-30B-A3B presets, over a range of networks: a Markdown table.

    python benchmarks/plan.py                       # prints the tables of benchmarks/results/plan.md
    python benchmarks/plan.py --preset qwen3-30b-a3b-lora --network 50 3.125

For each preset and each network (``inter_node_gb_per_s``: GB/s per GPU between nodes, the node's network over its
8 GPUs), every layout ``alternatives`` weighs (zero3, zero3_hpz, and for full fine-tuning transformers' FSDP2
layouts hsdp and hsdp_ep) with every split of the preset's rows per optimizer step into micro-batches (same global
batch): seconds per step, tokens/s per GPU and its ratio to the preset as it is, the bottleneck, what crosses the
network per GPU and step, memory per GPU, whether it fits, and whether it runs (``Plan.blocked``: what validate_inputs
refuses besides memory). Everything comes from
``components.estimate.training_plan`` (no GPU, no cluster); the other settings are the preset's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PRESETS = ("qwen3-30b-a3b-full", "qwen3-30b-a3b-lora")
# GB/s per GPU between nodes: 8 x 400 Gb/s per node (DGX H100, the default), 8 x 200 Gb/s, one 400 Gb/s link per
# node, one 200 Gb/s and one 100 Gb/s link per node.
NETWORKS = (50.0, 25.0, 6.25, 3.125, 1.5625)
# Each network is RDMA the pods request (InfiniBand): without a device in the pod NCCL falls back to TCP on the pod
# network and every row would be tcp_node_gb_per_s's (docs/plan.md, "The transport").
RDMA = ("rdma_resource=rdma/ib", "rdma_per_pod=8", "ipc_lock=true")


def table(preset: str, networks: tuple[float, ...]) -> str:
    """The Markdown table for ``preset`` over ``networks``."""
    from components.estimate.network import INTER
    from components.estimate.training_plan import alternatives, architecture
    from pipelines import params as P

    lines = [
        "| network GB/s per GPU | layout | micro-batch x steps | s/step | tokens/s/GPU | vs preset | bottleneck "
        "| network GB/GPU/step | GiB/GPU | fits | runs |",
        "|---:|---|---|---:|---:|---:|---|---:|---:|---|---|",
    ]
    for bw in networks:
        values = P.resolve(preset, overrides=[f"inter_node_gb_per_s={bw}", *RDMA])
        options = alternatives(values, architecture(values["model_name_or_path"]))
        base = options[0][1].tokens_per_s_per_gpu
        order = ("ZeRO-3", "ZeRO++", "HSDP (", "HSDP + EP")
        for over, p in sorted(
            options,
            key=lambda o: (next(i for i, name in enumerate(order) if o[1].layout.startswith(name)), o[1].micro_batch),
        ):
            mark = " (preset)" if not over else ""
            lines.append(
                f"| {bw:g} | {p.layout}{mark} | {p.micro_batch} x {p.accumulation} | {p.step_s:.2f} | "
                f"{p.tokens_per_s_per_gpu:,.0f} | {p.tokens_per_s_per_gpu / base:.2f} | {p.bottleneck} | "
                f"{p.bytes_per_gpu(INTER) / 1e9:.1f} | {p.memory_gib['total']:.1f} | "
                f"{'yes' if p.fits else 'no'} | {'yes' if p.runs else 'no: export' if p.blocked else 'no'} |"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", nargs="+", default=list(PRESETS))
    parser.add_argument(
        "--network",
        nargs="+",
        type=float,
        default=list(NETWORKS),
        help="inter_node_gb_per_s values (GB/s per GPU between nodes)",
    )
    args = parser.parse_args(argv)
    for preset in args.preset:
        print(f"### {preset}\n\n{table(preset, tuple(args.network))}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
