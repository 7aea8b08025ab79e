"""evaluate_model's numbers on the tiny Qwen3: held-out loss and perplexity, prompt answers, the gate, the
report, the lm-evaluation-harness plumbing and the input errors raised before any model loads."""

from __future__ import annotations

import json
import math
import re

import pytest

from components.data.prepare import PrepareOptions, prepare
from components.evaluate import harness
from components.evaluate.base_vs_tuned import (
    EvalOptions,
    build_report,
    evaluate,
    gate,
    heldout_loss,
    load_eval_rows,
    readable_decode,
)
from components.evaluate.prompts import load_prompts
from components.models.batches import label_nll, token_weighted_loss
from components.models.tiny import build_model, build_tokenizer

WORDS = ["apple", "river", "cloud", "stone", "music", "green", "paper", "light"]


def _train_briefly(base: str, dataset: str, out: str, steps: int = 60) -> None:
    """A 'tuned' model in seconds: plain Adam on the train split (the real trainer has its own tests)."""
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from components.models.batches import pad_collator

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    rows = datasets.load_from_disk(dataset)["train"]
    collate = pad_collator(model.config.pad_token_id)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(steps):
        batch = collate([rows[(step * 8 + i) % len(rows)] for i in range(8)])
        model(**batch).loss.backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(base).save_pretrained(out)


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """This module's models run on one CPU thread. On a 2-core machine whose cores other work shares, torch's
    threads wait on each other: the ``tiny`` fixture's training took 72 s on two threads and 4 s on one (on the
    idle machine 1.5 s and 2 s); its setup once took 298 s. The threads come back after the module."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny base model, a briefly tuned copy, and the same data prepared unpacked and packed."""
    root = tmp_path_factory.mktemp("evaluate")
    rows = [
        {
            "messages": [
                {"role": "user", "content": f"Repeat {w} twice. (#{i})"},
                {"role": "assistant", "content": f"{w} {w}. Done."},
            ]
        }
        for i, w in enumerate(WORDS * 12)
    ]
    corpus = root / "chat.jsonl"
    corpus.write_text("\n".join(json.dumps(r) for r in rows))
    tok = build_tokenizer(corpus)
    build_model(tok).save_pretrained(root / "base")
    tok.save_pretrained(root / "base")
    prepare(
        str(corpus),
        str(root / "base"),
        str(root / "data"),
        PrepareOptions(max_seq_length=128, eval_size=16, seed=0, packing=False),
    )
    prepare(
        str(corpus),
        str(root / "base"),
        str(root / "packed"),
        PrepareOptions(max_seq_length=128, eval_size=16, seed=0, packing=True),
    )
    _train_briefly(str(root / "base"), str(root / "data"), str(root / "tuned"))
    prompts = root / "prompts.jsonl"
    prompts.write_text(
        "\n".join(json.dumps({"messages": [{"role": "user", "content": f"Repeat {w} twice."}]}) for w in WORDS[:3])
    )
    return root


def test_untrained_base_scores_about_uniform_and_tuned_beats_it(tiny):
    result = evaluate(
        str(tiny / "base"),
        str(tiny / "tuned"),
        str(tiny / "data"),
        EvalOptions(0, 0.2, eval_prompts=str(tiny / "prompts.jsonl"), max_new_tokens=8),
    )
    m = result["metrics"]
    vocab = len(build_tokenizer(tiny / "chat.jsonl"))
    # A freshly initialised model is close to uniform over its vocabulary: loss ~ ln(V).
    assert abs(m["base_eval_loss"] - math.log(vocab)) < 0.5, m
    assert m["eval_loss"] < 0.5 * m["base_eval_loss"], m
    assert m["perplexity"] == pytest.approx(math.exp(m["eval_loss"]))
    assert m["eval_loss_delta"] == pytest.approx(m["eval_loss"] - m["base_eval_loss"])
    assert m["perplexity_delta"] == pytest.approx(m["perplexity"] - m["base_perplexity"])
    stats = json.loads((tiny / "data" / "stats.json").read_text())
    assert m["tokens_evaluated"] > 0 and m["prompts_answered"] == 3 and m["seconds"] > 0
    assert stats["eval"]["rows"] == 16
    assert result["passed"] and "required >= 20.0%" in result["reason"]
    assert len(result["answers"]["base"]) == len(result["answers"]["tuned"]) == 3

    # The tuned model learned the pattern (a word of the data twice, then "Done."; which word it copies right after
    # 60 steps depends on the CPU's float rounding: apple on one machine, cloud on an AMD EPYC) and answers at least one
    # prompt exactly; the random base did neither.
    def learned(answer: str) -> bool:
        return re.fullmatch(r"(\w+) \1\. Done\.", answer.strip()) is not None and answer.split()[0] in WORDS

    answers = result["answers"]
    assert all(map(learned, answers["tuned"])) and not any(map(learned, answers["base"])), answers
    exact = [f"{w} {w}. Done." for w in WORDS[:3]]
    assert any(a.strip() == e for a, e in zip(answers["tuned"], exact, strict=True)), answers
    report = result["report"]
    assert report.startswith("# Evaluation") and "**PASSED**" in report
    assert "| # | prompt | base | tuned |" in report and "| 1 | Repeat apple twice. |" in report
    assert "lm-evaluation-harness" not in report  # no tasks, no section


