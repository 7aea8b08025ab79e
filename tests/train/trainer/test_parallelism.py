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
    hpz_config,
    hpz_partition_size,
    nodes_and_gpus,
    resumable,
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
    four = hpz_config(shipped, {"WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"})
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
    from components.train.trainer.sft import parse_config

    monkeypatch.setattr(parallelism, "nodes_and_gpus", lambda env=None: (2, 4))
    cfg = parse_config(_config(workdir, tmp_path, deepspeed="zero3_hpz"))
    assert cfg.deepspeed != deepspeed_config_path("zero3_hpz")
    assert json.loads(Path(cfg.deepspeed).read_text())["zero_optimization"]["zero_hpz_partition_size"] == 4
    # A user's own JSON keeps its value.
    own = tmp_path / "mine.json"
    own.write_text(Path(deepspeed_config_path("zero3_hpz")).read_text())
    assert parse_config(_config(workdir, tmp_path, deepspeed=str(own))).deepspeed == str(own)


@pytest.mark.parametrize(
    "over, message",
    [
        ({"parallelism": "hsdp", "deepspeed": "zero3"}, "in place of DeepSpeed: set deepspeed_config none"),
        ({"parallelism": "hsdp_ep", "method": "lora"}, "is for method 'full'"),
        ({"parallelism": "fsdp"}, "parallelism 'fsdp' is not one of"),
    ],
)
def test_hsdp_configs_that_cannot_run_are_one_error_naming_the_field(workdir, tmp_path, over, message):
    from components.train.trainer.sft import parse_config

    with pytest.raises(ValueError, match=message):
        parse_config(_config(workdir, tmp_path, **over))


def test_hsdp_writes_no_periodic_checkpoints_and_never_resumes(workdir, tmp_path):
    from components.train.trainer.sft import parse_config

    cfg = parse_config(_config(workdir, tmp_path, parallelism="hsdp", save_steps=5))
    assert cfg.save_strategy == "no" and not resumable(cfg)
    assert resumable(parse_config(_config(workdir, tmp_path, deepspeed="zero3")))
    assert check_parallelism({"parallelism": "deepspeed", "deepspeed": "x.json"}) is None
