"""The trainer's parallel layout from torchrun's environment (components/train/trainer/parallelism.py): HSDP's
DistributedConfig, ZeRO++'s partition size, and what the trainer config may combine with them."""

import json
from pathlib import Path

import pytest

from components.train.config import deepspeed_config_path
from components.train.trainer import parallelism
from components.train.trainer.parallelism import (
    check_parallelism,
    distributed_config,
    hpz_partition_size,
    job_deepspeed_config,
    nodes_and_gpus,
)
from tests.helpers.trainer import make_workdir

TWO_NODES_OF_8 = {"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8"}


def test_nodes_and_gpus_come_from_torchruns_environment():
    assert nodes_and_gpus(TWO_NODES_OF_8) == (2, 8)
    assert nodes_and_gpus({}) == (1, 1)  # outside torchrun
    with pytest.raises(ValueError, match="--nproc_per_node must be the same on every node"):
        nodes_and_gpus({"WORLD_SIZE": "12", "LOCAL_WORLD_SIZE": "8"})


def test_hsdp_shards_within_a_node_and_replicates_over_the_nodes():
    layout = distributed_config("hsdp", bf16=True, env=TWO_NODES_OF_8)
    assert (layout.dp_replicate_size, layout.fsdp_size, layout.tp_size, layout.ep_size) == (2, 8, 1, 1)
    assert layout.fsdp_mixed_precision  # bf16 compute over fp32 master weights, fp32 gradient reductions
    ep = distributed_config("hsdp_ep", bf16=False, env=TWO_NODES_OF_8)
    # Experts parallel over the node; each expert whole on one GPU (efsdp 1), replicated over the nodes.
    assert (ep.dp_replicate_size, ep.fsdp_size, ep.ep_size, ep.efsdp_size) == (2, 8, 8, 1)
    assert not ep.fsdp_mixed_precision
    assert distributed_config("deepspeed", bf16=True, env=TWO_NODES_OF_8) is None


def test_hpz_partition_is_one_nodes_gpus_and_off_on_one_node(tmp_path):
    shipped = deepspeed_config_path("zero3_hpz")
    assert json.loads(Path(shipped).read_text())["zero_optimization"]["zero_hpz_partition_size"] == 8
    four = job_deepspeed_config("zero3_hpz", env={"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"})
    zero = json.loads(Path(four).read_text())["zero_optimization"]
    assert zero["zero_hpz_partition_size"] == 4 and zero["stage"] == 3
    assert hpz_partition_size({"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "8"}) == 1  # one node: nothing to keep in it


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return make_workdir(tmp_path_factory.mktemp("par"), rows=32)


def _config(workdir, tmp_path, **over) -> str:
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "model_name_or_path": str(workdir / "base"),
                "dataset_path": str(workdir / "data"),
                "output_dir": str(tmp_path / "out"),
                "use_cpu": True,
                "report_to": [],
                **over,
            }
        )
    )
    return str(path)


def test_the_trainer_sets_the_shipped_hpz_files_partition_to_the_jobs_gpus_per_node(workdir, tmp_path, monkeypatch):
    """The shipped zero3_hpz.json says 8; a job of 2 nodes x 4 GPUs gets 4 (LOCAL_WORLD_SIZE), with no file edit."""
    from components.train.trainer.config_file import parse_config

    monkeypatch.setattr(parallelism, "nodes_and_gpus", lambda env=None: (2, 4))
    cfg = parse_config(_config(workdir, tmp_path, deepspeed="zero3_hpz"))
    assert cfg.deepspeed != deepspeed_config_path("zero3_hpz")
    zero = json.loads(Path(cfg.deepspeed).read_text())["zero_optimization"]
    assert zero["zero_hpz_partition_size"] == 4
    # A user's own JSON keeps its value (its "auto" sizes are filled in as for any ZeRO-3 config).
    own = tmp_path / "mine.json"
    own.write_text(Path(deepspeed_config_path("zero3_hpz")).read_text())
    mine = json.loads(Path(parse_config(_config(workdir, tmp_path, deepspeed=str(own))).deepspeed).read_text())
    assert mine["zero_optimization"]["zero_hpz_partition_size"] == 8