def test_gate_fails_when_the_required_improvement_is_not_reached(tiny):
    result = evaluate(
        str(tiny / "base"),
        str(tiny / "tuned"),
        str(tiny / "data"),
        EvalOptions(4, 0.99, eval_prompts=str(tiny / "prompts.jsonl"), max_new_tokens=2),
    )
    assert not result["passed"]
    assert "short of the required 99.0%" in result["reason"] and "**NOT PASSED**" in result["report"]


def test_eval_max_samples_bounds_the_rows_scored(tiny):
    assert len(load_eval_rows(str(tiny / "data"), 5)) == 5
    assert heldout_loss(str(tiny / "base"), str(tiny / "data"), 5)["rows"] == 5


def test_packed_rows_score_the_same_tokens_as_unpacked_rows(tiny):
    """Packed eval rows carry position_ids; every key but labels reaches the model, so each example only
    attends to itself and the numbers match the unpacked dataset's."""
    packed = load_eval_rows(str(tiny / "packed"))
    assert "position_ids" in packed.column_names
    a = heldout_loss(str(tiny / "tuned"), str(tiny / "data"))
    b = heldout_loss(str(tiny / "tuned"), str(tiny / "packed"))
    assert a["tokens"] == b["tokens"]
    assert b["eval_loss"] == pytest.approx(a["eval_loss"], rel=1e-4)


def test_trainer_scores_the_same_tokens_the_same_way_with_label_nll(tiny, tmp_path):
    """Why the trainer's eval_loss and this step's differ, and how they agree.

    Hugging Face Trainer's eval_loss is the mean of each batch's mean loss: batches, not tokens, carry equal
    weight. Given label_nll and token_weighted_loss as its metric hooks, the same Trainer evaluation reports
    this step's number: the same label tokens, scored the same way, summed and divided once."""
    import torch
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    from components.models.batches import pad_collator

    model = AutoModelForCausalLM.from_pretrained(tiny / "tuned", dtype=torch.float32)
    collate = pad_collator(model.config.pad_token_id)
    for data, batch_size in (("data", 4), ("packed", 1)):  # padded rows, and packed rows with position_ids
        rows = load_eval_rows(str(tiny / data))
        args = TrainingArguments(
            output_dir=str(tmp_path / data),
            per_device_eval_batch_size=batch_size,
            use_cpu=True,
            report_to=[],
            remove_unused_columns=False,
        )
        trainer = Trainer(
            model=model,
            args=args,
            eval_dataset=rows,
            data_collator=collate,
            preprocess_logits_for_metrics=label_nll,
            compute_metrics=token_weighted_loss,
        )
        metrics = trainer.evaluate()
        ours = heldout_loss(str(tiny / "tuned"), str(tiny / data))
        assert metrics["eval_label_tokens"] == ours["tokens"]
        assert metrics["eval_loss_per_token"] == pytest.approx(ours["eval_loss"], rel=1e-5)

    # Rows with different numbers of label tokens (every other row keeps only its first 3), one row per batch:
    # Trainer's eval_loss is then the plain mean of the rows' mean losses, not the loss per token.
    import datasets

    rows = [dict(r) for r in load_eval_rows(str(tiny / "data"))]
    for r in rows[::2]:
        scored = [i for i, label in enumerate(r["labels"]) if label != -100]
        r["labels"] = [label if i in scored[:3] else -100 for i, label in enumerate(r["labels"])]
    datasets.DatasetDict({"eval": datasets.Dataset.from_list(rows)}).save_to_disk(str(tmp_path / "uneven"))
    uneven = load_eval_rows(str(tmp_path / "uneven"))
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_eval_batch_size=1,
        use_cpu=True,
        report_to=[],
        remove_unused_columns=False,
    )
    metrics = Trainer(
        model=model,
        args=args,
        eval_dataset=uneven,
        data_collator=collate,
        preprocess_logits_for_metrics=label_nll,
        compute_metrics=token_weighted_loss,
    ).evaluate()
    ours = heldout_loss(str(tiny / "tuned"), str(tmp_path / "uneven"))
    assert metrics["eval_loss_per_token"] == pytest.approx(ours["eval_loss"], rel=1e-5)
    with torch.no_grad():
        sums = [
            label_nll(model(**batch).logits, batch["labels"])[0].tolist() for batch in (collate([r]) for r in uneven)
        ]
    assert metrics["eval_loss"] == pytest.approx(sum(nll / tokens for nll, tokens in sums) / len(sums), rel=1e-5)
    assert abs(metrics["eval_loss"] - ours["eval_loss"]) > 1e-3  # two estimators, the same tokens


