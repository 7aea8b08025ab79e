"""The grpo stage in the plan before a run (components/estimate/grpo_plan.py, ``grpo_plan``) and the reference preset
with ``stages=["sft","grpo"]``: refused in one line naming what to change by --plan, --render and validate_inputs'
checks alike (the whole model gathered for generation does not fit an 80 GiB GPU beside full fine-tuning's states),
accepted with its grpo stage in LoRA, whose plan shows the generation backend, decode rate, step, memory and
GPU-hours."""

import pytest

from components.estimate.grpo_plan import grpo_plan
from components.estimate.network import GB, HBM_BYTES_PER_S
from components.estimate.plan_text import plan_text
from components.estimate.training_plan import architecture
from components.models.shape import model_shape
from pipelines import params as P
from pipelines.run import main

FULL = "qwen3-30b-a3b-full"
GRPO = ['stages=["sft","grpo"]', "grpo_dataset_source=builtin:arithmetic"]
LORA_GRPO = 'stage_settings={"grpo": {"method": "lora"}}'
REFUSAL = (
    "error: invalid settings: stage grpo: full fine-tuning of Qwen/Qwen3-30B-A3B-Thinking-2507-FP8 needs about 107.3 "
    "GiB per GPU (35.5 model states + 6.9 activations + 3 overhead + 61.9 grpo's reference model and generations) but "
    "a GPU has 80 GiB: its generation (transformers' generate: the trainer image has no vllm) gathers the whole model "
    "onto every GPU (56.9 GiB, TRL's ds3_gather_for_generation), which neither more GPUs nor a smaller batch shrink: "
    'train the grpo stage with LoRA (stage_settings={"grpo": {"method": "lora"}}) or use GPUs with more memory '
    "(gpu_memory_gib)"
)


@pytest.mark.parametrize("mode", ["--plan", "--render"])
def test_the_reference_preset_with_grpo_in_full_is_refused_in_one_line(mode, tmp_path, capsys):
    args = [
        "--preset",
        FULL,
        *(a for o in GRPO for a in ("-p", o)),
        mode,
        *([str(tmp_path)] if mode == "--render" else []),
    ]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err == REFUSAL and "\n" not in err
    assert not any(tmp_path.iterdir())  # nothing rendered


def test_the_reference_preset_with_a_lora_grpo_stage_plans_generation_decode_step_memory_and_gpu_hours(capsys):
    assert main(["--preset", FULL, *(a for o in [*GRPO, LORA_GRPO] for a in ("-p", o)), "--plan"]) == 0
    out = capsys.readouterr().out
    part = out[out.index("plan of the grpo stage") :]
    assert part.startswith(
        "plan of the grpo stage: transformers generate under ZeRO-3 in the trainer pods (the trainer image has no "
        "vllm), 2 x 8 GPUs"
    ), part
    for line in (
        "per step: 8 prompts x 8 completions (4 per GPU: micro-batch 1 x 4 micro-steps), up to 512 tokens each",
        "all-gather of 61.1 GB over 16 GPUs, 7.2 GB per GPU over the network: 4.58 s",
        "2.5 GB of non-expert weights + 13.2 GB of the 29.1 experts per MoE layer its 4 tokens route to + 0.2 GB of "
        "KV cache at 2,000 GB/s (HBM, achieved): 7.9 ms per step, 506 tokens/s per GPU, 8,100 for the job",
        "reference: KL to the reference (grpo_beta 0.04): 4 forwards of 1 x 640 tokens per GPU",
        "step:     64.2 s per optimizer step",
        "memory:   78.2 GiB per GPU of 80 with generation's and the reference's share (what validate_inputs "
        "checks): fits",
        "run:      57 optimizer steps (456 prompts x 1 epochs, from builtin:arithmetic's 480 rows less eval_size "
        "0.05): 1.0 h wall, 16.3 GPU-hours",
    ):
        assert line in part, (line, part)