def test_zero3_prefetches_whole_layers_of_the_model_where_the_config_says_auto(workdir, tmp_path):
    """transformers fills ZeRO-3's "auto" sizes from the hidden size (0.9 h^2 = 3.8M parameters of prefetch for
    Qwen3-30B-A3B, whose MoE blocks gather 1.2 GB each); the trainer writes one decoder layer's parameters instead
    (components/train/config.py::zero3_sizes), which the memory fit counts. Explicit numbers stay the user's."""
    from components.models.resolve import load_model_config
    from components.models.shape import model_shape
    from components.train.trainer.config_file import parse_config

    layer = model_shape(load_model_config("builtin:tiny-qwen3")).largest_layer
    zero = json.loads(Path(parse_config(_config(workdir, tmp_path, deepspeed="zero3")).deepspeed).read_text())
    zero = zero["zero_optimization"]
    assert zero["stage3_prefetch_bucket_size"] == zero["reduce_bucket_size"] == layer
    assert zero["stage3_max_live_parameters"] == 10**9  # DeepSpeed's own floor, above two tiny layers
    assert zero["stage3_param_persistence_threshold"] == "auto"  # left to transformers
    own = tmp_path / "mine.json"
    explicit = json.loads(Path(deepspeed_config_path("zero3")).read_text())
    explicit["zero_optimization"]["stage3_prefetch_bucket_size"] = 12345
    own.write_text(json.dumps(explicit))
    mine = json.loads(Path(parse_config(_config(workdir, tmp_path, deepspeed=str(own))).deepspeed).read_text())
    assert mine["zero_optimization"]["stage3_prefetch_bucket_size"] == 12345
    assert mine["zero_optimization"]["reduce_bucket_size"] == layer
    # The reference model: a whole layer, its MoE block one leaf, is 623M parameters, and two stay live.
    from components.models.shape import load_architecture
    from components.train.config import job_zero_config

    reference = model_shape(load_architecture("Qwen/Qwen3-30B-A3B")).largest_layer
    assert reference == 623_120_640
    sized = job_zero_config("zero3", 2, 8, reference)
    assert (sized["stage3_prefetch_bucket_size"], sized["stage3_max_live_parameters"]) == (reference, 2 * reference)


@pytest.mark.parametrize(
    "over, message",
    [
        ({"parallelism": "hsdp", "deepspeed": "zero3"}, "in place of DeepSpeed: set deepspeed_config none"),
        ({"parallelism": "hsdp_ep", "method": "lora"}, "is for method 'full'"),
        ({"parallelism": "fsdp"}, "parallelism 'fsdp' is not one of"),
    ],
)
def test_hsdp_configs_that_cannot_run_are_one_error_naming_the_field(workdir, tmp_path, over, message):
    from components.train.trainer.config_file import parse_config

    with pytest.raises(ValueError, match=message):
        parse_config(_config(workdir, tmp_path, **over))


def test_hsdp_checkpoints_through_save_only_model_which_the_trainer_requires_of_a_model_sharded_at_load(
    workdir, tmp_path
):
    """transformers 5.23's Trainer.__init__ refuses checkpoints of a model sharded at load unless save_only_model is
    on; sharded_checkpoints.py writes the optimizer beside the shards itself (test_hsdp_trainer.py resumes them)."""
    from components.train.trainer.config_file import parse_config

    cfg = parse_config(_config(workdir, tmp_path, parallelism="hsdp", save_steps=5))
    assert cfg.save_strategy == "steps" and cfg.save_steps == 5 and cfg.save_only_model
    assert not parse_config(_config(workdir, tmp_path, deepspeed="zero3")).save_only_model
    assert check_parallelism({"parallelism": "deepspeed", "deepspeed": "x.json"}) is None
