"""Bad input a run would meet later, named by validate_inputs' rules (the ones ``python -m pipelines.run`` runs before
it starts or submits anything): each message names the pipeline's own setting and its value, never a flag of
another command. Files and columns of a local run's data, image references, Kubernetes label keys and values, GPUs
per node and tensor-parallel sizes against the model's attention heads."""

import json

import pytest

from components.models.shape import ARCHITECTURES
from components.validate.rules import check, warnings
from pipelines import params as P
from pipelines.errors import UsageError
from tests.helpers.data import write_jsonl
from tests.helpers.repo import run_cli

OK = {"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}


def local(**over) -> dict:
    return {**P.resolve("local-tiny"), **over}


def cluster(**over) -> dict:
    return {**P.resolve("qwen3-30b-a3b-full"), **over}


def only(errors: list[str], setting: str) -> str:
    """The one error naming ``setting``."""
    named = [e for e in errors if setting in e]
    assert len(named) == 1, errors
    assert "--" not in named[0], named[0]  # no flag of the standalone data command
    return named[0]


# -- a local run's data: files and columns -------------------------------------------------------------------


def test_a_missing_local_dataset_source_is_named_before_the_run(tmp_path):
    missing = tmp_path / "rows.jsonl"
    error = only(check(local(dataset_source=str(missing))), "dataset_source")
    assert f"dataset_source={str(missing)!r}" in error and "no such file" in error


def test_each_comma_separated_source_and_the_eval_source_are_looked_for(tmp_path):
    good = write_jsonl(tmp_path / "good.jsonl", [OK])
    errors = check(local(dataset_source=f"builtin:sample,{good},{tmp_path / 'gone.jsonl'}"))
    assert "gone.jsonl" in only(errors, "dataset_source")
    assert "nothere" in only(check(local(eval_source=str(tmp_path / "nothere.jsonl"))), "eval_source")


def test_an_empty_file_is_named(tmp_path):
    empty = tmp_path / "rows.jsonl"
    empty.write_text("\n\n")
    assert "is empty" in only(check(local(dataset_source=str(empty))), "dataset_source")


def test_binary_bytes_are_named(tmp_path):
    binary = tmp_path / "rows.jsonl"
    binary.write_bytes(b"\x1f\x8b\x08\x00\xff\xfe\x00\x03" * 64)  # a gzip file named .jsonl
    error = only(check(local(dataset_source=str(binary))), "dataset_source")
    assert "rows.jsonl:1" in error and "UTF-8" in error


def test_rows_without_the_formats_columns_name_the_pipelines_settings(tmp_path):
    rows = write_jsonl(tmp_path / "rows.jsonl", [{"dialog": OK["messages"]}])
    (error,) = check(local(dataset_source=str(rows)))
    assert "cannot tell the format from the columns ['dialog']" in error
    assert "dataset_format" in error and 'column_mapping={"messages": "dialog"}' in error and "--" not in error
    assert check(local(dataset_source=str(rows), column_mapping={"messages": "dialog"})) == []
    (error,) = check(local(dataset_source=str(rows), dataset_format="messages"))
    assert "format 'messages' needs column(s) ['messages'] but found ['dialog']" in error


def test_a_column_mapping_naming_a_column_the_source_lacks_is_an_error(tmp_path):
    rows = write_jsonl(tmp_path / "rows.jsonl", [OK])
    error = only(check(local(dataset_source=str(rows), column_mapping={"messages": "dialog"})), "column_mapping")
    assert "'dialog'" in error and "['messages']" in error and "rows.jsonl" in error


def test_csv_columns_are_read_from_the_header(tmp_path):
    rows = tmp_path / "qa.csv"
    rows.write_text("question,answer\nwhat,that\n")
    mapping = {"instruction": "question", "output": "answer"}
    assert check(local(dataset_source=str(rows), column_mapping=mapping)) == []
    assert "'reply'" in only(
        check(local(dataset_source=str(rows), column_mapping={"output": "reply"})), "column_mapping"
    )


def test_a_cluster_runs_paths_are_on_its_volumes_and_not_looked_for_here():
    assert check(cluster(dataset_source="/mnt/data/rows.jsonl", eval_prompts="/mnt/data/prompts.jsonl")) == []


def test_a_hub_id_is_not_a_path():
    assert check(local(dataset_source="my-org/my-chat-data")) == []


def test_missing_eval_prompts_are_named_before_training(tmp_path):
    error = only(check(local(eval_prompts=str(tmp_path / "missing.jsonl"))), "eval_prompts")
    assert "missing.jsonl" in error and "is not a file" in error


def test_eval_prompts_that_do_not_end_with_a_user_turn_are_named(tmp_path):
    prompts = write_jsonl(tmp_path / "prompts.jsonl", [OK])
    assert "the last message must be the user's" in only(check(local(eval_prompts=str(prompts))), "eval_prompts")


def test_max_bad_rows_is_a_setting_of_the_pipeline():
    assert P.resolve("local-tiny", overrides=["max_bad_rows=10"])["max_bad_rows"] == 10
    with pytest.raises(UsageError, match="max_bad_rows=-1 must be >= 0"):
        P.check(P.resolve("local-tiny", overrides=["max_bad_rows=-1"]))


# -- what a cluster would reject or run badly ---------------------------------------------------------------


@pytest.mark.parametrize(
    "image",
    [
        "not a valid image",
        "ghcr.io/Org/trainer:1.0",  # repository names are lowercase
        "ghcr.io/org/trainer:",
        "ghcr.io/org/trainer@sha256:abc",
        "",
    ],
)
def test_an_image_reference_outside_the_docker_grammar_is_an_error(image):
    error = only(check(cluster(trainer_image=image)), "trainer_image")
    assert f"trainer_image={image!r}" in error


@pytest.mark.parametrize(
    "image",
    [
        "ghcr.io/org/llm-trainer:0.4.0",
        "localhost:5000/trainer",
        "registry.example.com:8443/team/sub/trainer:v1.2-rc_3",
        "pytorch/pytorch@sha256:" + "a" * 64,
        "ubuntu",
        "[::1]:5000/trainer:latest",
    ],
)
def test_image_references_in_the_docker_grammar_pass(image):
    assert check(cluster(trainer_image=image)) == []


@pytest.mark.parametrize(
    "selector, what",
    [
        ({"bad key!": "x"}, "'bad key!'"),
        ({"nvidia.com/gpu.product": "NVIDIA H100"}, "'NVIDIA H100'"),
        ({"Example.com/gpu": "x"}, "'Example.com/gpu'"),
        ({"a" * 64: "x"}, "a" * 64),
        ({"gpu": True}, "True"),
    ],
)
def test_node_selector_keys_and_values_follow_the_kubernetes_label_rules(selector, what):
    error = only(check(cluster(node_selector=selector)), "node_selector")
    assert what in error


def test_good_labels_pass():
    selector = {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3", "pool": "", "topology.kubernetes.io/zone": "a-1"}
    assert check(cluster(node_selector=selector)) == []


def test_toleration_keys_follow_the_label_rules_too():
    errors = check(cluster(tolerations=[{"key": "bad key!", "operator": "Exists", "effect": "NoSchedule"}]))
    assert "'bad key!'" in only(errors, "tolerations")
    errors = check(cluster(tolerations=[{"key": "gpu", "operator": "Sometimes"}]))
    assert "'Sometimes'" in only(errors, "tolerations")


@pytest.mark.parametrize("setting", ["gpus_per_node", "eval_gpus", "serving_gpus"])
def test_more_gpus_than_an_h100_node_has_is_an_error(setting):
    error = only(check(cluster(**{setting: 9})), f"{setting}=9: a node")
    assert "NVIDIA-H100-80GB-HBM3" in error and "holds at most 8 GPUs" in error


def test_unknown_gpu_products_leave_the_count_to_the_preflight():
    assert [e for e in check(cluster(node_selector={"pool": "gpu"}, gpus_per_node=10)) if "gpus_per_node=10" in e] == []


def test_serving_gpus_must_divide_the_attention_heads():
    # Qwen3-30B-A3B: 32 attention heads, 4 key-value heads.
    error = only(check(cluster(serving_gpus=3)), "serving_gpus=3")
    assert "32 attention heads" in error and "1, 2, 4, 8" in error
    assert check(cluster(serving_gpus=8)) == []  # 8 GPUs share 4 KV heads: each is replicated on 2


def test_serving_gpus_must_divide_or_be_divided_by_the_key_value_heads(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    config = json.loads((ARCHITECTURES / "qwen3-32b.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "num_attention_heads": 48, "num_key_value_heads": 6}))
    error = only(check(cluster(model_name_or_path=str(model), serving_gpus=4)), "serving_gpus=4")
    assert "6 key-value heads" in error
    assert [e for e in check(cluster(model_name_or_path=str(model), serving_gpus=2)) if "serving_gpus" in e] == []


def test_a_30b_model_evaluated_without_gpus_on_a_cluster_is_an_error():
    error = only(check(cluster(eval_gpus=0)), "eval_gpus=0")
    assert "Qwen/Qwen3-30B-A3B" in error
    assert check(local(eval_gpus=0)) == []  # the laptop model on CPU is the point of a local run


# -- the default run warns about nothing of its own making ----------------------------------------------------


def test_the_default_local_run_warns_about_nothing(tmp_path):
    result = run_cli("pipelines.run", "--preset", "local-tiny", "--render", str(tmp_path), timeout=120)
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr, result.stderr


def test_stage_settings_a_user_gives_for_a_stage_not_run_still_warn():
    assert any("stage_settings has settings for ['dpo']" in w for w in warnings(local(stage_settings={"dpo": {}})))


# -- through the command line: exit 2, one line on stderr, nothing run ---------------------------------------


def test_a_missing_data_file_exits_2_naming_the_setting_before_anything_runs(tmp_path):
    result = run_cli(
        "pipelines.run", "--workspace", str(tmp_path / "ws"), "-p", f"dataset_source={tmp_path / 'rows.jsonl'}"
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith("error: invalid settings: dataset_source=") and "no such file" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "ws").exists()


def test_missing_eval_prompts_exit_2_before_anything_runs(tmp_path):
    result = run_cli("pipelines.run", "--workspace", str(tmp_path / "ws"), "-p", "eval_prompts=/missing.jsonl")
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.startswith("error: invalid settings: eval_prompts: '/missing.jsonl' is not a file")
    assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "ws").exists()


@pytest.mark.parametrize("preset", ["local-tiny", "qwen3-30b-a3b-full"])
def test_a_column_mapping_onto_a_column_the_bundled_sample_lacks_is_one_error_on_any_backend(preset):
    # Before, the bundled sample (the default source) was skipped: the run trained as if the mapping were not set.
    values = {**P.resolve(preset), "dataset_source": "builtin:sample", "column_mapping": {"messages": "dialog"}}
    error = only(check(values), "column_mapping")
    assert "onto column 'dialog', which" in error and "instructions.jsonl does not have" in error
