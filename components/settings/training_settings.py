"""The training settings: the trainer's (model, compute, train, preference, bundled per stage as ``TrainerSettings``),
the stages', the variants' and the search's."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from components.settings.declare import flat_groups, setting


@dataclass
class ModelSettings:
    """The model a run tunes and how: every weight (full) or adapters (lora, qlora), and the adapters' shape."""

    model_name_or_path: str = setting(
        "Qwen/Qwen3-30B-A3B-Thinking-2507-FP8",
        "Base model: a Hugging Face Hub id, a folder on a mounted volume, or builtin:tiny-qwen3 (built offline). "
        "An FP8 checkpoint is dequantised once into a bf16 copy that every step loads.",
    )
    method: str = setting(
        "full",
        "Fine-tuning method: full (every weight, DeepSpeed), lora or qlora (PEFT adapters).",
        choices=("full", "lora", "qlora"),
    )
    lora_r: int = setting(16, "LoRA rank: higher learns more and costs more memory.", plain=False, min=1)
    lora_alpha: int = setting(
        32, "LoRA scaling numerator (the adapter's update is scaled by lora_alpha / lora_r).", plain=False, min=1
    )
    lora_dropout: float = setting(
        0.0,
        "LoRA dropout; must stay 0 with adapters on fused expert tensors (Qwen3-MoE: PEFT refuses it there).",
        plain=False,
        min=0,
        below=1,
    )
    lora_target_modules: str = setting(
        "",
        "Comma-separated LoRA targets; empty chooses by model type (components/train/trainer/lora.py): every "
        "linear projection for dense Qwen3, attention plus the fused expert tensors for Qwen3-MoE. A plain name is "
        "an nn.Linear module; a dotted name (experts.gate_up_proj) is a parameter.",
        plain=False,
    )
    merge_lora: bool = setting(
        True,
        "lora/qlora: write the base merged with the adapter (bf16) to final/ so vLLM serves a plain model; "
        "the adapter alone always goes to adapter/.",
        plain=False,
    )


