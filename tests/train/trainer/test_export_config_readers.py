"""Issue 19, defect 8: the exported config is read with the right RoPE base by transformers 4.x and 5.x alike, and
the export is readable by a serving pod that runs as another user than the trainer (found by the serving rehearsal).

Qwen3's Hub config says ``rope_theta: 1000000``; transformers 5 loads it into ``rope_parameters`` and writes only
that key back. transformers 4.x (vLLM images up to v0.19.0, KServe's Hugging Face runtime) never reads
``rope_parameters`` and falls back to its default, 10,000: measured with transformers 4.57.6 on a config written
by 5.23. The reading below is 4.57.6's own (``Qwen3Config.__init__``: ``rope_theta=10000.0, rope_scaling=None``,
stored as given); tests/deploy/test_serving_check.py serves a model read that way.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from components.train.trainer.export import export_final
from tests.fakes.vllm_server import TRANSFORMERS4_QWEN3_DEFAULTS
from tests.helpers.trainer import make_workdir

QWEN3_ROPE_THETA = 1000000


class StandInTrainer:
    """What export_final uses of the Hugging Face Trainer, on one process without DeepSpeed."""

    is_deepspeed_enabled = False
    is_distributed_loading_by_transformers = False  # set by Trainer.__init__: a model sharded at load (hsdp)

    def __init__(self, model):
        self.model = model

    def save_model(self, output_dir: str) -> None:
        self.model.save_pretrained(output_dir)

    def is_world_process_zero(self) -> bool:
        return True


def _as_transformers4_reads(config_path: Path) -> dict:
    config = json.loads(config_path.read_text())
    return {key: config.get(key, default) for key, default in TRANSFORMERS4_QWEN3_DEFAULTS.items()}


@pytest.fixture(scope="module")
def hub_base(tmp_path_factory) -> Path:
    """The tiny base with its config.json in the Hub's form (Qwen/Qwen3-8B's: ``rope_theta`` at the top)."""
    root = make_workdir(tmp_path_factory.mktemp("rope"))
    path = root / "base" / "config.json"
    config = json.loads(path.read_text())
    config.pop("rope_parameters")
    path.write_text(json.dumps({**config, "rope_theta": QWEN3_ROPE_THETA, "rope_scaling": None}))
    return root


def _cfg(root: Path, name: str, **over) -> SimpleNamespace:
    return SimpleNamespace(
        **{
            "output_dir": str(root / name),
            "method": "full",
            "merge_lora": False,
            "model_name_or_path": str(root / "base"),
            "dataset_path": str(root / "data"),
            "max_seq_length": 128,
            "learning_rate": 1e-3,
            "seed": 0,
            "deepspeed": "none",
            "report_to": [],
            **over,
        }
    )


def _assert_every_reader_gets_qwen3s_base(final: Path) -> None:
    from transformers import AutoConfig

    assert _as_transformers4_reads(final / "config.json") == {"rope_theta": QWEN3_ROPE_THETA, "rope_scaling": None}
    assert AutoConfig.from_pretrained(final).rope_parameters == {"rope_type": "default", "rope_theta": QWEN3_ROPE_THETA}


def test_a_full_export_keeps_the_rope_base_for_transformers4_readers(hub_base):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = hub_base / "base"
    model = AutoModelForCausalLM.from_pretrained(base)  # as the trainer loads the Hub model
    assert model.config.rope_parameters["rope_theta"] == QWEN3_ROPE_THETA
    final = Path(
        export_final(
            StandInTrainer(model),
            _cfg(hub_base, "full"),
            AutoTokenizer.from_pretrained(base),
            str(base),
            {"global_step": 1},
        )
    )
    _assert_every_reader_gets_qwen3s_base(final)


def test_a_merged_lora_export_keeps_the_rope_base_for_transformers4_readers(hub_base):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = hub_base / "base"
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base), LoraConfig(r=4, target_modules=["q_proj"]))
    final = Path(
        export_final(
            StandInTrainer(model),
            _cfg(hub_base, "lora", method="lora", merge_lora=True),
            AutoTokenizer.from_pretrained(base),
            str(base),
            {"global_step": 1},
        )
    )
    assert json.loads((final / "model.json").read_text())["merged"] is True
    _assert_every_reader_gets_qwen3s_base(final)


def test_every_exported_file_is_readable_by_a_serving_pod_of_another_user(hub_base):
    """safetensors writes weights 0600; vLLM running as the ServingRuntime's user could not open them (the serving
    rehearsal's PermissionError on /mnt/models/model.safetensors) unless it is the trainer's user too."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = hub_base / "base"
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base), LoraConfig(r=4, target_modules=["q_proj"]))
    cfg = _cfg(hub_base, "readable", method="lora", merge_lora=True)
    final = Path(
        export_final(StandInTrainer(model), cfg, AutoTokenizer.from_pretrained(base), str(base), {"global_step": 1})
    )
    for folder in (final, Path(cfg.output_dir) / "adapter"):
        for path in (folder, *folder.rglob("*")):
            wanted = 0o555 if path.is_dir() else 0o444
            assert path.stat().st_mode & wanted == wanted, f"{path} is {oct(path.stat().st_mode)}"


