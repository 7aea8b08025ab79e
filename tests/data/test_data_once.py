"""The data step prepares a run's data once per stage (components/data/once.py): the sft stage's slot, which runs the
data step again after the run's own, takes the folder the run's data step wrote for the same request."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from kfp.dsl import Dataset, Markdown

from components.data import once, tokenizing
from components.data.component import prepare_dataset
from components.models import resolve
from components.settings import defaults

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("torch", "transformers", "datasets")


def _settings(corpus, tokenizer_dir, **over) -> dict:
    return {
        **defaults(),
        "dataset_source": str(corpus),
        "model_name_or_path": tokenizer_dir,
        "max_seq_length": 128,
        "eval_size": 0.2,
        "seed": 0,
        "num_proc": 1,
        **over,
    }


def _data_step(settings: dict, data_root: Path, artifacts: Path) -> Dataset:
    """The KFP step's function for stage sft of run ``run-1``, as the KFP executor calls it."""
    artifacts.mkdir()
    dataset, report = Dataset(uri=str(artifacts / "dataset")), Markdown(uri=str(artifacts / "report.md"))
    prepare_dataset.python_func(
        settings=settings, stage="sft", data_root=str(data_root), run_id="run-1", dataset=dataset, report=report
    )
    return dataset


def _no(what):
    def fail(*args, **kwargs):
        raise AssertionError(f"the stage's data step {what}")

    return fail


def test_the_sft_stages_data_step_takes_the_runs_sft_data_as_it_is(corpus, tokenizer_dir, tmp_path, monkeypatch):
    settings = _settings(corpus, tokenizer_dir)
    first = _data_step(settings, tmp_path / "data", tmp_path / "run-data-step")
    folder = Path(first.metadata["path"])
    files = {p: p.stat().st_mtime_ns for p in folder.rglob("*")}
    monkeypatch.setattr(resolve, "resolve_model", _no("resolved the model again"))
    monkeypatch.setattr(tokenizing, "load_tokenizer", _no("loaded a tokenizer"))
    again = _data_step(settings, tmp_path / "data", tmp_path / "stage-slot")
    assert again.metadata["path"] == str(folder) and again.metadata["cache_hit"]
    assert {k: v for k, v in again.metadata.items() if k != "cache_hit"} == {
        k: v for k, v in first.metadata.items() if k != "cache_hit"
    }
    assert {p: p.stat().st_mtime_ns for p in folder.rglob("*")} == files  # not rewritten
    assert "| read |" in (tmp_path / "stage-slot" / "report.md").read_text()


def test_the_stage_slot_imports_neither_torch_nor_transformers_nor_datasets(corpus, tokenizer_dir, tmp_path):
    settings = _settings(corpus, tokenizer_dir)
    _data_step(settings, tmp_path / "data", tmp_path / "run-data-step")
    # The slot's step is a process of its own (kfp.local, a pod): what it imports is what it pays for.
    code = (
        "import json, sys\n"
        "from kfp.dsl import Dataset, Markdown\n"
        "from components.data.component import prepare_dataset\n"
        "settings, data_root, artifacts = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]\n"
        "dataset, report = Dataset(uri=artifacts + '/dataset'), Markdown(uri=artifacts + '/report.md')\n"
        "prepare_dataset.python_func(settings=settings, stage='sft', data_root=data_root, run_id='run-1',\n"
        "                            dataset=dataset, report=report)\n"
        f"print(json.dumps([dataset.metadata['cache_hit'], [m for m in {HEAVY!r} if m in sys.modules]]))\n"
    )
    (tmp_path / "stage-slot").mkdir()
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps(settings), str(tmp_path / "data"), str(tmp_path / "stage-slot")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[-1]) == [True, []]


@pytest.mark.parametrize("change", [{"max_seq_length": 96}, {"seed": 1}, {"model_name_or_path": "other"}])
def test_any_other_request_into_the_folder_prepares_again(corpus, tokenizer_dir, tmp_path, monkeypatch, change):
    out = str(tmp_path / "data" / "runs" / "run-1" / "dataset")
    options = {"source": [str(corpus)], "max_seq_length": 128, "eval_size": 0.2, "seed": 0, "num_proc": 1}
    first = once.prepare_once(out, tokenizer_dir, str(tmp_path / "cache"), **options)
    request = json.loads((Path(out) / once.REQUEST_FILE).read_text())
    assert request == {"model_name_or_path": tokenizer_dir, **options, "source": [str(corpus)]}
    resolved = []
    monkeypatch.setattr(resolve, "resolve_model", lambda ref, cache: resolved.append(ref) or tokenizer_dir)
    ref = change.get("model_name_or_path", tokenizer_dir)
    changed = {**options, **{k: v for k, v in change.items() if k in options}}
    again = once.prepare_once(out, ref, str(tmp_path / "cache"), **changed)
    assert resolved == [ref]  # through prepare (and its fingerprint cache), not the folder as it was
    assert json.loads((Path(out) / once.REQUEST_FILE).read_text()) == {"model_name_or_path": ref, **changed}
    assert again["max_seq_length"] == changed["max_seq_length"] and first["max_seq_length"] == 128