@dataclass
class ComputeSettings:
    """How the trainer lays out its compute: the parallelism, DeepSpeed's config, activation recomputation and
    the kernels (attention, MoE experts, Liger, the chunked loss). None changes what is learned, only its speed and
    memory (moe_experts_implementation and attn_implementation within numerical tolerance)."""

    parallelism: str = setting(
        "deepspeed",
        "How the training job spreads the model over its GPUs: deepspeed (deepspeed_config decides: "
        "ZeRO-3 over every GPU by default), hsdp (transformers' FSDP2 DistributedConfig: sharded within a "
        "node, replicated across nodes; deepspeed_config none) or hsdp_ep (hsdp plus expert parallelism "
        "within a node, MoE models).",
        plain=False,
        choices=("deepspeed", "hsdp", "hsdp_ep"),
    )
    deepspeed_config: str = setting(
        "zero3",
        "DeepSpeed: zero3, zero3_hpz (ZeRO++: gathers within a node), zero2, zero3_offload (shipped configs), "
        "none (plain DDP) or a .json path on a "
        "mounted volume.",
        # The shipped configs are components/train/deepspeed/<name>.json (a test holds the folder to these names).
        choices=("zero2", "zero3", "zero3_hpz", "zero3_offload", "none"),
        path_suffix=".json",
    )
    activation_checkpointing: bool = setting(
        True, "Recompute activations in the backward pass: less memory for about 30% more compute.", plain=False
    )
    recompute_every_n_layers: int = setting(
        1,
        "With activation_checkpointing: recompute every n-th decoder layer only (transformers' every_n_layers); "
        "the others keep their activations: 1/n of the recomputation for more memory. The memory fit and "
        "--plan count it.",
        plain=False,
        min=1,
    )
    liger_kernels: bool = setting(
        False,
        "Liger's Triton kernels for RMSNorm, SwiGLU and RoPE (GPUs with liger-kernel, as the trainer image ha"
        "s; a logged no-op elsewhere), and its fused linear cross-entropy where the output head is not ZeRO-3"
        "-partitioned and chunked_cross_entropy is off. A MoE model's experts follow "
        "moe_experts_implementation.",
        plain=False,
    )
    moe_experts_implementation: str = setting(
        "grouped_mm",
        "MoE models: how transformers runs the experts: grouped_mm (its grouped GEMMs, the default), "
        "grouped_mm_compiled (the same function under torch.compile, regionally: the routing, SwiGLU, weighting and "
        "scatter fused by Inductor; compiles once per rank at the first step), batched_mm or eager (one expert at "
        "a time), or liger (Liger's fused MoE Triton kernels, GPUs with liger-kernel). The weights, checkpoints "
        "and export are the same for all.",
        plain=False,
        choices=("grouped_mm", "grouped_mm_compiled", "liger", "batched_mm", "eager"),
    )
    attn_implementation: str = setting(
        "auto",
        "How transformers runs attention: auto (flash_attention_2 where flash-attn imports, else varlen_attn for "
        "Qwen3 and Qwen3-MoE on a GPU with PyTorch 2.10+, else sdpa), flash_attention_2, varlen_attn (PyTorch's own "
        "variable-length flash kernel: each packed document alone, no flash-attn needed; Qwen3-30B-A3B's layers "
        "10% faster than sdpa on an H200), sdpa (packed rows under a block-causal mask: the whole row's square "
        "computed) or eager.",
        plain=False,
        choices=("auto", "flash_attention_2", "varlen_attn", "sdpa", "eager"),
    )
    chunked_cross_entropy: bool = setting(
        True,
        "cpt and sft stages: compute the loss from the output head 1,024 tokens at a time, never the whole "
        "(tokens x vocabulary) logits (4 x 4096 tokens of Qwen3: 10 GB in fp32): larger micro-batches fit. "
        "Plain PyTorch, under ZeRO-3 and FSDP2 alike.",
        plain=False,
    )


