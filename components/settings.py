"""The run's settings: one typed model, grouped by concern, the single source of every setting's name, type,
default, help text, bounds and allowed values. It declares and nothing more: the checks live in the validate step
(components/validate/rules/), which reads these declarations.

The groups (``Settings``' fields, each a dataclass of about 20 settings at most; ``train`` still holds 34):
``train`` and ``preference`` (the dpo and grpo stages' settings: what the trainer reads), ``stages``, ``variants``,
``hpo``, ``data``; where and how the training job runs: ``job`` (backend, nodes,
GPUs, images, placement, the trainer pod's resources), ``scheduling`` (queue, priority, gang scheduling, elastic
restarts, re-runs, deadlines, cleanup), ``network`` (RDMA, NCCL, proxies, the Hub mirror), ``storage`` (the claims,
the Hub token, the object store), ``observability`` (tracking, traces, alerts, Tensorboard, metrics, watchdogs),
``plan`` (the hardware the plan and the memory fit assume); then ``evaluate``, ``deploy`` and ``publish``. A function
takes the groups it reads (``egress_env(s.network)``, ``gpu_watch_for(s.observability, ...)``); a setting's group
shows in the settings table's group column, never in its name (``from_flat``, ``flat()``, presets and ``-p`` use
the flat names).

Everything else derives from it:

- the pipeline's parameters (``pipelines/llm_finetune.py`` builds its signature and docstring from
  ``pipeline_parameters()``): every ``plain`` setting is a typed parameter in the KFP UI; the others go in the one
  ``advanced_settings`` parameter, a JSON object keyed by setting name (``{"lora_r": 32}``);
- ``validate_inputs`` (generated from this model by ``python -m pipelines.compile``): it takes the plain
  parameters and ``advanced_settings``, checks everything (types, bounds and choices as declared here, then the
  rules between settings) and returns the resolved settings, the ``settings`` input of every later step, which
  reads them through this model (``Settings.from_flat(settings).train.method``);
- ``python -m pipelines.run --help``, ``-p NAME=VALUE``, ``--params FILE`` and the presets (any setting by name);
- the trainer: ``build_trainer_config`` writes every ``TrainSettings`` and ``PreferenceSettings`` field into the
  trainer config, and ``SFTConfig`` (components/train/trainer/arguments.py) is ``TrainingArguments`` plus
  ``SFTSettings``' and ``PreferenceSettings``' fields, written out there again and held to these by a test;
- the code that implements a choice reads its values here (``choices("method")``), or a test holds its own tuple
  to them where that code must not depend on this model;
- the settings table in docs/settings.md (``python -m pipelines.compile`` checks it is current).

This module imports nothing but the package version (no ML or Kubernetes library, no other module of the
package), so ``--help`` stays fast and every module may read it.

To add a setting: add a field to its group below (``setting(default, help, ...)``), use it where a step reads
its settings, and run ``python -m pipelines.compile``.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass, field

from components.version import TRAINER_IMAGE

ADVANCED = "advanced_settings"  # the pipeline parameter that carries every non-plain setting by name

T = typing.TypeVar("T")


def setting(
    default: T,
    help: str,
    *,
    plain: bool = True,
    min: float | None = None,
    max: float | None = None,
    above: float | None = None,
    below: float | None = None,
    choices: tuple[str, ...] = (),
    path_suffix: str = "",
) -> T:
    """A settings field: ``default``, one paragraph of ``help`` (its first sentence is the ``--help`` line),
    ``plain`` (a typed parameter of its own in the KFP UI, else inside ``advanced_settings``), the bounds
    ``min <= value <= max``, ``above < value < below``, and the allowed values ``choices`` (of a list setting: of
    each entry). ``path_suffix``: a value outside ``choices`` may also be a path ending so (``deepspeed_config``:
    a shipped config's name, or a user's ``.json`` on a mounted volume, which only the trainer can read)."""
    metadata = {
        "help": help,
        "plain": plain,
        "min": min,
        "max": max,
        "above": above,
        "below": below,
        "choices": tuple(choices),
        "path_suffix": path_suffix,
    }
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata=metadata)
    return field(default=default, metadata=metadata)


@dataclass
class SFTSettings:
    """What the trainer adds to ``TrainingArguments`` (SFTConfig's own fields)."""

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
    max_seq_length: int = setting(
        4096,
        "Tokens per training row; longer examples are dropped or truncated (over_length). Memory grows with it.",
        min=64,
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
    router_aux_loss_coef: float = setting(
        0.001,
        "MoE models: weight of the router load-balancing loss added to the LM loss; 0 turns it off.",
        plain=False,
        min=0,
    )
    parallelism: str = setting(
        "deepspeed",
        "How the training job spreads the model over its GPUs: deepspeed (deepspeed_config decides: "
        "ZeRO-3 over every GPU by default), hsdp (transformers' FSDP2 DistributedConfig: sharded within a "
        "node, replicated across nodes; deepspeed_config none) or hsdp_ep (hsdp plus expert parallelism "
        "within a node, MoE models).",
        plain=False,
        choices=("deepspeed", "hsdp", "hsdp_ep"),
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
        "How transformers runs attention: auto (flash_attention_2 where flash-attn imports, else sdpa), "
        "flash_attention_2, varlen_attn (PyTorch's own variable-length flash kernel, PyTorch 2.10+ on a GPU: each "
        "packed document alone, for images without flash-attn; not yet measured on a GPU), sdpa (packed rows under "
        "a block-causal mask: the whole row's square computed) or eager.",
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


@dataclass
class TrainSettings(SFTSettings):
    """The training step: SFTSettings plus TrainingArguments' own fields, written under the same names (two are
    renamed by build_trainer_config: deepspeed_config -> deepspeed, warmup_ratio -> warmup_steps)."""

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
    """The preference and reinforcement stages (dpo, grpo): SFTConfig's fields like SFTSettings', written into the
    trainer config with the train group's, and settable per stage in ``stage_settings``."""

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


@dataclass
class DataSettings:
    """The data step (prepare_dataset); it also reads the model's tokenizer, max_seq_length and seed."""

    dataset_source: str = setting(
        "builtin:sample",
        "Training data, comma-separated: builtin:sample, files/folders/globs (JSONL, JSON, Parquet, CSV, saved Arrow) "
        "on a mounted volume, pvc://claim/path, hf://... or Hub ids (org/name?config=C&split=S&revision=R).",
    )
    dataset_format: str = setting(
        "auto",
        "Row format: auto (detected from the columns), messages, sharegpt, alpaca, prompt_completion or text "
        "(preference, prompt/chosen/rejected pairs, is the dpo and rm stages' format: those go in "
        "dpo_dataset_source; prompts, a prompt and an optional answer, the grpo stage's: grpo_dataset_source).",
        # The data step's format vocabulary (components/data/formats.py; a test holds it to these).
        choices=("auto", "messages", "sharegpt", "alpaca", "prompt_completion", "text", "preference", "prompts"),
    )
    column_mapping: dict = setting({}, 'The format\'s column name -> your column name, e.g. {"messages": "dialog"}.')
    eval_source: str = setting(
        "", "Take the eval split from this source (same syntax) instead of holding out eval_size; empty: hold out."
    )
    over_length: str = setting(
        "drop",
        "What happens to examples longer than max_seq_length: drop or truncate (the cpt stage's documents are cut "
        "into max_seq_length chunks instead: cpt_chunk_overlap).",
        choices=("drop", "truncate"),
    )
    cpt_chunk_overlap: int = setting(
        0,
        "cpt stage: tokens each max_seq_length chunk of a long document repeats from the end of the chunk before it, "
        "as context only (labels -100: every token is learned once); below max_seq_length.",
        plain=False,
        min=0,
    )
    near_dedup_threshold: float = setting(
        0.0,
        "Drop rows whose estimated Jaccard similarity (MinHash LSH over word 5-grams) to an earlier row is at least "
        "this, in (0, 1], e.g. 0.8; 0: off (exact duplicates are always dropped).",
        plain=False,
        min=0,
        max=1,
    )
    packing: bool = setting(
        True,
        "Pack examples into rows of exactly max_seq_length (position_ids restart per "
        "example); false: one example per row, padded per batch.",
    )
    num_proc: int = setting(
        0, "Tokenizer worker processes in each data step's pod; 0: one per CPU the pod may use (data_cpu).", min=0
    )
    data_shards: int = setting(
        1,
        "Pods that tokenize the sft and cpt data at once (a ParallelFor, each a slice of the input files), before "
        "the data step joins their shards, drops duplicates across them and packs; 1: the data step alone. Shards "
        "are kept by fingerprint: a retry skips the complete ones.",
        min=1,
        max=256,
    )
    data_cpu: str = setting("8", "CPU request of each data step's pod (and each shard's): a Kubernetes quantity.")
    data_memory: str = setting("32Gi", "Memory request of each data step's pod (and each shard's).")
    filter_min_chars: int = setting(
        0, "Drop rows with fewer characters of text than this (counted in the data report); 0: off.", plain=False, min=0
    )
    filter_max_chars: int = setting(0, "Drop rows with more characters of text than this; 0: off.", plain=False, min=0)
    filter_max_duplicate_line_fraction: float = setting(
        0.0,
        "Drop rows whose lines repeat: the share of lines that are copies of an earlier line above this (Gopher's "
        "0.3); 0: off.",
        plain=False,
        min=0,
        max=1,
    )
    filter_max_top_ngram_fraction: float = setting(
        0.0,
        "Drop rows of 50 words or more where the most frequent word 2-gram covers more than this share of the "
        "words' characters (Gopher's 0.2); 0: off.",
        plain=False,
        min=0,
        max=1,
    )
    filter_min_script_fraction: float = setting(
        0.0,
        "Drop rows where the letters of filter_scripts are less than this share of all letters, e.g. 0.5; 0: off.",
        plain=False,
        min=0,
        max=1,
    )
    filter_scripts: list = setting(
        ["hangul", "latin"],
        "The scripts filter_min_script_fraction counts as the corpus's languages: hangul, latin, han, hiragana, "
        "katakana, cyrillic.",
        plain=False,
        choices=("hangul", "latin", "han", "hiragana", "katakana", "cyrillic"),
    )
    eval_size: float = setting(0.05, "Held-out fraction (< 1) or number of conversations (>= 1).")
    max_bad_rows: int = setting(
        0,
        "Broken rows (not JSON, not UTF-8, an unknown role, a malformed turn) each stage's data step skips, counted "
        "in its report, before it fails the run; 0: the first one fails it.",
        plain=False,
        min=0,
    )
    dataset_tokens_estimate: int = setting(
        100_000_000,
        "The plan's size of the training split in tokens, before prepare_dataset has counted it "
        "(python -m pipelines.run --plan STATS_JSON takes the prepared dataset's own count).",
        plain=False,
        min=1,
    )


@dataclass
class JobSettings:
    """The training job's shape, images and pods: backend, nodes, GPUs, placement and resources."""

    train_backend: str = setting(
        "pytorchjob",
        "pytorchjob (Training Operator v1), trainjob (Trainer v2) or local (torchrun on this machine).",
        choices=("pytorchjob", "trainjob", "local"),
    )
    num_nodes: int = setting(2, "Training nodes: pods in the job (1 Master + num_nodes-1 Workers).", min=1)
    gpus_per_node: int = setting(8, "GPUs (torchrun processes) per training node; CPU processes locally.", min=1)
    trainer_image: str = setting(TRAINER_IMAGE, "Image the training job's pods run.")
    # The grpo stage's generation server (grpo_generation_backend vllm-server with no grpo_vllm_server_url): the
    # train step runs it beside the stage's job (components/train/launcher/generation_server.py, docs/rl.md).
    grpo_vllm_image: str = setting(
        "vllm/vllm-openai:v0.32.0",
        "grpo stage, grpo_generation_backend vllm-server with no grpo_vllm_server_url: image of the vLLM server the "
        "train step runs beside the stage's job (vLLM's OpenAI server; the weight-sync engine targets 0.32's RL "
        "routes).",
        plain=False,
    )
    grpo_vllm_server_gpus: int = setting(
        1,
        "grpo stage, grpo_generation_backend vllm-server with no grpo_vllm_server_url: GPUs of the vLLM server's pod "
        "(tensor parallel), on a node of node_selector and tolerations, beside the training job's.",
        plain=False,
        min=1,
    )
    # A private or mirror registry (docs/cluster.md#behind-a-proxy-or-a-mirror-registry): the pods the package creates
    # (training job, Katib trials, InferenceService) pull through these Secrets.
    image_pull_secrets: list = setting(
        [],
        "Secrets (type kubernetes.io/dockerconfigjson) the training, trial and serving pods pull their images "
        "with, for a private or mirror registry; preflight checks each exists with that type. The pipeline's own steps "
        "pull with their service account's (docs/cluster.md).",
        plain=False,
    )
    node_selector: dict = setting(
        {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        "Node labels of the GPU pods (training, evaluation, serving).",
    )
    tolerations: list = setting(
        [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "Tolerations of the GPU pods (a JSON list).",
    )
    affinity: dict = setting({}, "Affinity of the training pods (a JSON object; {} for none).")
    # The trainer pod's resources (docs/cluster.md#the-trainer-pod): validate_inputs holds the memory limit to the
    # host memory a pod holds while it writes a checkpoint (components/train/trainer/export.py).
    trainer_cpu_request: str = setting("16", "CPUs each training pod requests (a Kubernetes quantity).", plain=False)
    trainer_cpu_limit: str = setting(
        "16", "CPU limit of each training pod; equal to the request: Guaranteed QoS, evicted last.", plain=False
    )
    trainer_memory_request: str = setting(
        "128Gi", "Memory each training pod requests (a Kubernetes quantity, e.g. 96Gi).", plain=False
    )
    trainer_memory_limit: str = setting(
        "128Gi",
        "Memory limit of each training pod, /dev/shm's contents included: at least the ~110 GB (103Gi) 8 ranks "
        "hold while they write a checkpoint.",
        plain=False,
    )
    trainer_shm_size: str = setting(
        "64Gi",
        "Size of each training pod's memory-backed /dev/shm (NCCL, data-loader workers): a cap within "
        "trainer_memory_limit, charged only for what is written there.",
        plain=False,
    )
    trainjob_runtime: str = setting(
        "torch-distributed",
        "ClusterTrainingRuntime the TrainJob runs on (trainjob only; preflight checks the cluster has it).",
        plain=False,
    )


@dataclass
class SchedulingSettings:
    """How the training job is queued, scheduled, restarted and cleaned up."""

    job_cleanup: str = setting(
        "keep",
        "Delete the training job when it ends: keep, on-success or always.",
        choices=("keep", "on-success", "always"),
    )
    active_deadline_seconds: int = setting(0, "Fail the training job after this long; 0 for no deadline.", min=0)
    queue_name: str = setting("", "Kueue LocalQueue of the training job; empty for none.")
    priority_class: str = setting("", "PriorityClass of the training pods (pytorchjob only); empty for none.")
    gang_scheduling: bool = setting(
        False,
        "Schedule all training pods together: pytorchjob: Volcano or scheduler-plugins through the job's "
        "schedulingPolicy; trainjob: the ClusterTrainingRuntime's podGroupPolicy does it, and preflight refuses a "
        "runtime without one.",
    )
    min_nodes: int = setting(
        0, "Elastic training down to this many nodes (pytorchjob only); 0 for a fixed size.", min=0
    )
    max_restarts: int = setting(3, "Elastic restarts before the job fails (with min_nodes).", min=0)
    job_restarts: int = setting(
        2,
        "Re-runs of a job that failed for a retriable cause (eviction, preemption, lost node, NCCL); it resumes "
        "from its last complete checkpoint. 0: a failed job fails the step at once.",
        min=0,
    )
    pending_timeout_seconds: int = setting(
        900,
        "Fail the step when a job's pod stays unschedulable this long (at least 60: an autoscaler needs "
        "minutes to add a GPU node).",
        min=60,
    )


@dataclass
class NetworkSettings:
    """The pods' network: RDMA and NCCL for the training job, the proxies and the Hub mirror for every pod the
    package creates (docs/cluster.md#behind-a-proxy-or-a-mirror-registry)."""

    rdma_resource: str = setting(
        "",
        "Extended resource each training pod requests for its RDMA network, from the cluster's device plugin "
        "(rdma/ib, rdma/rdma_shared_device_a, nvidia.com/hostdev, vpc.amazonaws.com/efa); empty: NCCL runs over "
        "TCP on the pod network, and --plan counts tcp_node_gb_per_s between nodes.",
        plain=False,
    )
    rdma_per_pod: int = setting(
        1,
        "How many of rdma_resource each training pod requests (a DGX H100 with SR-IOV: 8, one per NIC).",
        plain=False,
        min=1,
    )
    ipc_lock: bool = setting(
        False,
        "Add the IPC_LOCK capability to the trainer container: InfiniBand/RoCE verbs pin the memory they "
        "register. The Pod Security Standards' baseline and restricted levels forbid it: the namespace must "
        "enforce privileged.",
        plain=False,
    )
    nccl_env: dict = setting(
        {},
        'NCCL variables of the training pods, over NCCL_DEBUG=WARN (e.g. {"NCCL_IB_HCA": "mlx5", '
        '"NCCL_SOCKET_IFNAME": "eth0"}); keys start with NCCL_.',
        plain=False,
    )
    http_proxy: str = setting(
        "", "HTTP_PROXY (and http_proxy) of the training, trial and serving pods, a URL; empty: none.", plain=False
    )
    https_proxy: str = setting(
        "", "HTTPS_PROXY (and https_proxy) of the training, trial and serving pods, a URL; empty: none.", plain=False
    )
    no_proxy: str = setting(
        "",
        "NO_PROXY (and no_proxy) of the training, trial and serving pods: hosts reached directly, comma-separated "
        "(e.g. .svc,.cluster.local,10.0.0.0/8); empty: none.",
        plain=False,
    )
    hf_endpoint: str = setting(
        "",
        "HF_ENDPOINT of the training, trial and serving pods: a Hugging Face Hub mirror's http(s) URL (e.g. "
        "https://hf-mirror.example.com); empty: huggingface.co.",
        plain=False,
    )


@dataclass
class StorageSettings:
    """Where data and models live: the claims, the Hub token and the object store."""

    data_pvc: str = setting("llm-data", "ReadWriteMany claim for datasets and caches (mounted at /mnt/data).")
    model_pvc: str = setting("llm-models", "ReadWriteMany claim for checkpoints and final models (/mnt/models).")
    hf_token_secret: str = setting(
        "hf-token", "Secret with key HF_TOKEN for gated models; referenced, never read (it may be absent)."
    )
    # Object storage (docs/cluster.md#object-storage, components/storage/): off while model_store_uri is empty.
    model_store_uri: str = setting(
        "",
        "Bucket folder each trained model is uploaded to after it is written and verified, s3://bucket/prefix or "
        "gs://bucket/prefix (to <it>/runs/<run id>/<stage>/final/, with a MANIFEST.json of sizes and sha256); "
        "empty: models stay on the claim only.",
        plain=False,
    )
    model_store_endpoint: str = setting(
        "",
        "An S3-compatible server's URL for model_store_uri (MinIO, Ceph RGW; GCS: https://storage.googleapis.com, "
        "the default for gs://); empty: AWS S3.",
        plain=False,
    )
    model_store_secret: str = setting(
        "",
        "Secret with keys AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (GCS: HMAC keys) for model_store_uri, read "
        "through the Kubernetes API by preflight and the train step; empty: the pod's own credentials (an IAM role "
        "for its service account; locally the environment).",
        plain=False,
    )
    upload_checkpoints: bool = setting(
        False,
        "Also upload each complete checkpoint to model_store_uri (<it>/runs/<run id>/<stage>/checkpoint-<step>/) "
        "while the job trains.",
        plain=False,
    )


@dataclass
class ObservabilitySettings:
    """Watching a run: experiment tracking, traces, alerts, Tensorboard, metrics and the watchdogs."""

    tracking_secret: str = setting(
        "llm-tracking",
        "Secret with the experiment tracker's address and key for the training pods (keys "
        "MLFLOW_TRACKING_URI, MLFLOW_TRACKING_TOKEN or _USERNAME/_PASSWORD, WANDB_API_KEY, "
        "WANDB_BASE_URL; each optional): used when report_to names mlflow or wandb.",
        plain=False,
    )
    langfuse_secret: str = setting(
        "llm-langfuse",
        "Secret with keys LANGFUSE_PUBLIC_KEY, LANGFUSE_SECRET_KEY and LANGFUSE_HOST: the trainer "
        "records the run in Langfuse and evaluation and deployment trace each generation (an "
        "optional reference: no Secret, no traces).",
    )
    alert_webhook_secret: str = setting(
        "llm-alerts",
        "Secret whose key ALERT_WEBHOOK_URL is a Slack-compatible incoming webhook: the run's outcome "
        "is posted there when it ends (an optional reference: no Secret, no alert).",
    )
    tensorboard: bool = setting(
        True,
        "Show the run's training curves (pvc://<model_pvc>/runs/<run id>/...): a Kubeflow Tensorboard, opened "
        "from the dashboard; without Kubeflow's Tensorboard controller a Deployment and Service running the "
        "trainer image's tensorboard (the train step logs the kubectl port-forward command), deleted when the run "
        "ends.",
    )
    stall_timeout_seconds: int = setting(
        2700,
        "End the training job as stalled, and re-run it from its last checkpoint (job_restarts), when its trainer "
        "makes no optimizer step for this long; the Prometheus alert LLMTrainingStalled uses the same limit. "
        "2700 (45 min): about 3x the longest step-free stretch of the reference job, a checkpoint save (~366 GB "
        "for Qwen3-30B-A3B at 0.5 GB/s: 12 min) plus a step. 0: not watched.",
        plain=False,
        min=0,
    )
    # Watching a run (components/train/trainer/metrics.py, components/observe/gpu_watch.py, manifests/monitoring/).
    metrics_port: int = setting(
        9410,
        "Port each training pod's local rank 0 serves Prometheus metrics on (/metrics: step, loss, learning "
        "rate, tokens/s, MFU, ETA, checkpoint age); 0 turns them off. 9410: clear of DCGM's 9400.",
        plain=False,
        min=0,
        max=65535,
    )
    prometheus_url: str = setting(
        "",
        "Prometheus the launcher asks for the job's GPU utilisation (DCGM_FI_DEV_GPU_UTIL) while it follows the "
        "job, e.g. http://prometheus-operated.monitoring:9090; empty: not watched. Unreachable: a warning.",
        plain=False,
    )
    gpu_util_threshold: float = setting(
        50.0,
        "The launcher posts a low-utilisation alert (alert_webhook_secret) when the job's average GPU "
        "utilisation stays below this percentage for gpu_util_window_seconds.",
        plain=False,
        min=0,
        max=100,
    )
    gpu_util_window_seconds: int = setting(
        600,
        "How long the job's GPU utilisation must stay below gpu_util_threshold before the launcher alerts.",
        plain=False,
        min=60,
    )


@dataclass
class PlanSettings:
    """The hardware the plan and the memory-fit estimate assume: GPU memory, compute speed and bandwidths."""

    gpu_memory_gib: float = setting(
        80.0,
        "Memory per GPU, for the memory-fit estimate that fails a job that cannot fit before any GPU is "
        "requested (80 for H100 80GB).",
        min=0,
    )
    achieved_tflops_per_gpu: float = setting(
        159.0,
        "The plan's compute speed: FLOP/s one GPU sustains in training, in TFLOP/s, recomputation included, the "
        "optimizer step apart (the plan counts it): 159 is the reference preset's whole model on one H100, "
        "projected from the trainer at 2 and 4 of Qwen3-30B-A3B's layers in one run, 6,097 tokens/s of compute x "
        "26.1 GFLOP per token, the embedding lookup at 0 (2026-11-28; benchmarks/results/plan.md).",
        plain=False,
        above=0,
    )
    intra_node_gb_per_s: float = setting(
        450.0,
        "The plan's bandwidth within a node, GB/s per GPU and direction (450: H100 NVLink 4).",
        plain=False,
        above=0,
    )
    inter_node_gb_per_s: float = setting(
        50.0,
        "The plan's bandwidth between nodes, GB/s per GPU and direction: the node's network over its GPUs "
        "(50: DGX H100, 8 x 400 Gb/s; one 200 Gb/s NIC for 8 GPUs: 3.125).",
        plain=False,
        above=0,
    )
    tcp_node_gb_per_s: float = setting(
        12.5,
        "The plan's bandwidth between nodes when no rdma_resource is requested: GB/s per node and direction "
        "that NCCL's TCP sockets get over the pod network (12.5: one 100 Gb/s NIC at line rate).",
        plain=False,
        above=0,
    )


@dataclass
class EvaluateSettings:
    """The evaluation step and the deploy gate."""

    eval_gpus: int = setting(8, "GPUs of the evaluation pod.", min=0)
    eval_max_samples: int = setting(
        512,
        "Score at most this many held-out rows and examples per lm-eval task (0 = all); bounds the step's time.",
        min=0,
    )
    min_loss_improvement: float = setting(
        0.0, "Relative eval-loss improvement required to deploy (0.0: any improvement).", min=0, below=1
    )
    min_perplexity_improvement: float = setting(
        0.0, "Relative perplexity improvement required to deploy (0.0: no worse)."
    )
    eval_prompts: str = setting(
        "builtin:sample",
        "Prompts answered side by side by base and tuned model: builtin:sample or a JSONL file of "
        '{"messages": [...]} conversations ending with a user turn.',
    )
    max_new_tokens: int = setting(
        512,
        "Length limit of each side-by-side answer (a thinking model needs 512 or more to get past its reasoning).",
        min=1,
    )
    lm_eval_tasks: list = setting(
        [], 'lm-evaluation-harness task names, e.g. ["arc_easy"] (empty: none; needs lm-eval in the image).'
    )
    max_task_regression: float = setting(
        0.01, "Largest drop of an lm-eval task's score (absolute, 0..1) that still passes.", min=0, max=1
    )
    min_reward_improvement: float = setting(
        0.0,
        "grpo runs: gain of the mean reward on held-out prompts over the model before grpo required to deploy "
        "(absolute, in reward units; 0.0: no worse).",
        plain=False,
    )
    # The judged evaluation (components/evaluate/judge.py): a judge model scores both models' answers on a rubric.
    judge_endpoint: str = setting(
        "",
        "Judged evaluation: the judge model's OpenAI-compatible endpoint that scores base and tuned answers to "
        "eval_prompts on judge_rubric: served-base (the run's base model on the local server; local runs), an "
        "InferenceService name in the run's namespace, or an http(s) URL up to /v1; empty: not judged.",
    )
    judge_model: str = setting(
        "",
        "Judged evaluation: the model name sent to judge_endpoint (required for a URL; empty: the base model for "
        "served-base, the service's name for an InferenceService).",
        plain=False,
    )
    judge_api_key_secret: str = setting(
        "llm-judge",
        "Secret whose key JUDGE_API_KEY is judge_endpoint's API key, sent as a bearer token (an optional "
        "reference: no Secret, no key; a local run reads JUDGE_API_KEY from its environment).",
    )
    judge_rubric: str = setting(
        "builtin:default",
        "Judged evaluation: builtin:default (helpfulness, correctness, instruction following, 1-10), a JSON file "
        '({"criteria": {name: description}, "scale": [low, high]}) or a text file with the rubric (scale 1-10).',
        plain=False,
    )
    judge_max_tokens: int = setting(
        256,
        "Judged evaluation: length limit of each judge reply (a JSON verdict needs under 200 tokens; a thinking "
        "judge needs more).",
        plain=False,
        min=1,
    )
    min_judge_score: float = setting(
        0.0,
        "Judged evaluation gate: the lowest mean judge score of the tuned model's answers (in judge_rubric's "
        "units) that still deploys; 0: judged, not gated.",
        plain=False,
        min=0,
    )
    min_judge_win_rate: float = setting(
        0.0,
        "Judged evaluation gate: the lowest share of prompts (0..1, a tie counts half) on which the tuned answer "
        "scores above the base's that still deploys; 0: judged, not gated.",
        plain=False,
        min=0,
        max=1,
    )
    min_judged_fraction: float = setting(
        0.9,
        "Judged evaluation gate (with min_judge_score or min_judge_win_rate): the least share of the tuned model's "
        "answers the judge must have scored (0..1; replies with no readable score and failed requests are not "
        "judged) for its verdict to count; below it the gate fails.",
        plain=False,
        min=0,
        max=1,
    )


@dataclass
class DeploySettings:
    """The deployment step."""

    deploy_backend: str = setting(
        "kserve-vllm",
        "kserve-vllm, kserve-huggingface or local (a local server for a local run).",
        choices=("kserve-vllm", "kserve-huggingface", "local"),
    )
    serving_name: str = setting("qwen3-30b-a3b-sft", "InferenceService name (DNS-1035), also the served model name.")
    serving_gpus: int = setting(4, "GPUs per serving replica (vLLM's tensor-parallel size).", min=0)
    max_model_len: int = setting(8192, "Context length the server accepts (at least max_seq_length).", min=1)
    deployment_mode: str = setting(
        "Standard", "KServe's Standard (Deployment) or Knative (revisions, canary).", choices=("Standard", "Knative")
    )
    canary_traffic_percent: int = setting(
        0, "Knative only: share of traffic for the new revision (0: all at once).", min=0, below=100
    )
    keep_serving: bool = setting(False, "Local runs: leave the model server running after the smoke test.")
    max_ttft_seconds: float = setting(
        0.0,
        "Pre-deploy latency gate: the longest median time to first token (s) of a few concurrent streamed "
        "requests; 0: measured, not gated.",
        min=0,
    )
    min_output_tokens_per_second: float = setting(
        0.0,
        "Pre-deploy latency gate: the fewest output tokens per second the server streams over those requests "
        "together; 0: measured, not gated.",
        min=0,
    )
    serving_service_account: str = setting(
        "",
        "KServe: ServiceAccount of the predictor pods. With model_store_uri set, the InferenceService serves the "
        "uploaded copy (storageUri s3://...): KServe's storage initializer takes the store's keys from this "
        "account's Secret (serving.kserve.io/s3-* annotations, docs/serving.md); empty: served from the claim.",
        plain=False,
    )
    min_replicas: int = setting(1, "KServe: fewest predictor replicas (0: scale to zero, Knative only).", min=0)
    max_replicas: int = setting(
        1, "KServe: most predictor replicas the autoscaler may run (at least min_replicas).", min=1
    )
    scale_metric: str = setting(
        "auto",
        "KServe: the autoscaler's metric: cpu or memory (Standard: an HPA), concurrency or rps (Knative); "
        "auto: KServe's default.",
        plain=False,
        choices=("auto", "cpu", "memory", "concurrency", "rps"),
    )
    scale_target: int = setting(
        0,
        "KServe: the scale_metric's target per replica (cpu/memory: % of requests); 0: KServe's default.",
        plain=False,
        min=0,
    )


@dataclass
class PublishSettings:
    """Where the deployed model is published beside the cluster: Kubeflow Model Registry, the Hugging Face Hub (the
    publish step, components/publish/; the evaluation reaches the run's tracker there too, by report_to)."""

    model_registry_url: str = setting(
        "",
        "Kubeflow Model Registry's REST address, http(s)://host:port (e.g. "
        "http://model-registry-service.kubeflow.svc.cluster.local:8080): the deployed model is registered there "
        "(name, a version per run, its URI, the evaluation's metrics); empty: not registered.",
        plain=False,
    )
    model_registry_model_name: str = setting(
        "", "The registered model's name in the Model Registry; empty: serving_name.", plain=False
    )
    hub_repo_id: str = setting(
        "",
        "Hugging Face Hub repository (namespace/name) the deployed model's files are pushed to, one commit per run; "
        "empty: not pushed.",
        plain=False,
    )
    hub_token_secret: str = setting(
        "hf-token",
        "Secret whose key HF_TOKEN holds a Hub token that may write hub_repo_id (used only when it is set).",
        plain=False,
    )
    hub_private: bool = setting(
        True,
        "Create hub_repo_id private (an existing repository keeps its visibility; never made public).",
        plain=False,
    )
    hub_endpoint: str = setting(
        "",
        "The Hub's address for the push: a team's Hub mirror (HF_ENDPOINT); empty: https://huggingface.co.",
        plain=False,
    )


@dataclass
class Settings:
    """Every setting of a run, by concern."""

    train: TrainSettings = field(default_factory=TrainSettings)
    preference: PreferenceSettings = field(default_factory=PreferenceSettings)
    stages: StageSettings = field(default_factory=StageSettings)
    variants: VariantSettings = field(default_factory=VariantSettings)
    hpo: HpoSettings = field(default_factory=HpoSettings)
    data: DataSettings = field(default_factory=DataSettings)
    job: JobSettings = field(default_factory=JobSettings)
    scheduling: SchedulingSettings = field(default_factory=SchedulingSettings)
    network: NetworkSettings = field(default_factory=NetworkSettings)
    storage: StorageSettings = field(default_factory=StorageSettings)
    observability: ObservabilitySettings = field(default_factory=ObservabilitySettings)
    plan: PlanSettings = field(default_factory=PlanSettings)
    evaluate: EvaluateSettings = field(default_factory=EvaluateSettings)
    deploy: DeploySettings = field(default_factory=DeploySettings)
    publish: PublishSettings = field(default_factory=PublishSettings)

    @classmethod
    def from_flat(cls, values: dict) -> Settings:
        """Settings from a mapping of setting name -> value (missing names keep their defaults; unknown names are
        a ValueError): how every step reads the resolved ``settings`` dict KFP hands it. Values are taken as
        given: the validate step is what checks them (components/validate/rules/)."""
        unknown = sorted(set(values) - set(specs()))
        if unknown:
            raise ValueError(f"unknown settings {unknown}")
        values = whole_numbers(values)
        groups = {}
        for group in dataclasses.fields(cls):
            factory = typing.cast(type, group.default_factory)  # each group is a dataclass
            names = {f.name for f in dataclasses.fields(factory)}
            groups[group.name] = factory(**{k: v for k, v in values.items() if k in names})
        return cls(**groups)

    def flat(self) -> dict:
        """Every setting by name."""
        return {
            name: value
            for group in dataclasses.fields(self)
            for name, value in dataclasses.asdict(getattr(self, group.name)).items()
        }


@dataclass(frozen=True)
class Spec:
    """One setting as the pipeline, the CLI and the checks see it."""

    name: str
    type: type
    default: object
    help: str
    group: str
    plain: bool
    min: float | None
    max: float | None
    above: float | None
    below: float | None
    choices: tuple[str, ...]  # the allowed values (of each entry, for a list setting); () for any
    path_suffix: str  # with choices: a value outside them may also be a path ending so; "" for none


def specs() -> dict[str, Spec]:
    """Every setting, by name, in the model's order (groups as in ``Settings``)."""
    out = {}
    for group in dataclasses.fields(Settings):
        cls = typing.cast(type, group.default_factory)
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            default = f.default_factory() if f.default is dataclasses.MISSING else f.default  # type: ignore[operator]
            m = f.metadata
            out[f.name] = Spec(
                f.name,
                hints[f.name],
                default,
                m["help"],
                group.name,
                m["plain"],
                m["min"],
                m["max"],
                m["above"],
                m["below"],
                m["choices"],
                m["path_suffix"],
            )
    return out


def choices(name: str) -> tuple[str, ...]:
    """The allowed values of setting ``name`` (of each entry, for a list setting): what the code that implements
    the choice offers, declared once here."""
    return specs()[name].choices


def defaults() -> dict:
    """Every setting's default, by name."""
    return Settings().flat()


def split_arguments(values: dict) -> dict:
    """Pipeline arguments for ``values`` (setting name -> value): plain settings as themselves, every other
    setting that differs from its default inside ``advanced_settings``."""
    all_specs = specs()
    args = {name: value for name, value in values.items() if all_specs[name].plain}
    advanced = {
        name: value for name, value in values.items() if not all_specs[name].plain and value != all_specs[name].default
    }
    return {**args, ADVANCED: advanced}


def whole_numbers(values: dict) -> dict:
    """``values`` with integer settings that arrive as whole floats (5.0) turned back into ints.

    KFP carries a dict parameter (``advanced_settings``, the ``settings`` every step reads) as a protobuf Struct,
    whose numbers are all doubles: an int setting comes back as 5.0, also inside ``stage_settings`` (settings by
    name, per stage).
    """
    all_specs = specs()
    out = {}
    for name, value in values.items():
        if name == "stage_settings" and isinstance(value, dict):
            value = {stage: whole_numbers(over) if isinstance(over, dict) else over for stage, over in value.items()}
        elif name in all_specs and all_specs[name].type is int and isinstance(value, float) and value.is_integer():
            value = int(value)
        out[name] = value
    return out


def merge_arguments(arguments: dict) -> dict:
    """The flat settings from pipeline arguments (the inverse of ``split_arguments``); a ValueError for an
    ``advanced_settings`` key that is unknown or that is a plain parameter of its own."""
    all_specs = specs()
    values = {name: value for name, value in arguments.items() if name != ADVANCED}
    for name, value in (arguments.get(ADVANCED) or {}).items():
        if name not in all_specs:
            close = difflib.get_close_matches(name, all_specs, n=1)
            raise ValueError(
                f"{ADVANCED}: unknown setting {name!r}"
                + (f"; did you mean {close[0]!r}?" if close else "; python -m pipelines.run --help lists every setting")
            )
        if all_specs[name].plain:
            raise ValueError(
                f"{ADVANCED}: {name!r} is a pipeline parameter of its own; set it there, not in {ADVANCED}"
            )
        values[name] = value
    return {**defaults(), **whole_numbers(values)}