def test_report_says_what_the_loss_is_and_draws_the_training_curve(tmp_path):
    import base64

    train = tmp_path / "train"
    checkpoint = train / "checkpoint-20"
    checkpoint.mkdir(parents=True)
    (checkpoint / "COMPLETE").write_text("")
    history = [{"step": s, "loss": 7.0 - s / 10, "epoch": s / 20} for s in (5, 10, 15, 20)] + [
        {"step": 20, "eval_loss": 5.5}
    ]
    (checkpoint / "trainer_state.json").write_text(
        json.dumps({"log_history": history, "logging_steps": 5, "max_steps": 20, "global_step": 20})
    )
    base = {"eval_loss": 7.5, "perplexity": math.exp(7.5), "tokens": 900, "rows": 12, "tasks": {}, "answers": ["a"]}
    tuned = {**base, "eval_loss": 5.4, "perplexity": math.exp(5.4), "answers": ["b"]}
    prompts = [[{"role": "user", "content": "hi"}]]
    report = build_report("base", "tuned", base, tuned, prompts, True, "ok", str(train))

    assert "| model | held-out loss (per label token) | perplexity |" in report
    assert (
        "cross-entropy summed over all 900 label (assistant) tokens of the 12 held-out rows, divided by 900" in report
    )
    assert "mean of per-batch mean losses" in report  # named, so nobody compares it with this table
    png = base64.b64decode(re.search(r"!\[training loss\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)", report).group(1))
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    assert "mean of the per-step losses of the 5 optimizer steps" in report
    # no complete checkpoint: the report says so instead of failing
    assert "No complete checkpoint" in build_report("b", "t", base, tuned, prompts, True, "ok", str(tmp_path / "none"))


def test_answers_show_unfinished_characters_as_bytes(tiny):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny / "base")
    ids = tok.encode("쿠버네티스 apple", add_special_tokens=False)
    assert readable_decode(tok, ids) == "쿠버네티스 apple"
    cut = readable_decode(tok, ids[1:])  # starts inside the first character
    assert "\ufffd" in tok.decode(ids[1:]) and "\ufffd" not in cut
    assert re.fullmatch(r"(<0x[0-9A-F]{2}>)+버네티스 apple", cut), cut


