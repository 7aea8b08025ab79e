"""The rm and grpo stages' bad input, refused by validate_inputs before any GPU: one error naming the setting and the
fix for each (issue 21's list: no reward source for grpo, an unknown built-in reward, a reward function that does not
import or has the wrong signature, rm without preference pairs, grpo without prompts)."""

import pytest

from components.settings import defaults
from components.validate.rules import check, warnings

# The reference job's grpo stage with LoRA: in full, generation's gathered model does not fit an 80 GiB GPU
# (test_the_memory_fit_counts_grpos_reference_model_and_generations).
LORA_GRPO = {"stage_settings": {"grpo": {"method": "lora"}}}
GRPO = {"stages": ["sft", "grpo"], "grpo_dataset_source": "builtin:arithmetic", **LORA_GRPO}


def _errors(**over) -> list[str]:
    return check({**defaults(), **over})


def test_the_bundled_grpo_and_rm_runs_are_valid():
    assert _errors(**GRPO) == []
    assert (
        _errors(
            stages=["sft", "rm", "grpo"],
            grpo_dataset_source="builtin:arithmetic",
            dpo_dataset_source="builtin:preference",
            grpo_rewards={"answer": 1.0, "model": 0.5},
            **LORA_GRPO,
        )
        == []
    )


def test_grpo_without_prompts_names_its_source():
    errors = _errors(stages=["sft", "grpo"])
    assert errors == [
        "stages includes 'grpo' but grpo_dataset_source is empty; give the stage its data, prompts (a "
        "prompt column and an optional answer column) (e.g. builtin:arithmetic to try it)"
    ]


def test_rm_without_preference_pairs_names_the_pairs_setting():
    errors = _errors(stages=["sft", "rm", "grpo"], grpo_dataset_source="builtin:arithmetic")
    assert errors == [
        "stages includes 'rm' but dpo_dataset_source is empty; give the stage its data, preference pairs "
        "(prompt, chosen, rejected) (e.g. builtin:preference to try it)"
    ]


@pytest.mark.parametrize("rewards", [{}, {"answer": 0, "format": 0.0}])
def test_grpo_without_a_reward_source_is_refused(rewards):
    errors = _errors(**GRPO, grpo_rewards=rewards)
    assert len(errors) == 1 and errors[0].startswith(
        "stages includes 'grpo' but grpo_rewards gives no reward a non-zero weight; set at least one, e.g. "
    ), errors


def test_an_unknown_builtin_reward_is_named_with_the_closest_one():
    errors = _errors(**GRPO, grpo_rewards={"anwser": 1.0})
    assert errors == [
        "grpo_rewards: 'anwser' is not a reward; use answer, format, length (built-in), model (a reward "
        "model) or function (grpo_reward_function); did you mean 'answer'?"
    ]


def test_a_weight_that_is_not_a_number_is_named():
    assert _errors(**GRPO, grpo_rewards={"answer": "high"}) == [
        "grpo_rewards.answer must be a number (the reward's weight), got 'high'"
    ]


def test_the_model_reward_needs_an_rm_stage_before_grpo_or_a_reward_model():
    errors = _errors(**GRPO, grpo_rewards={"model": 1.0})
    assert len(errors) == 1 and errors[0].startswith(
        'grpo_rewards uses model but there is no reward model: add "rm" before "grpo" in stages'
    ), errors
    assert _errors(**GRPO, grpo_rewards={"model": 1.0}, grpo_reward_model="my-org/rm") == []


def test_the_function_reward_needs_a_function():
    errors = _errors(**GRPO, grpo_rewards={"function": 1.0})
    assert errors == [
        "grpo_rewards uses function but grpo_reward_function is empty; set it to FILE.py:NAME (a file on "
        "a mounted volume) or package.module:NAME"
    ]


def test_a_reward_function_that_does_not_import_is_named_with_its_error(tmp_path):
    broken = tmp_path / "broken.py"
    broken.write_text("import not_a_module_anywhere\n\ndef reward(prompts, completions, **kwargs):\n    return []\n")
    errors = _errors(**GRPO, grpo_rewards={"function": 1.0}, grpo_reward_function=f"{broken}:reward")
    assert errors == [
        f"grpo_reward_function '{broken}:reward': importing {broken} failed: ModuleNotFoundError: No "
        "module named 'not_a_module_anywhere'"
    ]
    missing = tmp_path / "missing.py"
    errors = _errors(**GRPO, grpo_rewards={"function": 1.0}, grpo_reward_function=f"{missing}:reward")
    assert errors == [
        f"grpo_reward_function '{missing}:reward': {missing} is not a file; put the file on a mounted "
        "volume (e.g. /mnt/data/rewards.py) and give its path"
    ]


