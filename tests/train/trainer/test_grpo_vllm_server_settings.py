"""grpo_generation_backend=vllm-server without a server (issue 30; the real engine: test_grpo_vllm_server.py): the
two sides of the weight sync agree on the wire without importing each other (the trainer's side imports no vllm),
the server's command line, the trainer config's derivation and validate_inputs' refusals, each naming the setting."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from components.settings import defaults
from components.train.trainer import vllm_client
from components.validate.rules import check

ENGINE = Path(vllm_client.engine_dir()) / "kfp_weight_sync.py"
# A grpo run that fits (the reference model's full grpo stage is the memory fit's question, not these rules').
GRPO = {
    "stages": ["sft", "grpo"],
    "grpo_dataset_source": "builtin:arithmetic",
    "model_name_or_path": "builtin:tiny-qwen3",
    "train_backend": "local",
    "num_nodes": 1,
}


def _engine_tree() -> ast.Module:
    return ast.parse(ENGINE.read_text())


def _constant(tree: ast.Module, name: str):
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError(f"{ENGINE} defines no {name}")


def test_both_sides_name_the_same_engine_and_cut_the_same_buckets():
    tree = _engine_tree()
    assert _constant(tree, "BACKEND") == vllm_client.BACKEND
    assert _constant(tree, "STORE_PREFIX") == vllm_client.STORE_PREFIX
    assert _constant(tree, "TOKEN_ENV") == vllm_client.TOKEN_ENV
    module, cls = vllm_client.WORKER_EXTENSION.split(".")
    assert module == ENGINE.stem and any(isinstance(n, ast.ClassDef) and n.name == cls for n in tree.body)
    # The bucket rule is the wire format: the same function on both sides.
    (engine_buckets,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "buckets"]
    (trainer_buckets,) = [
        n
        for n in ast.parse(Path(vllm_client.__file__).read_text()).body
        if isinstance(n, ast.FunctionDef) and n.name == "buckets"
    ]
    body = [ast.dump(s) for s in engine_buckets.body[1:]]  # after the docstrings
    assert body == [ast.dump(s) for s in trainer_buckets.body[1:]]


def test_buckets_close_once_they_hold_enough_bytes():
    assert vllm_client.buckets([4, 4, 4, 10, 1], 8) == [(0, 2), (2, 4), (4, 5)]
    assert vllm_client.buckets([100], 8) == [(0, 1)]
    assert vllm_client.buckets([], 8) == []


def test_the_engine_module_imports_nothing_of_this_package():
    imported = set()
    for node in ast.walk(_engine_tree()):
        if isinstance(node, ast.ImportFrom):
            imported.add((node.module or "").split(".")[0])
        elif isinstance(node, ast.Import):
            imported.update(a.name.split(".")[0] for a in node.names)
    import sys

    assert imported - set(sys.stdlib_module_names) == {"torch", "vllm"}, imported


def test_the_trainer_side_imports_no_vllm():
    import subprocess
    import sys

    code = "import sys, components.train.trainer.vllm_client; print('vllm' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout == "False\n"


def test_the_server_command_enables_the_engine_and_vllms_rl_routes():
    args = vllm_client.server_args("/mnt/models/base", "policy", 8000)
    assert args[args.index("--worker-extension-cls") + 1] == "kfp_weight_sync.WeightSyncExtension"
    assert json.loads(args[args.index("--weight-transfer-config") + 1]) == {"backend": "kfp_torch"}
    env = vllm_client.server_env("/opt/kfp-weight-sync")
    assert env == {"VLLM_SERVER_DEV_MODE": "1", "PYTHONPATH": "/opt/kfp-weight-sync"}
    assert sorted(p.name for p in Path(vllm_client.engine_dir()).glob("*.py")) == ["__init__.py", ENGINE.name]


def test_the_sync_address_is_loopback_for_a_local_server_else_the_pods_ip(monkeypatch):
    assert vllm_client.sync_address("http://127.0.0.1:8000") == "127.0.0.1"
    monkeypatch.setenv("POD_IP", "10.1.2.3")
    assert vllm_client.sync_address("http://grpo-vllm.ns.svc:8000") == "10.1.2.3"


def test_vllm_server_needs_a_url_full_weights_and_a_gathering_layout():
    base = {**defaults(), **GRPO, "grpo_generation_backend": "vllm-server"}
    assert check({**base, "grpo_vllm_server_url": "http://grpo-vllm:8000"}) == []
    # Locally the URL is needed; on a cluster an empty one is the train step's own server
    # (test_grpo_vllm_server_step.py).
    errors = check({**base, "stage_settings": {"grpo": {"method": "lora"}}})
    assert errors == [
        "grpo_generation_backend vllm-server needs grpo_vllm_server_url with train_backend local (on a cluster the "
        "train step runs the server): the http://host:port of a vLLM server from the serving image started with this "
        "package's weight-sync engine (docs/rl.md); or set grpo_generation_backend transformers",
        "grpo_generation_backend vllm-server pushes full weights to the server; method is 'lora': use method full "
        "for the grpo stage (stage_settings.grpo) or grpo_generation_backend transformers",
    ]
    cluster = {**base, "train_backend": "pytorchjob"}
    assert check(cluster) == []
    # The server loads the stage's starting model from the models claim: a Hub id with no stage before grpo is not.
    hub = "Qwen/Qwen3-0.6B"
    assert check({**cluster, "stages": ["grpo"], "model_name_or_path": hub}) == [
        "grpo_generation_backend vllm-server with no grpo_vllm_server_url: the train step's vLLM server loads the "
        f"grpo stage's starting model from model_pvc (/mnt/models), and model_name_or_path {hub!r} is not there: put "
        "a stage (sft) before grpo, or start a server yourself and set grpo_vllm_server_url"
    ]
    assert check({**cluster, "stages": ["grpo"], "model_name_or_path": "/mnt/models/base/qwen3"}) == []
    assert check({**base, "grpo_vllm_server_url": "grpo-vllm:8000"}) == [
        "grpo_vllm_server_url 'grpo-vllm:8000': write the server's root, http://host:port"
    ]
    assert check({**base, "grpo_generation_backend": "vllm", "grpo_vllm_server_url": "http://x:1"})  # not a choice
    hsdp_ep = check(
        {**base, "grpo_vllm_server_url": "http://x:1", "parallelism": "hsdp_ep", "deepspeed_config": "none"}
    )
    assert (
        "grpo_generation_backend vllm-server gathers each weight whole, which parallelism hsdp_ep's expert shards do "
        "not support yet: use parallelism deepspeed or hsdp, or grpo_generation_backend transformers"
    ) in hsdp_ep


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    from datasets import Dataset, DatasetDict

    from components.models.tiny import materialize

    root = tmp_path_factory.mktemp("grpo-cfg")
    rows = [{"prompt": [{"role": "user", "content": f"Say {i}."}], "answer": str(i)} for i in range(8)]
    DatasetDict(train=Dataset.from_list(rows), eval=Dataset.from_list(rows[:2])).save_to_disk(str(root / "data"))
    return root, materialize(str(root / "cache"))


def _parse(workdir, **over):
    from components.train.config import build_trainer_config, write_trainer_config
    from components.train.trainer.config_file import parse_config
    from tests.helpers.trainer import trainer_settings

    root, base = workdir
    settings = trainer_settings(
        model_name_or_path=base,
        per_device_train_batch_size=8,
        deepspeed_config="none",
        grpo_num_generations=4,
        **over,
    )
    cfg = build_trainer_config(
        settings,
        dataset_path=str(root / "data"),
        output_dir=str(root / "out"),
        use_cpu=True,
        model_cache_dir=str(root / "cache"),
        stage="grpo",
        packing=False,
    )
    cfg.pop("ddp_backend")  # no process group to join outside torchrun
    return parse_config(write_trainer_config(cfg, str(root / "cfg.json")))


def test_the_trainer_config_carries_the_server_and_turns_trls_vllm_off(workdir):
    cfg = _parse(
        workdir,
        grpo_generation_backend="vllm-server",
        grpo_vllm_server_url="http://127.0.0.1:8000",
        grpo_weight_sync_steps=2,
    )
    assert (cfg.grpo_generation_backend, cfg.grpo_vllm_server_url, cfg.grpo_weight_sync_steps) == (
        "vllm-server",
        "http://127.0.0.1:8000",
        2,
    )
    assert cfg.use_vllm is False  # TRL's own vLLM modes import vllm in the trainer
    with pytest.raises(ValueError, match="grpo_generation_backend vllm-server needs grpo_vllm_server_url"):
        _parse(workdir, grpo_generation_backend="vllm-server")
    with pytest.raises(ValueError, match="method is 'lora'; use method full"):
        _parse(workdir, grpo_generation_backend="vllm-server", grpo_vllm_server_url="http://x:1", method="lora")


def test_the_pushed_tensors_are_the_checkpoints_a_moe_model_saves(tmp_path):
    """What the client sends is what ``save_pretrained`` writes (the format vLLM's ``load_weights`` maps): each
    expert's tensors for transformers 5's fused experts, by name, shape and value, in the declared order."""
    import torch
    from safetensors.torch import load_file
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(0)
    config = Qwen3MoeConfig(
        vocab_size=256,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        intermediate_size=96,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        tie_word_embeddings=False,
    )
    model = Qwen3MoeForCausalLM(config)
    model.save_pretrained(tmp_path)
    saved = load_file(str(tmp_path / "model.safetensors"))
    meta = vllm_client.parameters_metadata(model)
    tensors = list(vllm_client.full_parameters(model))
    assert [m.name for m in meta] == [name for name, _ in tensors]
    assert sorted(m.name for m in meta) == sorted(saved)
    for m, (name, tensor) in zip(meta, tensors, strict=True):
        assert tuple(tensor.shape) == m.shape == tuple(saved[name].shape), name
        assert torch.equal(tensor, saved[name]), name
    assert "model.layers.1.mlp.experts.3.up_proj.weight" in saved
