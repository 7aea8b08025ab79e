"""The stages (components/stages.py): each once, each with its data, and their own training settings valid."""

from __future__ import annotations

from components.settings import Settings, trainer_fields
from components.stages import STAGE_DATA, STAGE_RESOURCES, STAGES, stage_overrides, stage_trainer
from components.train.config import DEEPSPEED_CONFIGS, check_method_deepspeed
from components.validate.rules.fields import field_errors
from components.validate.rules.reward_rules import check_reward_settings, reward_warnings

# A bundled sample of each stage's data, for the message that a stage has none.
SAMPLES = {
    "cpt": "builtin:domain-text",
    "dpo": "builtin:preference",
    "rm": "builtin:preference",
    "grpo": "builtin:arithmetic",
}
# What each stage's data is, for the same message.
WHAT = {
    "cpt": "raw text",
    "dpo": "preference pairs",
    "rm": "preference pairs (prompt, chosen, rejected)",
    "grpo": "prompts (a prompt column and an optional answer column)",
}

# What stage_settings may change: every training setting but the model, which comes from the previous stage, and
# the stage's job shape (num_nodes, gpus_per_node: components/stages.py).
STAGE_SETTABLE = (*(name for name in trainer_fields() if name != "model_name_or_path"), *STAGE_RESOURCES)


def check_stage_settings(s: Settings) -> list[str | None]:
    """Stages listed once each, with their data; ``stage_settings`` naming stages and training settings, each of a
    valid value and, with the stage's method, a DeepSpeed config it can run under."""
    stages = s.stages.stages
    errors: list[str | None] = []
    if not stages:
        return [f'stages is empty; list the stages to run, in order, from {", ".join(STAGES)}, e.g. ["sft"]']
    for stage in dict.fromkeys(stages):
        if stage not in STAGES:
            continue  # the declared choice check names it
        source_setting = STAGE_DATA[stage][0]
        if stages.count(stage) > 1:
            errors.append(f"stages lists {stage!r} {stages.count(stage)} times; each stage runs once")
        elif not s.flat()[source_setting].strip():
            errors.append(
                f"stages includes {stage!r} but {source_setting} is empty; give the stage its data, "
                f"{WHAT.get(stage, 'chat data')} (e.g. {SAMPLES.get(stage, 'builtin:sample')} to try it)"
            )
    values = s.flat()
    for stage, overrides in s.stages.stage_settings.items():
        if stage not in STAGES or not isinstance(overrides, dict):
            errors.append(
                f"stage_settings: {stage!r} must be a stage ({', '.join(STAGES)}) mapping to training "
                'settings, e.g. {"dpo": {"learning_rate": 5e-7}}'
            )
            continue
        unknown = sorted(set(overrides) - set(STAGE_SETTABLE))
        if unknown:
            errors.append(
                f"stage_settings.{stage}: {unknown} are not training settings a stage can change, nor its "
                f"{' or '.join(STAGE_RESOURCES)} (model_name_or_path comes from the previous stage)"
            )
            continue
        errors += [f"stage_settings.{stage}: {e}" for e in field_errors({**values, **overrides}, overrides)]
    errors += check_reward_settings(s) if not errors else []
    if not errors:
        for stage in stages:
            over = stage_overrides(s, stage)
            if not {"method", "deepspeed_config"} & set(over):
                continue  # the run's own method and DeepSpeed config: the training rules name them
            trainer = stage_trainer(s, stage)
            ds = trainer.compute.deepspeed_config
            if ds in DEEPSPEED_CONFIGS and (e := check_method_deepspeed(trainer.model.method, ds)):
                errors.append(f"stage {stage}: {e}")
    return errors


def stage_warnings(s: Settings) -> list[str]:
    """Stage orders and settings that run but are probably not what was meant."""
    stages, warnings = s.stages.stages, []
    if "dpo" in stages and "sft" in stages and stages.index("dpo") < stages.index("sft"):
        warnings.append(
            "stages puts dpo before sft: preference tuning usually refines a fine-tuned model, and sft "
            "after it may undo what it learned"
        )
    if "cpt" in stages and stages.index("cpt") > 0:
        warnings.append("stages puts cpt after another stage: continued pretraining on raw text usually comes first")
    unused = sorted(set(s.stages.stage_settings) - set(stages))
    if unused:
        warnings.append(f"stage_settings has settings for {unused}, which stages does not run")
    return warnings + reward_warnings(s)