def test_gate_both_ways_on_perplexity_and_tasks():
    base, tuned = {"eval_loss": 2.0}, {"eval_loss": 1.9}
    passed, reason = gate(base, tuned, 0.0, min_perplexity_improvement=0.05)
    assert passed and "perplexity 7.39 -> 6.69" in reason
    passed, reason = gate(base, tuned, 0.0, min_perplexity_improvement=0.5)
    assert not passed and "short of the required 50.0%" in reason and "lower min_perplexity_improvement" in reason
    tasks = {"arc_easy": {"metric": "acc_norm", "score": 0.70}, "gsm8k": {"metric": "exact_match", "score": 0.40}}
    within = {"arc_easy": {"metric": "acc_norm", "score": 0.695}, "gsm8k": {"metric": "exact_match", "score": 0.45}}
    assert gate(base, tuned, 0.0, base_tasks=tasks, tuned_tasks=within, max_task_regression=0.01)[0]
    worse = {**within, "gsm8k": {"metric": "exact_match", "score": 0.30}}
    passed, reason = gate(base, tuned, 0.0, base_tasks=tasks, tuned_tasks=worse, max_task_regression=0.01)
    assert not passed and "gsm8k exact_match 0.4000 -> 0.3000 regresses" in reason and "max_task_regression" in reason
    # Lower is better for perplexity-type task metrics: a rise is the regression.
    ppl = {"wikitext": {"metric": "word_perplexity", "score": 17.5, "higher_is_better": False}}
    assert gate(base, tuned, 0.0, base_tasks=ppl, tuned_tasks={"wikitext": {**ppl["wikitext"], "score": 12.0}})[0]
    assert not gate(
        base,
        tuned,
        0.0,
        base_tasks=ppl,
        tuned_tasks={"wikitext": {**ppl["wikitext"], "score": 19.0}},
        max_task_regression=1.0,
    )[0]


# -- input errors, raised before any model is loaded ------------------------------------------------------


@pytest.mark.parametrize(
    "line,message",
    [
        ("not json", "prompts.jsonl:2: not a JSON object"),
        ('{"messages": []}', "prompts.jsonl:2: 'messages' must be a non-empty list"),
        ('{"messages": [{"role": "robot", "content": "hi"}]}', "prompts.jsonl:2: 'messages' must be"),
        (
            '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}',
            "prompts.jsonl:2: the last message must be the user's",
        ),
    ],
)
def test_bad_prompt_file_names_file_and_line(tmp_path, line, message):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"messages": [{"role": "user", "content": "ok"}]}\n' + line + "\n")
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        load_prompts(str(path))


def test_bundled_prompts_are_korean_and_english():
    prompts = load_prompts("builtin:sample")
    assert len(prompts) == 16
    assert any(any("\uac00" <= ch <= "\ud7a3" for ch in p[-1]["content"]) for p in prompts)


def test_errors_come_before_any_model_loads(tmp_path):
    missing = str(tmp_path / "no-model")  # loading it would fail differently: these errors must come first
    with pytest.raises(ValueError, match="eval_prompts: .* is not a file"):
        evaluate(missing, missing, missing, EvalOptions(0, 0.0, eval_prompts=str(tmp_path / "nope.jsonl")))
    with pytest.raises(ValueError, match="lm_eval_tasks must be a list of task names"):
        evaluate(missing, missing, missing, EvalOptions(0, 0.0, lm_eval_tasks=[""]))
    with pytest.raises(ValueError, match="max_new_tokens must be >= 1"):
        evaluate(missing, missing, missing, EvalOptions(0, 0.0, max_new_tokens=0))
    with pytest.raises(ValueError, match="is not a prepared dataset; run prepare_dataset first"):
        evaluate(missing, missing, missing, EvalOptions(0, 0.0))


def test_missing_harness_is_named_with_its_pin(monkeypatch):
    monkeypatch.setattr(harness.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=r"install lm-eval==0\.4\.13.*or pass lm_eval_tasks=\[\]"):
        harness.check_tasks(["arc_easy"])


# -- lm-evaluation-harness: the empty path and the arguments (tasks cannot be downloaded here) ------------


def test_no_tasks_runs_nothing_and_imports_nothing(monkeypatch):
    import sys

    monkeypatch.delitem(sys.modules, "lm_eval", raising=False)
    assert harness.run_tasks("/nowhere", [], 0, use_vllm=False, gpus=0) == {}
    harness.check_tasks([])
    assert "lm_eval" not in sys.modules


