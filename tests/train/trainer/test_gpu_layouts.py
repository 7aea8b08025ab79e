"""Issue 20, part 4: what only a GPU machine runs of the layouts: ZeRO++'s quantized communication (qwZ, qgZ) trains
as bf16 ZeRO-3 does, and transformers' expert-parallel dispatch (parallelism hsdp_ep) computes what the experts
compute in place. The dispatch check also runs here on CPU ranks over gloo (slow tier).

    python -m pytest -q -p no:cacheprovider -m gpu tests/train/trainer/test_gpu_layouts.py   # >= 2 CUDA GPUs

Skipped (with the reason) where fewer than 2 CUDA GPUs are present: every check here needs a collective between
GPUs (NCCL refuses two ranks on one GPU), so CI and a one-GPU machine skip it.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from components.train.launcher.local_torchrun import run_torchrun
from tests.helpers.trainer import trainer_config

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "benchmarks"))

import netns_bytes  # noqa: E402

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
needs_gpus = pytest.mark.skipif(GPUS < 2, reason=f"needs 2 or more CUDA GPUs (found {GPUS})")
# The tiny Qwen3-MoE has 4 experts: expert parallelism over 2 or 4 ranks.
RANKS = 4 if GPUS >= 4 else 2

# qwZ quantizes the weights' all-gathers to int8 blocks, qgZ the gradients' reduce-scatter to int4 (ZeRO++ paper,
# arXiv 2306.10209: same convergence as bf16 ZeRO-3). Over QUANT_STEPS steps the mean of the last 5 losses must stay
# within QUANT_LOSS_TOLERANCE (relative) of bf16 ZeRO-3's, while training itself lowers that mean by at least
# MIN_LEARNING (so the tolerance is small against what training moves).
QUANT_STEPS = 30
QUANT_LOSS_TOLERANCE = 0.05
MIN_LEARNING = 0.2
# bf16 rounding: the same batch through the dispatched and the in-place experts (tests/train/trainer/
# test_gpu_speed.py calibrated 0.02 on a loss of ~16 for bf16 paths that compute the same thing).
DISPATCH_LOSS_TOLERANCE = 0.02
CPU_DISPATCH_TOLERANCE = 1e-4  # fp32 on CPU: only the order of the sums differs


@pytest.fixture(scope="module")
def moe(tmp_path_factory):
    root = tmp_path_factory.mktemp("layouts")
    return root, netns_bytes.make_moe(root)


def _gpu_config(root: Path, name: str, model: Path, **over) -> str:
    return trainer_config(
        root,
        name,
        model_name_or_path=str(model),
        use_cpu=False,
        bf16=True,
        ddp_backend="nccl",
        per_device_train_batch_size=1,
        gradient_accumulation_steps=1,
        logging_steps=1,
        save_steps=1000,
        **over,
    )


def _losses(out: Path) -> list[float]:
    """The logged training losses of the run in ``out``, from its last checkpoint's trainer_state.json."""
    states = sorted(out.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name.split("-")[1]))
    state = json.loads(states[-1].read_text())
    return [e["loss"] for e in state["log_history"] if "loss" in e]


@pytest.mark.gpu
@needs_gpus
def test_quantized_weights_and_gradients_train_as_bf16_zero3_does(moe):
    from components.train.config import deepspeed_config_path

    root, model = moe
    shipped = json.loads(Path(deepspeed_config_path("zero3")).read_text())
    quantized = json.loads(json.dumps(shipped))
    quantized["zero_optimization"].update(zero_quantized_weights=True, zero_quantized_gradients=True)
    losses = {}
    for name, config in (("bf16", shipped), ("qwz-qgz", quantized)):
        path = root / f"{name}.json"
        path.write_text(json.dumps(config))
        run_torchrun(
            _gpu_config(root, name, model, deepspeed=str(path), max_steps=QUANT_STEPS, save_steps=QUANT_STEPS),
            nproc_per_node=RANKS,
        )
        losses[name] = _losses(root / name)
    assert len(losses["bf16"]) == len(losses["qwz-qgz"]) == QUANT_STEPS
    tail = {name: sum(v[-5:]) / 5 for name, v in losses.items()}
    assert tail["bf16"] < (1 - MIN_LEARNING) * losses["bf16"][0], losses  # it learned
    assert tail["qwz-qgz"] == pytest.approx(tail["bf16"], rel=QUANT_LOSS_TOLERANCE), losses


