"""The trainer's config classes: Hugging Face ``TrainingArguments`` (or TRL's ``DPOConfig``) plus the trainer's own
settings; unknown keys are an error.

The fields the trainer adds (method, LoRA, MoE router loss, DPO's beta, ...) are the trainer settings of the
settings model that ``TrainingArguments`` lacks (components/settings/: the model, compute, train and preference
groups), where a preset, ``-p`` and the pipeline set them. They are written out here again, with their types,
defaults and help, as plain dataclass fields: ``HfArgumentParser`` hands a field's metadata to argparse, which knows
nothing of the model's other metadata (bounds, choices, plain), and a reader sees the whole class at once.
Duplication accepted, consistency enforced: a test fails when the two differ in a name, a type, a default or a help
text (TRL keeps its configs beside ``TrainingArguments`` the same way).

A config file's ``stage`` picks the class (``config_file.config_class``): ``SFTConfig`` for ``sft`` and ``cpt``
(continued pretraining is the same causal-LM loss on rows whose every token is a label), ``DPOStageConfig``,
``RMStageConfig`` and ``GRPOStageConfig`` (dpo_arguments.py, rm_arguments.py and grpo_arguments.py, which import this
module) for ``dpo``, ``rm`` and ``grpo``; TRL is imported only for those.
"""

# No ``from __future__ import annotations``: HfArgumentParser reads these fields' types as real classes.
from dataclasses import dataclass, field

from transformers import TrainingArguments

from components.stages import STAGES