def test_a_reward_function_the_file_lacks_lists_what_it_has(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text("def score(prompts, completions, **kwargs):\n    return [0.0] * len(completions)\n")
    errors = _errors(**GRPO, grpo_rewards={"function": 1.0}, grpo_reward_function=f"{path}:reward")
    assert errors == [
        f"grpo_reward_function '{path}:reward': {path} has no function 'reward' (its functions: ['score'])"
    ]


@pytest.mark.parametrize(
    "source, why",
    [
        ("def reward(text):\n    return []\n", "does not take completions and requires ['text']"),
        ("def reward(prompts, completions, /):\n    return []\n", "takes ['prompts', 'completions'] by position only"),
        ("def reward(completions, scale, **kwargs):\n    return []\n", "requires ['scale']"),
    ],
)
def test_a_reward_function_with_the_wrong_signature_is_refused(tmp_path, source, why):
    path = tmp_path / "mine.py"
    path.write_text(source)
    errors = _errors(**GRPO, grpo_rewards={"function": 1.0}, grpo_reward_function=f"{path}:reward")
    assert (
        len(errors) == 1
        and errors[0].startswith(f"grpo_reward_function '{path}:reward': reward(")
        and why in errors[0]
        and errors[0].endswith(
            "define it as def NAME(prompts, completions, **kwargs) -> list[float] (one "
            "reward per completion; dataset columns such as answer arrive as keywords)"
        )
    )


def test_a_good_reward_function_passes(tmp_path):
    path = tmp_path / "mine.py"
    path.write_text("def reward(completions, answer, **kwargs):\n    return [0.0] * len(completions)\n")
    assert _errors(**GRPO, grpo_rewards={"function": 1.0}, grpo_reward_function=f"{path}:reward") == []
    # a module on the path works too
    assert (
        _errors(
            **GRPO,
            grpo_rewards={"function": 1.0},
            grpo_reward_function="components.rewards:completion_text",
        )
        != []
    )  # no completions kw


def test_a_bad_answer_pattern_is_refused():
    errors = _errors(**GRPO, grpo_answer_pattern="Answer: (\\d+")
    assert len(errors) == 1 and errors[0].startswith(
        "grpo_answer_pattern 'Answer: (\\\\d+' is not a valid regular expression"
    ), errors


def test_groups_of_completions_must_fit_the_batch():
    # The reference job: 1 x 4 x 16 GPUs = 64 completions per step; 48 does not divide it.
    errors = _errors(**GRPO, grpo_num_generations=48)
    assert errors == [
        "grpo_num_generations=48 must divide the completions of one optimizer step, "
        "per_device_train_batch_size x gradient_accumulation_steps x GPUs = 1 x 4 x 16 = 64; change "
        "grpo_num_generations or the batch (stage_settings.grpo can set the grpo stage's own)"
    ]
    grpo = {"method": "lora", "gradient_accumulation_steps": 3}
    assert _errors(**{**GRPO, "grpo_num_generations": 48, "stage_settings": {"grpo": grpo}}) == []


def test_an_unknown_stage_setting_for_grpo_is_refused_like_any_other():
    errors = _errors(**{**GRPO, "stage_settings": {"grpo": {"method": "lora", "grpo_beta": -1.0}}})
    assert any(e.startswith("stage_settings.grpo: grpo_beta=-1.0 must be >= 0") for e in errors), errors


def test_warnings_for_an_unused_reward_model_and_function(tmp_path):
    values = {**defaults(), "stages": ["sft", "rm"], "dpo_dataset_source": "builtin:preference"}
    assert check(values) == []
    assert any("stages runs rm but no grpo after it" in w for w in warnings(values))
    values = {**defaults(), **GRPO, "grpo_reward_function": "x.py:f"}
    assert any("grpo_reward_function is set but grpo_rewards gives function no weight" in w for w in warnings(values))


def test_the_reward_model_trains_in_full():
    values = dict(
        stages=["sft", "rm", "grpo"],
        grpo_dataset_source="builtin:arithmetic",
        dpo_dataset_source="builtin:preference",
        grpo_rewards={"model": 1.0},
    )
    assert _errors(**values, method="lora") == []  # the rm stage's own default is full
    assert _errors(**values, stage_settings={"rm": {"method": "lora"}}) == [
        "stage rm: method 'lora': the reward model trains its new head and the whole model (method full); remove "
        "method from stage_settings.rm"
    ]


def test_prompt_rows_are_the_grpo_stages_data_not_sfts():
    assert _errors(dataset_format="prompts") == [
        "dataset_format=prompts: prompts with reference answers are the grpo stage's data; put them in "
        'grpo_dataset_source and add "grpo" to stages (dataset_source is the sft stage\'s chat data)'
    ]


def test_the_memory_fit_counts_grpos_reference_model_and_generations():
    from components.estimate.memory import grpo_extra_bytes
    from components.models.shape import load_architecture, model_shape

    shape = model_shape(load_architecture("Qwen/Qwen3-30B-A3B-Thinking-2507-FP8"))
    zero3 = {"stage": 3}
    kv = 2 * 2 * shape.layers * shape.kv_dim * 4096 * 4
    # Full fine-tuning: TRL's frozen bf16 reference, partitioned like the policy under ZeRO-3, the KV cache, and the
    # whole bf16 model TRL gathers onto every GPU to generate (ds3_gather_for_generation): the trainer image has no
    # vllm, so a request for vLLM colocate is counted as the transformers generate that runs.
    for colocate in (True, False):
        extra = grpo_extra_bytes(
            shape,
            "full",
            zero3,
            16,
            beta=0.04,
            completions=4,
            sequence_tokens=4096,
            gpu_memory_gib=80.0,
            colocate=colocate,
        )
        assert extra == int(2 * shape.total / 16) + kv + 2 * shape.total
    # No reference with beta 0 or LoRA (the adapter off); without ZeRO-3 the model states hold the whole model already.
    for method, beta, zero in (("full", 0.0, zero3), ("lora", 0.04, zero3), ("lora", 0.04, {"stage": 2})):
        assert grpo_extra_bytes(
            shape,
            method,
            zero,
            16,
            beta=beta,
            completions=4,
            sequence_tokens=4096,
            gpu_memory_gib=80.0,
            colocate=False,
        ) == kv + (2 * shape.total if zero is zero3 else 0)
    # The reference job with stages sft and grpo is refused in one line naming what to change; its grpo stage with LoRA
    # fits (the bf16 base's shard, no reference copy, and the gathered model).
    full = {"stages": ["sft", "grpo"], "grpo_dataset_source": "builtin:arithmetic"}
    assert _errors(**full) == [
        "stage grpo: full fine-tuning of Qwen/Qwen3-30B-A3B-Thinking-2507-FP8 needs about 107.3 GiB per GPU (35.5 "
        "model states + 6.9 activations + 3 overhead + 61.9 grpo's reference model and generations) but a GPU has 80 "
        "GiB: its generation (transformers' generate: the trainer image has no vllm) gathers the whole model onto "
        "every GPU (56.9 GiB, TRL's ds3_gather_for_generation), which neither more GPUs nor a smaller batch shrink: "
        'train the grpo stage with LoRA (stage_settings={"grpo": {"method": "lora"}}) or use GPUs with more memory '
        "(gpu_memory_gib)"
    ]
    assert _errors(**GRPO) == []
    # At 60 GiB the LoRA grpo stage does not fit either, and says why.
    errors = _errors(**GRPO, gpu_memory_gib=60.0)
    assert (
        len(errors) == 1
        and errors[0].startswith("stage grpo: lora fine-tuning of ")
        and "grpo's reference model and generations) but a GPU has 60 GiB" in errors[0]
    ), errors


def test_the_grpo_data_step_imports_a_function_on_the_data_volume_that_validate_could_not(tmp_path):
    from components.settings import Settings
    from components.validate.rules.reward_rules import grpo_function_error

    # On a cluster validate_inputs does not mount the data volume: a file there is left to the grpo data step.
    on_volume = "/mnt/data/rewards/missing.py:reward"
    assert _errors(**GRPO, grpo_rewards={"function": 1.0}, grpo_reward_function=on_volume) == []
    s = Settings.from_flat({**defaults(), **GRPO, "grpo_rewards": {"function": 1.0}, "grpo_reward_function": on_volume})
    assert grpo_function_error(s) == (
        "grpo_reward_function '/mnt/data/rewards/missing.py:reward': "
        "/mnt/data/rewards/missing.py is not a file; put the file on a mounted volume "
        "(e.g. /mnt/data/rewards.py) and give its path"
    )
    assert grpo_function_error(Settings.from_flat({**defaults(), **GRPO})) is None  # no function reward


def test_a_grpo_column_mapping_names_prompt_or_answer(tmp_path):
    rows = tmp_path / "math.jsonl"
    rows.write_text('{"question": "2+2?", "solution": "4"}\n')
    mapped = {"grpo_dataset_source": str(rows), "grpo_column_mapping": {"prompt": "question", "answer": "solution"}}
    assert _errors(**{**GRPO, **mapped}) == []
    # onto the bundled prompts, which have no such columns, the mapping would be ignored: one error instead
    (error,) = _errors(**GRPO, grpo_column_mapping={"prompt": "question", "answer": "solution"})
    assert error.startswith('grpo_column_mapping={"prompt": "question", "answer": "solution"}: maps \'prompt\' onto')
    assert _errors(**GRPO, grpo_column_mapping={"question": "prompt"}) == [
        "grpo_column_mapping: 'question' -> 'prompt': map prompt or answer to your column's name, e.g. "
        '{"prompt": "question"}'
    ]


def test_grpo_before_sft_runs_with_a_warning():
    values = {**defaults(), **GRPO, "stages": ["grpo", "sft"]}
    assert check(values) == []
    assert any(w.startswith("stages puts grpo before sft") for w in warnings(values))
