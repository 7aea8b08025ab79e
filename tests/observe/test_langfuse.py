"""Langfuse traces (components/langfuse_trace.py) through the real Langfuse SDK to a local receiver that
decodes what the SDK sends (tests/fakes/langfuse_receiver.py)."""

from __future__ import annotations

import itertools
import logging
import socket
from types import SimpleNamespace

import pytest

from components.langfuse_trace import configured, trace_evaluation, trace_smoke_test
from components.train.trainer import metrics as trainer_metrics
from components.train.trainer.arguments import SFTConfig
from components.train.trainer.metrics import LangfuseRunCallback
from tests.fakes.langfuse_receiver import TRACES_PATH, LangfuseReceiver

SECRET = "sk-lf-test"
# The SDK keeps one client per public key for the process's life (its exporter bound to the first host): each test
# gets a key of its own, as each would be a process of its own in a pod.
KEYS = (f"pk-lf-test-{i}" for i in itertools.count())


@pytest.fixture
def langfuse(monkeypatch):
    with LangfuseReceiver() as receiver:
        receiver.public_key = next(KEYS)
        monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", receiver.public_key)
        monkeypatch.setenv("LANGFUSE_SECRET_KEY", SECRET)
        monkeypatch.setenv("LANGFUSE_HOST", receiver.url)
        yield receiver


def attrs(span: dict) -> dict:
    return span["attributes"]


def test_the_evaluation_is_one_trace_with_a_generation_per_prompt_and_model(langfuse):
    prompts = ["What is Kubeflow?", "쿠버네티스란?"]
    answers = {
        "base": ["A tool.", "모릅니다."],
        "tuned": ["A platform for ML on Kubernetes.", "컨테이너 오케스트레이션."],
    }
    assert trace_evaluation(
        run_id="run-1",
        base_model="/mnt/data/cache/base",
        tuned_model="/mnt/models/runs/run-1/sft/final",
        prompts=prompts,
        answers=answers,
        metrics={"eval_loss": 1.25},
        passed=True,
        reason="eval_loss 1.5 -> 1.25",
        max_new_tokens=64,
    )
    assert langfuse.paths and set(langfuse.paths) == {TRACES_PATH}
    assert set(langfuse.auth) == {(langfuse.public_key, SECRET)}
    (root,) = langfuse.by_type("span")
    assert root["name"] == "evaluate run-1"
    assert attrs(root)["session.id"] == "run-1"  # the run's traces are one Langfuse session
    assert attrs(root)["langfuse.trace.name"] == "evaluate run-1"
    assert attrs(root)["langfuse.observation.output"] == {
        "metrics": {"eval_loss": 1.25},
        "passed": True,
        "reason": "eval_loss 1.5 -> 1.25",
    }
    generations = {g["name"]: g for g in langfuse.by_type("generation")}
    assert sorted(generations) == ["prompt 1 base", "prompt 1 tuned", "prompt 2 base", "prompt 2 tuned"]
    for g in generations.values():
        assert g["trace_id"] == root["trace_id"] and g["parent_span_id"] == root["span_id"]
    tuned = attrs(generations["prompt 2 tuned"])
    assert tuned["langfuse.observation.model.name"] == "/mnt/models/runs/run-1/sft/final"
    assert tuned["langfuse.observation.input"] == [{"role": "user", "content": "쿠버네티스란?"}]
    assert tuned["langfuse.observation.output"] == "컨테이너 오케스트레이션."
    assert attrs(generations["prompt 1 base"])["langfuse.observation.model.name"] == "/mnt/data/cache/base"
    assert attrs(generations["prompt 1 base"])["langfuse.observation.output"] == "A tool."


def test_the_smoke_test_is_traced_with_the_served_models_identity(langfuse):
    assert trace_smoke_test(
        run_id="run-2",
        model_path="/mnt/models/runs/run-2/sft/final",
        served_model_name="qwen3-sft",
        endpoint="http://qwen3-sft.team.svc/openai/v1",
        prompt="Hello",
        reply="Hi there",
    )
    (generation,) = langfuse.by_type("generation")
    assert generation["name"] == "smoke test"
    assert attrs(generation)["langfuse.observation.model.name"] == "qwen3-sft"
    assert attrs(generation)["langfuse.observation.input"] == [{"role": "user", "content": "Hello"}]
    assert attrs(generation)["langfuse.observation.output"] == "Hi there"
    (root,) = langfuse.by_type("span")
    assert attrs(root)["session.id"] == "run-2"
    assert attrs(root)["langfuse.observation.metadata.model_path"] == "/mnt/models/runs/run-2/sft/final"


def test_the_training_run_records_settings_checkpoints_and_final_metrics(langfuse, tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINER_RUN_ID", "run-3")
    monkeypatch.setattr(trainer_metrics, "_langfuse", None)
    args = SFTConfig(
        output_dir=str(tmp_path / "sft"),
        stage="sft",
        learning_rate=3e-5,
        use_cpu=True,
        model_name_or_path="builtin:tiny-qwen3",
    )
    callback = LangfuseRunCallback()
    monkeypatch.setattr(trainer_metrics, "_langfuse", callback)
    callback.on_train_begin(args, SimpleNamespace(is_world_process_zero=True, global_step=0), None)
    callback.on_save(args, SimpleNamespace(global_step=10, max_steps=20, log_history=[{"loss": 2.5}]), None)
    trainer_metrics.finish({"eval_loss": 1.9, "global_step": 20})
    spans = {s["name"]: s for s in langfuse.spans}
    root = spans["train sft run-3"]
    assert attrs(root)["session.id"] == "run-3"
    assert attrs(root)["langfuse.observation.input"]["learning_rate"] == 3e-5  # the settings the run changed
    assert attrs(root)["langfuse.observation.metadata.model"] == "builtin:tiny-qwen3"
    assert attrs(root)["langfuse.observation.output"] == {"eval_loss": 1.9, "global_step": 20}
    checkpoint = spans["checkpoint-10"]
    assert checkpoint["parent_span_id"] == root["span_id"]
    assert attrs(checkpoint)["langfuse.observation.output"] == {
        "path": str(tmp_path / "sft" / "checkpoint-10"),
        "step": 10,
        "max_steps": 20,
        "loss": 2.5,
    }


def test_other_ranks_record_nothing(langfuse):
    callback = LangfuseRunCallback()
    callback.on_train_begin(None, SimpleNamespace(is_world_process_zero=False, global_step=0), None)
    assert callback.trace is None


def test_without_all_three_keys_nothing_is_traced(monkeypatch, caplog):
    for key in ("LANGFUSE_PUBLIC_KEY", "LANGFUSE_SECRET_KEY", "LANGFUSE_HOST"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", next(KEYS))
    assert not configured()
    with caplog.at_level(logging.INFO, logger="langfuse"):
        assert not trace_smoke_test(
            run_id="r", model_path="m", served_model_name="s", endpoint="e", prompt="p", reply="r"
        )
    assert "not traced" in caplog.text


def test_an_unreachable_host_never_raises(monkeypatch):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", next(KEYS))
    monkeypatch.setenv("LANGFUSE_SECRET_KEY", SECRET)
    monkeypatch.setenv("LANGFUSE_HOST", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("LANGFUSE_TIMEOUT", "2")
    trace_smoke_test(run_id="r", model_path="m", served_model_name="s", endpoint="e", prompt="p", reply="r")