@dataclass
class TrainSettings:
    """The training loop: rows and batches, the optimizer and its schedule, checkpoints, evaluation and early
    stopping, logging. ``TrainingArguments``' own fields keep their names here (three are renamed by
    build_trainer_config: deepspeed_config -> deepspeed, warmup_ratio -> warmup_steps, recompute_every_n_layers ->
    activation_checkpointing_kwargs)."""

    max_seq_length: int = setting(
        4096,
        "Tokens per training row; longer examples are dropped or truncated (over_length). Memory grows with it.",
        min=64,
    )
    router_aux_loss_coef: float = setting(
        0.001,
        "MoE models: weight of the router load-balancing loss added to the LM loss; 0 turns it off.",
        plain=False,
        min=0,
    )
    per_device_train_batch_size: int = setting(
        4,
        "Rows per GPU per forward pass (the micro-batch). The reference job's 4 x 4096 tokens: each expert's grouped "
        "GEMM sees 4x the rows of a 1-row micro-batch, and ZeRO-3 gathers each layer once per 4 rows.",
        min=1,
    )
    gradient_accumulation_steps: int = setting(
        1, "Micro-batches per optimizer step (global batch = micro-batch x this x GPUs).", min=1
    )
    learning_rate: float = setting(
        5e-5, "Peak learning rate of the schedule (typical: 1e-5..5e-5 full, 1e-4 LoRA).", above=0, below=1
    )
    lr_scheduler_type: str = setting(
        "cosine",
        "Learning-rate schedule after warm-up (transformers' SchedulerType): cosine, linear, "
        "cosine_with_restarts, polynomial, constant, constant_with_warmup or inverse_sqrt.",
        plain=False,
        # The schedules the Trainer builds from these settings alone: the others need lr_scheduler_kwargs or an
        # eval strategy, which are not settings (a test holds these to transformers' SchedulerType).
        choices=(
            "cosine",
            "linear",
            "cosine_with_restarts",
            "polynomial",
            "constant",
            "constant_with_warmup",
            "inverse_sqrt",
        ),
    )
    num_train_epochs: float = setting(2.0, "Passes over the training split.", min=0)
    max_steps: int = setting(-1, "Stop after this many optimizer steps; -1 runs every epoch.", min=-1)
    warmup_ratio: float = setting(0.03, "Fraction of the steps spent in linear warm-up.", min=0, below=1)
    weight_decay: float = setting(0.0, "AdamW weight decay.", plain=False, min=0)
    max_grad_norm: float = setting(1.0, "Gradient clipping norm (0 turns clipping off).", plain=False, min=0)
    seed: int = setting(42, "Seed of the train/eval split and of training.")
    save_steps: int = setting(
        200, "Checkpoint every this many optimizer steps (a restarted job resumes from the last complete one).", min=1
    )
    save_total_limit: int = setting(2, "Complete checkpoints kept on the model volume.", min=1)
    eval_steps: int = setting(
        0,
        "With early_stopping_patience: evaluate on the held-out split every this many optimizer steps (0: every "
        "save_steps; save_steps must be a multiple). Each new best is checkpointed, so that it can be kept.",
        plain=False,
        min=0,
    )
    early_stopping_patience: int = setting(
        0,
        "cpt and sft stages: stop once the held-out loss per label token has not improved for this many "
        "evaluations (every eval_steps) and keep the best checkpoint as the stage's model; 0 trains to the end.",
        plain=False,
        min=0,
    )
    early_stopping_min_delta: float = setting(
        0.0,
        "With early_stopping_patience: how much the held-out loss must fall below the best so far to count as "
        "an improvement.",
        plain=False,
        min=0,
    )
    logging_steps: int = setting(
        10, "Optimizer steps between progress lines and TensorBoard points.", plain=False, min=1
    )
    report_to: list = setting(
        ["tensorboard"],
        "Where the trainer reports its metrics: tensorboard (the run's Tensorboard reads it), mlflow, "
        "wandb; on a cluster mlflow and wandb take their address and key from tracking_secret, "
        "locally mlflow writes to <workspace>/mlruns.",
        plain=False,
        choices=("tensorboard", "mlflow", "wandb"),
    )  # transformers' integrations the images install