def test_harness_arguments_per_backend():
    hf = harness.harness_arguments("/mnt/models/m", ["arc_easy", "hellaswag"], 100, use_vllm=False, gpus=8)
    assert hf["model"] == "hf" and hf["tasks"] == ["arc_easy", "hellaswag"] and hf["limit"] == 100
    assert hf["model_args"] == {
        "pretrained": "/mnt/models/m",
        "dtype": "bfloat16",
        "device": "cuda",
        "parallelize": True,
    }
    cpu = harness.harness_arguments("m", ["arc_easy"], 0, use_vllm=False, gpus=0)
    assert cpu["limit"] is None and cpu["model_args"]["device"] == "cpu" and "parallelize" not in cpu["model_args"]
    vllm = harness.harness_arguments("m", ["arc_easy"], 0, use_vllm=True, gpus=8)
    assert vllm["model"] == "vllm" and vllm["model_args"]["tensor_parallel_size"] == 8


def test_harness_arguments_match_the_installed_harness():
    lm_eval = pytest.importorskip("lm_eval")
    import inspect

    from lm_eval.models.huggingface import HFLM

    accepted = inspect.signature(lm_eval.simple_evaluate).parameters
    for use_vllm, gpus in ((False, 0), (False, 8), (True, 8)):
        kwargs = harness.harness_arguments("m", ["arc_easy"], 10, use_vllm, gpus)
        assert set(kwargs) <= set(accepted)
    assert set(harness.harness_arguments("m", ["x"], 0, False, 8)["model_args"]) <= set(
        inspect.signature(HFLM.__init__).parameters
    )


def test_task_scores_pick_the_judged_metric():
    results = {
        "results": {
            "arc_easy": {"alias": "arc_easy", "acc,none": 0.61, "acc_stderr,none": 0.01, "acc_norm,none": 0.58},
            "gsm8k": {"alias": "gsm8k", "exact_match,strict-match": 0.42, "exact_match_stderr,strict-match": 0.02},
            "wikitext": {"alias": "wikitext", "word_perplexity,none": 17.5, "bits_per_byte,none": 0.6},
        },
        "higher_is_better": {
            "arc_easy": {"acc": True, "acc_norm": True},
            "gsm8k": {"exact_match": True},
            "wikitext": {"word_perplexity": False, "bits_per_byte": False},
        },
    }
    assert harness.task_scores(results) == {
        "arc_easy": {"metric": "acc_norm", "score": 0.58, "higher_is_better": True},
        "gsm8k": {"metric": "exact_match", "score": 0.42, "higher_is_better": True},
        "wikitext": {"metric": "word_perplexity", "score": 17.5, "higher_is_better": False},
    }


# -- the vLLM path's pieces that run without vLLM --------------------------------------------------------


def test_packed_rows_split_back_into_their_examples_for_vllm():
    from components.models.packing import split_examples

    packed = {
        "input_ids": [1, 2, 3, 4, 5, 6, 0, 0],
        "labels": [-100, 2, 3, -100, -100, 6, -100, -100],
        "position_ids": [0, 1, 2, 0, 1, 2, 0, 1],
    }
    assert split_examples(packed) == [([1, 2, 3], [-100, 2, 3]), ([4, 5, 6], [-100, -100, 6])]
    assert split_examples({"input_ids": [1, 2], "labels": [-100, 2]}) == [([1, 2], [-100, 2])]


def test_isolated_process_returns_the_result_or_the_error():
    from components.evaluate.isolated import run_isolated

    assert run_isolated(math.factorial, 5) == 120
    with pytest.raises(RuntimeError, match="math.factorial failed in its subprocess: ValueError"):
        run_isolated(math.factorial, -1)


def test_label_nll_finds_the_logits_among_a_moe_models_outputs():
    # Trainer hands preprocess_logits_for_metrics the outputs after the loss: for Qwen3-MoE (aux_loss, logits,
    # router_logits); the scalar aux_loss first broke every MoE evaluation under the Trainer.
    import torch

    from components.models.batches import label_nll

    torch.manual_seed(0)
    logits, labels = torch.randn(2, 5, 7), torch.tensor([[-100, 1, 2, 3, -100], [-100, -100, 4, 5, 6]])
    router = (torch.randn(10, 4),)
    plain = label_nll(logits, labels)
    assert torch.equal(label_nll((torch.tensor(0.3), logits, router), labels), plain)
    assert plain[:, 1].tolist() == [3.0, 3.0]
