"""The training step's rules: method and DeepSpeed, length of training, early stopping, trackers; and, last, whether
each stage's job fits in GPU memory."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from components.estimate.memory import StageFit, check_memory_fit, pod_memory_limit_gib
from components.settings import Settings
from components.stages import (
    stage_job,
    stage_resources,
    stage_setting_name,
    stage_trainer,
)
from components.train.config import (
    DEEPSPEED_CONFIGS,
    EARLY_STOPPING_STAGES,
    check_early_stopping,
    check_early_stopping_layout,
    check_method_deepspeed,
)


def check_train_settings(s: Settings) -> list[str | None]:
    """Method with DeepSpeed, length of training, trackers this machine can report to."""
    errors: list[str | None] = []
    if not s.model.model_name_or_path.strip():
        errors.append("model_name_or_path is empty; give a Hub id such as Qwen/Qwen3-30B-A3B or a mounted folder")
    if s.compute.deepspeed_config in DEEPSPEED_CONFIGS:
        # A user's JSON lives on a volume this step may not mount: the trainer applies the rule when it reads it.
        errors.append(check_method_deepspeed(s.model.method, s.compute.deepspeed_config))
        # ZeRO++'s secondary partition must be one node's GPUs: the trainer sets the shipped zero3_hpz's to torchrun's
        # LOCAL_WORLD_SIZE (components/train/trainer/parallelism.py), so no gpus_per_node needs a file of its own.
    errors += parallelism_errors(s)
    errors += early_stopping_errors(s)
    if s.train.num_train_epochs <= 0 and s.train.max_steps <= 0:
        errors.append("num_train_epochs and max_steps are both <= 0; set num_train_epochs > 0 or max_steps > 0")
    for tracker, package in (("mlflow", "mlflow-skinny"), ("wandb", "wandb")):
        # On a cluster the trainer image has both (tests/test_images.py); a laptop has what its user installed.
        local = s.job.train_backend == "local"
        if tracker in s.train.report_to and local and importlib.util.find_spec(tracker) is None:
            errors.append(
                f"report_to names {tracker} and this machine has no {tracker}: pip install {package} (or take "
                f"{tracker} out of report_to)"
            )
    if s.train.max_steps == 0:
        errors.append("max_steps=0 trains nothing; use -1 to run every epoch, or a positive number of steps")
    return errors


def early_stopping_errors(s: Settings) -> list[str]:
    """Early stopping (the cpt and sft stages) under which the held-out loss is never compared: the trainer's rule
    (components/train/config.py's ``check_early_stopping``) with each stage's own settings; one error for stages
    with the same problem. The held-out split itself is the data step's rule (eval_size > 0 or an eval_source)."""
    stages: dict[str, list[str]] = {}
    for stage in s.stages.stages:
        if stage not in EARLY_STOPPING_STAGES:
            continue
        tr = stage_trainer(s, stage)
        problem = check_early_stopping(
            tr.train.early_stopping_patience, tr.train.eval_steps, tr.train.save_steps, tr.train.max_steps
        )
        if not problem and tr.train.early_stopping_patience > 0 and tr.compute.parallelism != "deepspeed":
            from components.models.shape import load_architecture

            architecture = load_architecture(s.model.model_name_or_path)
            problem = check_early_stopping_layout(
                tr.train.early_stopping_patience, tr.compute.parallelism, architecture
            )
        if problem:
            stages.setdefault(problem, []).append(stage)
    ran = [stage for stage in s.stages.stages if stage in EARLY_STOPPING_STAGES]
    return [p if names == ran else f"stage {', '.join(names)}: {p}" for p, names in stages.items()]


def parallelism_errors(s: Settings) -> list[str | None]:
    """``parallelism`` hsdp/hsdp_ep (transformers' FSDP2, components/train/trainer/parallelism.py): with no DeepSpeed
    config, full fine-tuning, the sft/cpt stages, experts that divide over a node (hsdp_ep), and a final export whose
    one layer and one shard fit rank 0's pod (components/estimate/network.py's ``hsdp_export_host_gib``)."""
    if s.compute.parallelism == "deepspeed":
        return []
    name = f"parallelism={s.compute.parallelism}"
    if s.compute.deepspeed_config != "none":
        return [
            f"{name} shards the model with FSDP2 (transformers' DistributedConfig) in place of DeepSpeed: set "
            f"deepspeed_config=none (it is {s.compute.deepspeed_config}), or parallelism=deepspeed"
        ]
    if s.model.method != "full":
        return [
            f"{name} trains method=full only (method is {s.model.method}): use parallelism=deepspeed (deepspeed_config "
            "zero3) for LoRA"
        ]
    other = [stage for stage in s.stages.stages if stage not in ("sft", "cpt")]
    if other:
        return [f"{name} runs the sft and cpt stages only; stages has {other}: use parallelism=deepspeed"]
    from components.estimate.network import hsdp_export_host_gib
    from components.models.shape import load_architecture, model_shape

    config = load_architecture(s.model.model_name_or_path)
    if config is None or s.job.train_backend == "local":
        return []
    if config.get("tie_word_embeddings"):
        return [
            f"{name}: {s.model.model_name_or_path} ties its input and output embeddings (tie_word_embeddings), which "
            "transformers 5.23's FSDP2 trains away from DDP from the second optimizer step on: use "
            "parallelism=deepspeed"
        ]
    shape = model_shape(config)
    for stage in s.stages.stages:  # each stage's GPUs per node: its own (stage_settings) or the run's
        g, g_name = stage_job(s, stage).gpus_per_node, stage_setting_name(s, stage, "gpus_per_node")
        if s.compute.parallelism == "hsdp_ep" and not (shape.is_moe and shape.experts % g == 0):
            return [
                f"{name} spreads a MoE model's experts over a node's GPUs: {s.model.model_name_or_path} has "
                f"{shape.experts} experts and {g_name}={g}; use parallelism=hsdp"
            ]
        host, pod = hsdp_export_host_gib(shape, g), pod_memory_limit_gib(s.job.trainer_memory_limit)
        if host > pod:
            return [
                f"{name}: the final export holds one layer and one 5 GiB shard on rank 0's host, {host:.0f} GiB "
                f"with the pod's processes, over the pod's {pod:g} GiB (trainer_memory_limit="
                f"{s.job.trainer_memory_limit}): use parallelism=deepspeed or raise trainer_memory_limit"
            ]
    return []


def memory_errors(s: Settings) -> list[str]:
    """The stages whose job would not fit in GPU memory (components/estimate/memory.py), each with its own
    settings; none for a local run. Ask on settings known to be valid: an estimate over bad inputs is noise."""
    if s.job.train_backend == "local":
        return []
    errors = []
    for stage in s.stages.stages:
        tr = stage_trainer(s, stage)  # the stage's own (stage_settings) over the run's
        c = stage_job(s, stage)  # the stage's own nodes and GPUs (stage_settings) over the run's
        if tr.compute.deepspeed_config not in DEEPSPEED_CONFIGS and not Path(tr.compute.deepspeed_config).is_file():
            continue  # a user's JSON on a volume this step does not mount: its layout is unknown here
        if (
            stage == "grpo"
            and tr.preference.grpo_generation_backend == "vllm-server"
            and tr.compute.parallelism == "deepspeed"
        ):
            # The generation server the train step runs on GPUs of its own must hold the model too (grpo_plan.py).
            from components.estimate.grpo_plan import grpo_plan
            from components.estimate.training_plan import architecture

            try:
                server_error = grpo_plan(s, architecture(s.model.model_name_or_path)).server_error
            except ValueError:  # an architecture not known without a download: not estimated here
                server_error = None
            if server_error:
                errors.append(f"stage grpo: {server_error}")
        if tr.compute.parallelism != "deepspeed":
            # HSDP shards the model states over one node's GPUs only: the plan's estimate (network.py, hsdp_memory_gib).
            from components.estimate.network import hsdp_memory_gib
            from components.models.shape import load_architecture, model_shape

            config = load_architecture(s.model.model_name_or_path)
            if config is None:
                continue
            g = c.gpus_per_node
            own_gpus = f" ({stage_setting_name(s, stage, 'gpus_per_node')})" if stage_resources(s, stage) else ""
            est = hsdp_memory_gib(
                model_shape(config),
                tr.compute.parallelism == "hsdp_ep",
                g,
                tr.train.max_seq_length,
                tr.train.per_device_train_batch_size,
                every_n_layers=tr.compute.recompute_every_n_layers if tr.compute.activation_checkpointing else 0,
                chunked_loss=tr.compute.chunked_cross_entropy and stage in ("cpt", "sft"),
            )
            if est["total"] > s.plan.gpu_memory_gib:
                errors.append(
                    f"parallelism={tr.compute.parallelism} keeps a copy of the model states per node, sharded over "
                    f"its {g} GPUs{own_gpus}: it needs about "
                    f"{est['total']:.1f} GiB per GPU ({est['model_states']:.1f} "
                    f"model states + {est['activations']:.1f} activations + {est['overhead']:.0f} overhead) "
                    f"but a GPU has {s.plan.gpu_memory_gib:g} GiB; use parallelism=deepspeed (ZeRO-3 "
                    "shards over every GPU) or a smaller per_device_train_batch_size"
                )
            continue
        # DPO and the reward model run chosen and rejected of each pair in one forward pass: twice the rows. GRPO
        # holds a reference model and its generations too (vLLM colocate on a cluster: memory.py).
        grpo = (
            {
                "beta": tr.preference.grpo_beta,
                "completions": tr.train.per_device_train_batch_size * tr.train.gradient_accumulation_steps,
                "sequence_tokens": tr.train.max_seq_length,
                "colocate": True,
                "server": tr.preference.grpo_generation_backend == "vllm-server",
            }
            if stage == "grpo"
            else None
        )
        problem = check_memory_fit(
            s.model.model_name_or_path,
            tr.model.method,
            tr.compute.deepspeed_config,
            c.num_nodes,
            c.gpus_per_node,
            tr.train.max_seq_length,
            tr.train.per_device_train_batch_size * (2 if stage in ("dpo", "rm") else 1),
            gpu_memory_gib=s.plan.gpu_memory_gib,
            lora_r=tr.model.lora_r,
            lora_target_modules=tr.model.lora_target_modules,
            pod_memory_gib=pod_memory_limit_gib(s.job.trainer_memory_limit),
            stage_fit=StageFit(
                grpo=grpo,
                every_n_layers=tr.compute.recompute_every_n_layers if tr.compute.activation_checkpointing else 0,
                chunked_loss=tr.compute.chunked_cross_entropy and stage in ("cpt", "sft"),
                loss_chunkable=stage in ("cpt", "sft"),
                setting_prefix=f"stage_settings.{stage}." if stage_resources(s, stage) else "",
            ),
        )
        if problem and stage_resources(s, stage):  # the stage's own job shape: name the settings that give it
            nodes, gpus = (stage_setting_name(s, stage, name) for name in ("num_nodes", "gpus_per_node"))
            errors.append(f"stage {stage} on {nodes}={c.num_nodes} x {gpus}={c.gpus_per_node} GPUs: {problem}")
        elif problem:
            errors.append(f"stage {stage}: {problem}" if len(s.stages.stages) > 1 else problem)
    return errors