def test_the_decode_figure_is_the_bytes_a_step_reads_over_hbm_bandwidth():
    values = P.resolve(FULL, [], [*GRPO, LORA_GRPO])
    config = architecture(values["model_name_or_path"])
    shape = model_shape(config)
    p = grpo_plan(values, config)
    # 4 tokens per step choosing 8 of 128 experts each: 128 (1 - (120/128)^4) distinct experts per layer.
    experts = 128 * (1 - (120 / 128) ** 4)
    weights = 2 * (shape.total - shape.expert_params - shape.vocab * shape.hidden)
    kv = 2 * 2 * shape.layers * shape.kv_dim * (128 + 256) * 4
    step = (weights + 2 * shape.expert_params * experts / 128 + kv) / HBM_BYTES_PER_S
    assert p.experts_read == pytest.approx(experts) and p.decode_step_s == pytest.approx(step)
    assert p.decode_tokens_per_s_per_gpu == pytest.approx(4 / step)
    # Generation: the gather (a ring all-gather of the bf16 model, its network share at the TCP rate per GPU) and 512
    # decode steps; the run: 456 prompts / 8 per step.
    network = 2 * shape.total * 15 / 16 / 8
    assert p.gather_s == pytest.approx(network / (12.5 * GB / 8), rel=1e-6)
    assert p.generation_s == pytest.approx(p.gather_s + 512 * step)
    assert p.steps == 57 and p.gpu_hours == pytest.approx(p.steps * p.step_s * 16 / 3600)


def test_a_run_without_grpo_has_no_grpo_part_and_another_source_is_planned_per_thousand_prompts():
    assert "grpo stage" not in plan_text(P.resolve(FULL, [], []))
    values = P.resolve(FULL, [], [*GRPO, LORA_GRPO, "grpo_dataset_source=/data/prompts.jsonl"])
    text = plan_text(values)
    assert "optimizer steps per 1,000 prompts x 1 epochs ('/data/prompts.jsonl' is counted by prepare_dataset)" in text


SERVER = ["grpo_generation_backend=vllm-server"]  # no grpo_vllm_server_url: the train step runs the server


def test_the_reference_preset_with_grpo_in_full_on_a_vllm_server_fits_and_render_shows_its_memory(tmp_path, capsys):
    """Issue 30's target: with generation on a vLLM server of its own the trainer gathers no whole policy, so the
    reference preset's full grpo stage fits an 80 GiB GPU; --render says so per stage, --plan counts the server's GPUs
    and the weight pushes."""
    args = ["--preset", FULL, *(a for o in [*GRPO, *SERVER] for a in ("-p", o))]
    assert main([*args, "--render", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert (
        "stage grpo: 2 x 8 GPUs, generation: a vLLM server on 1 GPU(s) of its own, 50.3 GiB per GPU of 80 (the fit "
        "validate_inputs checks): fits" in out
    ), out
    assert "stage sft: 2 x 8 GPUs, 44.2 GiB per GPU of 80" in out
    assert main([*args, "--plan"]) == 0
    part = capsys.readouterr().out
    part = part[part.index("plan of the grpo stage") :]
    assert part.startswith("plan of the grpo stage: a vLLM server on 1 GPU(s) of its own generates"), part
    assert "the trainer pushes its weights every 1 step(s) (grpo_weight_sync_steps)" in part
    assert "(the server's 1 GPU(s) counted)" in part and "gathers the whole policy" not in part


def test_a_generation_server_too_small_for_the_model_is_refused_naming_its_gpus(capsys):
    """On 60 GiB GPUs the server's 56.9 GiB of bf16 weights and a step's KV cache do not fit vLLM's 90% of one GPU:
    refused before any GPU, naming grpo_vllm_server_gpus; over 2 GPUs (tensor parallel) they fit."""
    args = ["--preset", FULL, "-p", "gpu_memory_gib=60", *(a for o in [*GRPO, *SERVER] for a in ("-p", o))]
    assert main([*args, "--plan"]) == 2
    err = capsys.readouterr().err
    assert (
        "over grpo_vllm_server_gpus=1) but vLLM takes 90% of a GPU's 60 GiB: raise grpo_vllm_server_gpus (to 2" in err
    )
    assert "\n" not in err.strip(), err
    assert main([*args, "-p", "grpo_vllm_server_gpus=2", "--plan"]) == 0
    out = capsys.readouterr().out
    assert "per server GPU (bf16 weights and a step's KV cache over grpo_vllm_server_gpus=2): fits" in out


def test_the_memory_fit_counts_the_weight_syncs_send_bucket_the_trainer_uses():
    from components.estimate.memory import WEIGHT_SYNC_BUCKET_BYTES
    from components.train.trainer.vllm_client import DEFAULT_BUCKET_BYTES

    assert WEIGHT_SYNC_BUCKET_BYTES == DEFAULT_BUCKET_BYTES