def test_a_moe_export_leaves_the_routers_training_loss_off_so_padded_generation_works(hub_base):
    """The trainer turns output_router_logits on for the router's auxiliary loss; in the export it made transformers'
    Qwen3-MoE generate() fail on the evaluation's padded batch of prompts (found by the serving rehearsal)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen3MoeConfig, Qwen3MoeForCausalLM

    tok = AutoTokenizer.from_pretrained(hub_base / "base")
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(
        Qwen3MoeConfig(
            vocab_size=len(tok),
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=96,
            num_experts=4,
            num_experts_per_tok=2,
            moe_intermediate_size=32,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
            output_router_logits=True,
        )
    )
    final = Path(
        export_final(StandInTrainer(model), _cfg(hub_base, "moe"), tok, str(hub_base / "base"), {"global_step": 1})
    )
    assert json.loads((final / "config.json").read_text())["output_router_logits"] is False
    exported = AutoModelForCausalLM.from_pretrained(final).eval()
    batch = tok(
        ["Repeat apple twice.", "Repeat stone twice, please, and then stop."], return_tensors="pt", padding=True
    )
    assert exported.generate(**batch, max_new_tokens=2, do_sample=False).shape[0] == 2


class DiskFullTrainer(StandInTrainer):
    """A trainer whose save stops half-way, as on a full disk: the config is written, the weights are not."""

    def save_model(self, output_dir: str) -> None:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
        self.model.config.save_pretrained(output_dir)
        raise OSError(28, "No space left on device", str(Path(output_dir) / "model.safetensors"))


def test_a_failed_export_leaves_no_final_folder_that_looks_complete(hub_base):
    """issue 31: a failed export left a weightless final/ (config only) that the run's model link and the next steps
    took for the model. The export is written beside it and renamed to final/ once complete."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    base = hub_base / "base"
    model = AutoModelForCausalLM.from_pretrained(base)
    cfg = _cfg(hub_base, "full-disk")
    with pytest.raises(OSError, match="No space left"):
        export_final(DiskFullTrainer(model), cfg, AutoTokenizer.from_pretrained(base), str(base), {"global_step": 1})
    assert not (Path(cfg.output_dir) / "final").exists()
    # The next export (a re-run) replaces what the failed one left and ends with a complete final/.
    final = Path(
        export_final(StandInTrainer(model), cfg, AutoTokenizer.from_pretrained(base), str(base), {"global_step": 1})
    )
    assert final == Path(cfg.output_dir) / "final" and (final / "model.safetensors").exists()
    assert (final / "model.json").exists() and not list(Path(cfg.output_dir).glob("final.*"))