@dataclass
class PreferenceSettings:
    """The preference and reinforcement stages (dpo, rm, grpo): SFTConfig's fields like the other trainer groups',
    written into the trainer config with theirs, and settable per stage in ``stage_settings``."""

    dpo_beta: float = setting(
        0.1,
        "dpo stage: DPO's beta, how far the tuned model may move from the reference (higher: closer to it).",
        plain=False,
        above=0,
    )
    # The grpo stage (components/train/trainer/grpo.py, rewards.py).
    grpo_rewards: dict = setting(
        {"answer": 1.0, "format": 0.5},
        "grpo stage: reward source -> weight, summed: answer (the answer matches the prompt's reference), format (the "
        "reply has grpo_answer_pattern), length (at most grpo_length_budget tokens), model (a reward model: "
        "grpo_reward_model) and function (grpo_reward_function).",
        plain=False,
    )
    grpo_answer_pattern: str = setting(
        r"(?:Answer:|정답은)\s*\$?(-?\d[\d,]*(?:\.\d+)?)?",
        "grpo stage: the required answer format, a Python regex whose first group is the answer (the answer and "
        "format rewards); the default reads an 'Answer:' or '정답은' line and the number after it.",
        plain=False,
    )
    grpo_length_budget: int = setting(
        256,
        "grpo stage: the length reward's budget in completion tokens (1 up to it, 0 from twice as many).",
        plain=False,
        min=1,
    )
    grpo_reward_model: str = setting(
        "",
        "grpo stage: the model reward's scorer: empty for the run's rm stage, else a Hub id or a folder on a "
        "mounted volume (a sequence classifier with one label).",
        plain=False,
    )
    grpo_reward_function: str = setting(
        "",
        "grpo stage: the function reward, FILE.py:NAME on a mounted volume or package.module:NAME, called as "
        "NAME(prompts, completions, **kwargs) -> one float per completion (dataset columns such as answer arrive "
        "as keywords).",
        plain=False,
    )
    grpo_num_generations: int = setting(
        8,
        "grpo stage: completions sampled per prompt (the group whose rewards are compared); must divide "
        "per_device_train_batch_size x gradient_accumulation_steps x GPUs.",
        plain=False,
        min=2,
    )
    grpo_max_completion_length: int = setting(
        512, "grpo stage: length limit of each sampled completion, in tokens.", plain=False, min=1
    )
    grpo_beta: float = setting(
        0.04,
        "grpo stage: weight of the KL penalty to the reference model (the stage's starting point); 0 keeps no "
        "reference model.",
        plain=False,
        min=0,
    )
    grpo_temperature: float = setting(1.0, "grpo stage: sampling temperature of the completions.", plain=False, above=0)
    grpo_generation_backend: str = setting(
        "transformers",
        "grpo stage: where completions are sampled: transformers (generate inside the training processes) or "
        "vllm-server (a vLLM server from the serving image whose weights the trainer replaces every "
        "grpo_weight_sync_steps optimizer steps; method full).",
        plain=False,
        choices=("transformers", "vllm-server"),
    )
    grpo_vllm_server_url: str = setting(
        "",
        "grpo stage, grpo_generation_backend vllm-server: the server's URL (http://host:port), a vLLM server "
        "started with this package's weight-sync engine (docs/rl.md); empty on a cluster: the train step runs one "
        "beside the stage's job (grpo_vllm_image, grpo_vllm_server_gpus) and deletes it after the stage.",
        plain=False,
    )
    grpo_weight_sync_steps: int = setting(
        1,
        "grpo stage, grpo_generation_backend vllm-server: push the trainer's weights to the server every this many "
        "optimizer steps (1: on-policy; more: cheaper syncs, completions from older weights).",
        plain=False,
        min=1,
    )


@dataclass(frozen=True)
class TrainerSettings:
    """What one stage's trainer runs with: the model, compute, train and preference groups, with the stage's own
    settings and a search's choices over the run's (components/stages.py: ``stage_trainer``). build_trainer_config
    writes every field of the four into the trainer config."""

    model: ModelSettings
    compute: ComputeSettings
    train: TrainSettings
    preference: PreferenceSettings

    def flat(self) -> dict:
        """Every setting of the four groups, by name."""
        return flat_groups(self)

    def replace(self, **values) -> TrainerSettings:
        """A copy with ``values`` (setting name -> value) in whichever group holds each; a ValueError names a
        setting none of them holds."""
        unknown = sorted(set(values) - set(trainer_fields()))
        if unknown:
            raise ValueError(f"not trainer settings: {unknown}")
        groups = {}
        for group in dataclasses.fields(self):
            current = getattr(self, group.name)
            own = {f.name for f in dataclasses.fields(current)}
            groups[group.name] = dataclasses.replace(current, **{k: v for k, v in values.items() if k in own})
        return TrainerSettings(**groups)


TRAINER_GROUPS = (ModelSettings, ComputeSettings, TrainSettings, PreferenceSettings)


def trainer_fields() -> tuple[str, ...]:
    """The settings the trainer config is written from, in the model's order: the four groups' fields."""
    return tuple(f.name for group in TRAINER_GROUPS for f in dataclasses.fields(group))