@dataclass
class SFTConfig(TrainingArguments):
    """``TrainingArguments`` for supervised fine-tuning (and continued pretraining) on a prepared dataset, plus
    the trainer settings it lacks and what the train step fills in for each run. Trainer pickles it into each checkpoint
    (training_args.bin): it stays importable as ``components.train.trainer.arguments.SFTConfig``."""

    # The model, compute and train groups' fields that TrainingArguments lacks (components/settings/), field by field.
    model_name_or_path: str = field(
        default="Qwen/Qwen3-30B-A3B-Thinking-2507-FP8",
        metadata={
            "help": (
                "Base model: a Hugging Face Hub id, a folder on a mounted volume, or builtin:tiny-qwen3 (built "
                "offline). "
                "An FP8 checkpoint is dequantised once into a bf16 copy that every step loads."
            )
        },
    )
    method: str = field(
        default="full",
        metadata={"help": ("Fine-tuning method: full (every weight, DeepSpeed), lora or qlora (PEFT adapters).")},
    )
    lora_r: int = field(default=16, metadata={"help": "LoRA rank: higher learns more and costs more memory."})
    lora_alpha: int = field(
        default=32,
        metadata={"help": ("LoRA scaling numerator (the adapter's update is scaled by lora_alpha / lora_r).")},
    )
    lora_dropout: float = field(
        default=0.0,
        metadata={
            "help": (
                "LoRA dropout; must stay 0 with adapters on fused expert tensors (Qwen3-MoE: PEFT refuses it there)."
            )
        },
    )
    lora_target_modules: str = field(
        default="",
        metadata={
            "help": (
                "Comma-separated LoRA targets; empty chooses by model type (components/train/trainer/lora.py): every "
                "linear "
                "projection for dense Qwen3, attention plus the fused expert tensors for Qwen3-MoE. A plain name is an "
                "nn.Linear module; a dotted name (experts.gate_up_proj) is a parameter."
            )
        },
    )
    merge_lora: bool = field(
        default=True,
        metadata={
            "help": (
                "lora/qlora: write the base merged with the adapter (bf16) to final/ so vLLM serves a plain model; "
                "the adapter alone always goes to adapter/."
            )
        },
    )
    parallelism: str = field(
        default="deepspeed",
        metadata={
            "help": (
                "How the training job spreads the model over its GPUs: deepspeed (deepspeed_config decides: ZeRO-3 "
                "over every "
                "GPU by default), hsdp (transformers' FSDP2 DistributedConfig: sharded within a node, replicated "
                "across "
                "nodes; deepspeed_config none) or hsdp_ep (hsdp plus expert parallelism within a node, MoE models)."
            )
        },
    )

    liger_kernels: bool = field(
        default=False,
        metadata={
            "help": (
                "Liger's Triton kernels for RMSNorm, SwiGLU and RoPE (GPUs with liger-kernel, as the trainer image ha"
                "s; a logged no-op elsewhere), and its fused linear cross-entropy where the output head is not ZeRO-3"
                "-partitioned and chunked_cross_entropy is off. A MoE model's experts follow "
                "moe_experts_implementation."
            )
        },
    )
    moe_experts_implementation: str = field(
        default="grouped_mm",
        metadata={
            "help": (
                "MoE models: how transformers runs the experts: grouped_mm (its grouped GEMMs, the default), "
                "grouped_mm_compiled (the same function under torch.compile, regionally: the routing, SwiGLU, "
                "weighting and scatter fused by Inductor; compiles once per rank at the first step), batched_mm or "
                "eager (one expert at a time), or liger (Liger's fused MoE Triton kernels, GPUs with liger-kernel). "
                "The weights, checkpoints and export are the same for all."
            )
        },
    )
    attn_implementation: str = field(
        default="auto",
        metadata={
            "help": (
                "How transformers runs attention: auto (flash_attention_2 where flash-attn imports, else "
                "varlen_attn for Qwen3 and Qwen3-MoE on a GPU with PyTorch 2.10+, else sdpa), flash_attention_2, "
                "varlen_attn (PyTorch's own variable-length flash kernel: each packed document alone, no flash-attn "
                "needed; Qwen3-30B-A3B's layers 10% faster than sdpa on an H200), sdpa (packed rows under a "
                "block-causal mask: the whole row's square computed) or eager."
            )
        },
    )
    chunked_cross_entropy: bool = field(
        default=True,
        metadata={
            "help": (
                "cpt and sft stages: compute the loss from the output head 1,024 tokens at a time, never the whole "
                "(tokens x vocabulary) logits (4 x 4096 tokens of Qwen3: 10 GB in fp32): larger micro-batches fit. "
                "Plain PyTorch, under ZeRO-3 and FSDP2 alike."
            )
        },
    )
    max_seq_length: int = field(
        default=4096,
        metadata={
            "help": (
                "Tokens per training row; longer examples are dropped or truncated (over_length). Memory grows with it."
            )
        },
    )
    router_aux_loss_coef: float = field(
        default=0.001,
        metadata={
            "help": ("MoE models: weight of the router load-balancing loss added to the LM loss; 0 turns it off.")
        },
    )
    early_stopping_patience: int = field(
        default=0,
        metadata={
            "help": (
                "cpt and sft stages: stop once the held-out loss per label token has not improved for this many "
                "evaluations (every eval_steps) and keep the best checkpoint as the stage's model; 0 trains to the end."
            )
        },
    )
    early_stopping_min_delta: float = field(
        default=0.0,
        metadata={
            "help": (
                "With early_stopping_patience: how much the held-out loss must fall below the best so far to count as "
                "an improvement."
            )
        },
    )
    # PreferenceSettings (components/settings/), field by field.
    dpo_beta: float = field(
        default=0.1,
        metadata={
            "help": (
                "dpo stage: DPO's beta, how far the tuned model may move from the reference (higher: closer to it)."
            )
        },
    )
    grpo_rewards: dict = field(
        default_factory=lambda: {"answer": 1.0, "format": 0.5},
        metadata={
            "help": (
                "grpo stage: reward source -> weight, summed: answer (the answer matches the prompt's reference), "
                "format "
                "(the reply has grpo_answer_pattern), length (at most grpo_length_budget tokens), model (a reward "
                "model: "
                "grpo_reward_model) and function (grpo_reward_function)."
            )
        },
    )
    grpo_answer_pattern: str = field(
        default=r"(?:Answer:|정답은)\s*\$?(-?\d[\d,]*(?:\.\d+)?)?",
        metadata={
            "help": (
                "grpo stage: the required answer format, a Python regex whose first group is the answer (the answer "
                "and "
                "format rewards); the default reads an 'Answer:' or '정답은' line and the number after it."
            )
        },
    )
    grpo_length_budget: int = field(
        default=256,
        metadata={
            "help": ("grpo stage: the length reward's budget in completion tokens (1 up to it, 0 from twice as many).")
        },
    )
    grpo_reward_model: str = field(
        default="",
        metadata={
            "help": (
                "grpo stage: the model reward's scorer: empty for the run's rm stage, else a Hub id or a folder on a "
                "mounted "
                "volume (a sequence classifier with one label)."
            )
        },
    )
    grpo_reward_function: str = field(
        default="",
        metadata={
            "help": (
                "grpo stage: the function reward, FILE.py:NAME on a mounted volume or package.module:NAME, called as "
                "NAME(prompts, completions, **kwargs) -> one float per completion (dataset columns such as answer "
                "arrive as "
                "keywords)."
            )
        },
    )
    grpo_num_generations: int = field(
        default=8,
        metadata={
            "help": (
                "grpo stage: completions sampled per prompt (the group whose rewards are compared); must divide "
                "per_device_train_batch_size x gradient_accumulation_steps x GPUs."
            )
        },
    )
    grpo_max_completion_length: int = field(
        default=512, metadata={"help": ("grpo stage: length limit of each sampled completion, in tokens.")}
    )
    grpo_beta: float = field(
        default=0.04,
        metadata={
            "help": (
                "grpo stage: weight of the KL penalty to the reference model (the stage's starting point); 0 keeps no "
                "reference model."
            )
        },
    )
    grpo_temperature: float = field(
        default=1.0, metadata={"help": ("grpo stage: sampling temperature of the completions.")}
    )
    grpo_generation_backend: str = field(
        default="transformers",
        metadata={
            "help": (
                "grpo stage: where completions are sampled: transformers (generate inside the training processes) or "
                "vllm-server (a vLLM server from the serving image whose weights the trainer replaces every "
                "grpo_weight_sync_steps optimizer steps; method full)."
            )
        },
    )
    grpo_vllm_server_url: str = field(
        default="",
        metadata={
            "help": (
                "grpo stage, grpo_generation_backend vllm-server: the server's URL (http://host:port), a vLLM server "
                "started with this package's weight-sync engine (docs/rl.md); empty on a cluster: the train step runs "
                "one beside the stage's job (grpo_vllm_image, grpo_vllm_server_gpus) and deletes it after the stage."
            )
        },
    )
    grpo_weight_sync_steps: int = field(
        default=1,
        metadata={
            "help": (
                "grpo stage, grpo_generation_backend vllm-server: push the trainer's weights to the server every this "
                "many optimizer steps (1: on-policy; more: cheaper syncs, completions from older weights)."
            )
        },
    )

    # Not settings: the train step fills these in for each run.
    stage: str = field(
        default="sft",
        metadata={
            "help": f"the training stage this run is, one of {', '.join(STAGES)}: picks the config class and the loss"
        },
    )
    dataset_path: str = field(default="", metadata={"help": "prepare_dataset's output (save_to_disk folder)"})
    model_cache_dir: str = field(default="", metadata={"help": "where Hub downloads and built-in models are cached"})


# The fields SFTConfig adds to TrainingArguments that are not settings (the train step's, per run).
RUN_FIELDS = ("stage", "dataset_path", "model_cache_dir")

# DPOConfig fields the trainer derives from the settings (parse_config fills them in; a config file may not set
# them): one name per knob, as users set it for every stage.
DPO_DERIVED = {"beta": "dpo_beta", "max_length": "max_seq_length", "precompute_ref_log_probs": "method"}