# Run by torchrun on every rank: the tiny MoE loaded with expert parallelism over the ranks (hsdp_ep's
# DistributedConfig, built from torchrun's environment by the trainer's own function) and, beside it, a whole copy;
# each rank's own batch through both. The experts must be split (E / ranks local experts) and the losses equal.
DISPATCH = """
import json, os, sys
import torch, torch.distributed as dist
from transformers import AutoModelForCausalLM
from components.train.trainer.parallelism import distributed_config

model_dir, out, device = sys.argv[1], sys.argv[2], sys.argv[3]
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dtype = torch.bfloat16 if device == "cuda" else torch.float32
if device == "cuda":
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
layout = distributed_config("hsdp_ep", bf16=False)
ep = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, distributed_config=layout)
whole = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).to(device)
experts = ep.model.layers[0].mlp.experts.gate_up_proj
local = experts.to_local() if hasattr(experts, "to_local") else experts
g = torch.Generator().manual_seed(rank)
ids = torch.randint(1, ep.config.vocab_size, (2, 64), generator=g).to(device)
loss_ep = ep(input_ids=ids, labels=ids).loss
loss_ep.backward()  # the dispatch's backward (its all-to-alls) runs as well
with torch.no_grad():
    loss_whole = whole(input_ids=ids, labels=ids).loss
result = {"rank": rank, "local_experts": local.shape[0], "experts": ep.config.num_experts,
          "ep_size": layout.ep_size, "loss_ep": loss_ep.item(), "loss_whole": loss_whole.item()}
with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
    json.dump(result, f)
dist.barrier()
dist.destroy_process_group()
"""


def _dispatch(tmp_path: Path, model: Path, device: str, ranks: int) -> list[dict]:
    script = tmp_path / "dispatch.py"
    script.write_text(DISPATCH)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            str(ranks),
            str(script),
            str(model),
            str(tmp_path),
            device,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(ranks)]


def _check_dispatch(results: list[dict], ranks: int, tolerance: float) -> None:
    for r in results:
        assert r["ep_size"] == ranks and r["local_experts"] == r["experts"] // ranks, r  # each rank its share
        assert r["loss_ep"] == pytest.approx(r["loss_whole"], rel=tolerance), r
    assert len({round(r["loss_ep"], 4) for r in results}) == ranks  # each rank scored its own batch


@pytest.mark.slow
def test_expert_parallel_dispatch_computes_what_the_experts_compute_in_place_on_cpu(moe, tmp_path):
    _root, model = moe
    _check_dispatch(_dispatch(tmp_path, model, "cpu", 2), 2, CPU_DISPATCH_TOLERANCE)


@pytest.mark.gpu
@needs_gpus
def test_expert_parallel_dispatch_on_gpus(moe, tmp_path):
    _root, model = moe
    _check_dispatch(_dispatch(tmp_path, model, "cuda", RANKS), RANKS, DISPATCH_LOSS_TOLERANCE)


@pytest.mark.gpu
@needs_gpus
def test_hsdp_ep_trains_as_hsdp_does_on_gpus(moe):
    """The trainer end to end under both FSDP2 layouts (bf16 compute, fp32 master weights): the same last loss and
    eval_loss within bf16 rounding (hsdp writes no checkpoints: the figures come from metrics.json)."""
    root, model = moe
    finals = {}
    for name in ("hsdp", "hsdp_ep"):
        run_torchrun(_gpu_config(root, f"gpu-{name}", model, parallelism=name, max_steps=8), nproc_per_node=RANKS)
        finals[name] = json.loads((root / f"gpu-{name}" / "metrics.json").read_text())
    for key in ("final_train_loss", "eval_loss"):
        assert finals["hsdp_ep"][key] == pytest.approx(finals["hsdp"][key], rel=DISPATCH_LOSS_TOLERANCE), finals