@dataclass
class StageSettings:
    """Which training stages run, in which order, and what each one reads (components/stages.py)."""

    stages: list = setting(
        ["sft"],
        "Training stages, in order, from cpt (continued pretraining on raw text), sft (supervised "
        "fine-tuning), dpo (preference tuning), rm (a reward model on dpo_dataset_source's pairs) and grpo "
        "(reinforcement learning on grpo_dataset_source's prompts); each trains from the previous stage's "
        "final model (grpo after rm: from the model before rm).",
        choices=("cpt", "sft", "dpo", "rm", "grpo"),
    )
    cpt_dataset_source: str = setting(
        "",
        "cpt stage: raw domain text (a text column), same syntax as dataset_source; builtin:domain-text is a "
        "bundled sample.",
    )
    dpo_dataset_source: str = setting(
        "",
        "dpo and rm stages: preference pairs (prompt, chosen, rejected), same syntax as dataset_source; "
        "builtin:preference is a bundled sample.",
    )
    grpo_dataset_source: str = setting(
        "",
        "grpo stage: prompts (a prompt column, text or turns) with an optional reference answer column (answer), "
        "same syntax as dataset_source; builtin:arithmetic is a bundled sample.",
    )
    grpo_column_mapping: dict = setting(
        {}, 'grpo stage: prompt or answer -> your column name, e.g. {"prompt": "question"}.', plain=False
    )
    stage_settings: dict = setting(
        {},
        'Training settings of one stage over the run\'s, e.g. {"dpo": {"learning_rate": 5e-7, "method": '
        '"lora"}}, and its job\'s num_nodes and gpus_per_node, e.g. {"cpt": {"num_nodes": 1, "gpus_per_node": 4}}; '
        "dpo defaults to learning_rate 1e-6 and 1 epoch.",
        plain=False,
    )


@dataclass
class VariantSettings:
    """Several models in one run (components/variants.py): each variant is the run's settings with its overrides,
    trained through the whole stage chain in its own folders and jobs, and evaluation compares them all."""

    variants: list = setting(
        [],
        'Setting overrides, one JSON object per variant, e.g. [{"learning_rate": 1e-5}, {"learning_rate": '
        '5e-5, "name": "hi-lr"}]: each trains the stage chain in its own folders and jobs ([]: one model). '
        "An optional \"name\" (lowercase letters, digits, '-') names its folders, jobs and served model.",
    )
    variants_parallel: int = setting(
        1,
        "Variants trained at once (a loop limit fixed when the pipeline is compiled: python -m pipelines.run "
        "compiles with the run's value, compiled/ holds 1); together they must fit the cluster's GPUs.",
        plain=False,
        min=1,
    )
    deploy_variants: str = setting(
        "best",
        "With variants, what is served: best (the lowest held-out loss of those that passed their gate) or "
        "all (every variant that passed, each as <serving_name>-<variant>; LoRA adapters of one base share "
        "one vLLM server, components/deploy/serving_plan.py).",
        plain=False,
        choices=("best", "all"),
    )


@dataclass
class HpoSettings:
    """Hyper-parameter search before the sft stage: Katib on a cluster, Optuna locally (components/hpo/)."""

    hpo_trials: int = setting(
        0,
        "Hyper-parameter search: short training trials before the sft stage, which then trains with the best "
        "trial's settings (Katib Experiment on a cluster, Optuna locally); 0 turns it off.",
        min=0,
    )
    hpo_search_space: dict = setting(
        {"learning_rate": {"min": 1e-5, "max": 1e-4, "scale": "log"}},
        'What the trials vary: setting -> {"min", "max", "scale": "log"} or {"values": [...]}, e.g. '
        '{"lora_r": {"values": [8, 16, 32]}}.',
        plain=False,
    )
    hpo_parallel_trials: int = setting(
        1, "Trials at once; each holds the whole training job's GPUs.", plain=False, min=1
    )
    hpo_max_failed_trials: int = setting(1, "Failed trials that fail the search.", plain=False, min=0)
    hpo_algorithm: str = setting(
        "tpe",
        "Katib's search algorithm: random, tpe, multivariate-tpe, bayesianoptimization, grid, cmaes or sobol.",
        plain=False,
        choices=("random", "tpe", "multivariate-tpe", "bayesianoptimization", "grid", "cmaes", "sobol"),
    )
    hpo_trial_steps: int = setting(
        50, "Optimizer steps per trial (objective: eval_loss, minimised).", plain=False, min=1
    )
