"""The prepare_dataset KFP component's function, run as the KFP executor runs it: artifacts, report, cache."""

import json
import os

import datasets
from kfp.dsl import Dataset, Markdown

from components.data.component import prepare_dataset
from components.settings import defaults
from tests.helpers.data import conversation, write_jsonl


def run_component(tmp_path, tokenizer_dir, source, run_id):
    artifacts = tmp_path / f"artifacts-{run_id}"
    artifacts.mkdir()
    dataset, report = Dataset(uri=str(artifacts / "dataset")), Markdown(uri=str(artifacts / "report.md"))
    settings = {
        **defaults(),
        "dataset_source": source,
        "model_name_or_path": tokenizer_dir,
        "max_seq_length": 128,
        "eval_size": 0.2,
        "seed": 0,
        "data_pvc": "llm-data",
        "num_proc": 1,
    }
    prepare_dataset.python_func(
        settings=settings, stage="sft", data_root=str(tmp_path / "data"), run_id=run_id, dataset=dataset, report=report
    )
    return dataset, report


def test_component_writes_the_dataset_metadata_and_report(tokenizer_dir, tmp_path):
    data = tmp_path / "data"
    (data / "incoming").mkdir(parents=True)
    write_jsonl(data / "incoming" / "a.jsonl", [conversation(i) for i in range(30)])
    write_jsonl(data / "incoming" / "b.jsonl", [conversation(i, "ko") for i in range(30, 50)])
    source = "pvc://llm-data/incoming/a.jsonl, pvc://llm-data/incoming/b.jsonl"
    dataset, _ = run_component(tmp_path, tokenizer_dir, source, "run-1")
    md = dataset.metadata
    assert md["uri"] == "pvc://llm-data/runs/run-1/dataset" and md["path"] == str(data / "runs" / "run-1" / "dataset")
    assert md["train_examples"] + md["eval_examples"] == 50 and md["packing"] and 0.5 < md["packing_efficiency"] <= 1
    assert not md["cache_hit"]
    ds = datasets.load_from_disk(md["path"])
    assert len(ds["train"]) == md["train_rows"] and ds["train"].column_names == ["input_ids", "labels", "position_ids"]
    assert json.loads((tmp_path / "artifacts-run-1" / "dataset" / "stats.json").read_text())["rows_in"] == 50
    text = (tmp_path / "artifacts-run-1" / "report.md").read_text()
    assert "| read | 50 |" in text and text.count("### Example ") == 3

    # a recurring run with unchanged inputs reuses the cached result on the data volume
    again, _ = run_component(tmp_path, tokenizer_dir, source, "run-2")
    assert again.metadata["cache_hit"] and again.metadata["train_rows"] == md["train_rows"]
    assert datasets.load_from_disk(again.metadata["path"])["train"]["input_ids"] == ds["train"]["input_ids"]


def test_bad_data_ends_the_step_with_one_line_and_exit_2_and_records_the_cause(tokenizer_dir, tmp_path, capsys):
    rows = write_jsonl(tmp_path / "rows.jsonl", [conversation(0), "{not json", conversation(1)])
    try:
        run_component(tmp_path, tokenizer_dir, str(rows), "run-1")
    except SystemExit as stop:
        assert stop.code == 2
    else:
        raise AssertionError("bad data did not fail the step")
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "rows.jsonl:2: not valid JSON" in err and "max_bad_rows=10" in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    (record,) = (tmp_path / "data" / "runs" / "run-1" / "steps").glob("*.json")
    recorded = json.loads(record.read_text())
    assert recorded["state"] == "FAILED" and recorded["bad_input"] is True
    assert recorded["error"] == err.strip().removeprefix("error: ")


def test_the_hub_mirror_and_proxies_reach_the_steps_own_downloads(tmp_path):
    """``hf_endpoint`` (a Hub mirror, for clusters without huggingface.co) must reach the data step's own download of
    the base model, not only the pods the package creates: a step on a closed network otherwise asks huggingface.co
    and fails. The step runs in a fresh process, as KFP's executor runs it (huggingface_hub reads HF_ENDPOINT when
    it is first imported); the mirror here is an HTTP server that records what it is asked and answers 404."""
    import subprocess
    import sys
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from tests.helpers.repo import ROOT

    asked: list[str] = []

    class Mirror(BaseHTTPRequestHandler):
        def _answer(self):
            asked.append(self.path)
            self.send_response(404)
            self.send_header("X-Error-Code", "RepoNotFound")
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_GET = do_HEAD = _answer

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Mirror)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    settings = {
        **defaults(),
        "dataset_source": "builtin:sample",
        "model_name_or_path": "Qwen/Qwen3-0.6B",
        "hf_endpoint": f"http://127.0.0.1:{server.server_port}",
    }
    script = f"""
import json, sys
from kfp.dsl import Dataset, Markdown
from components.data.component import prepare_dataset
prepare_dataset.python_func(settings=json.loads(sys.argv[1]), stage="sft", data_root={str(tmp_path / "data")!r},
    run_id="r1", dataset=Dataset(uri={str(tmp_path / "ds")!r}), report=Markdown(uri={str(tmp_path / "r.md")!r}))
"""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("HF_", "HUGGING")) and k not in ("http_proxy", "HTTP_PROXY")
    }
    env.update(HF_HOME=str(tmp_path / "hf"), NO_PROXY="127.0.0.1", no_proxy="127.0.0.1")
    try:
        out = subprocess.run(
            [sys.executable, "-c", script, json.dumps(settings)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        server.shutdown()
    assert out.returncode != 0  # the mirror has no such model
    assert any("Qwen/Qwen3-0.6B" in path for path in asked), (asked, out.stderr[-2000:])
