"""Object storage (components/storage/, model_store_uri) against a real S3 server on this machine (moto's server
mode, tests/helpers/s3_server.py): a multipart upload cut short resumes sending only the parts the server lacks and
ends byte for byte equal to the source; a wrong key fails validate_inputs before any training; a bucket URI that does
not parse is one error naming model_store_uri; the train step uploads only a whole final model; serving from the
store renders an InferenceService the CRD accepts."""

from __future__ import annotations

import hashlib
import json
import os
import struct

import pytest

from components import storage
from components.settings import Settings
from components.train.launcher import model_store
from components.validate.preflight import preflight
from components.validate.rules import check
from pipelines import params as P
from tests.fakes.k8s_api import FakeKubeAPI
from tests.helpers.cluster import NS, PARAMS, ready_cluster
from tests.helpers.crd_schema import crd_errors
from tests.helpers.s3_server import BUCKET

PART = storage.MIN_PART_SIZE  # 5 MiB: S3's (and moto's) smallest part


class Interrupted(Exception):
    pass


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _model_folder(root, size: int) -> dict[str, bytes]:
    """A folder of a big weights file (several parts), a config and a nested small file; its bytes by name."""
    files = {
        "model-00001.bin": os.urandom(size),
        "config.json": json.dumps({"model_type": "qwen3"}).encode(),
        "tokenizer/tokenizer.json": b"{}",
    }
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return files


def _local_env(monkeypatch, s3_server, keys: dict) -> None:
    for name, value in keys.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)


def test_bucket_uris_parse_and_a_bad_one_is_one_error_naming_model_store_uri():
    assert storage.parse_store_uri("s3://models/llm//team/") == storage.StoreURI("s3", "models", "llm/team")
    assert (
        str(storage.parse_store_uri("gs://my_bucket").join("runs/r1", "sft/final"))
        == "gs://my_bucket/runs/r1/sft/final"
    )
    assert storage.endpoint_for(storage.parse_store_uri("gs://b-1")) == storage.GCS_ENDPOINT
    assert storage.endpoint_for(storage.parse_store_uri("s3://b-1")) is None
    for bad in ("models", "http://host/models", "s3://", "s3://UPPER", "s3://a", "s3://b/../x", "s3://b_1/x"):
        errors = [e for e in check({**P.resolve("local-tiny"), "model_store_uri": bad}) if "model_store" in e]
        assert len(errors) == 1 and errors[0].startswith(f"model_store_uri={bad!r}"), (bad, errors)
    errors = check({**P.resolve("local-tiny"), "upload_checkpoints": True, "model_store_endpoint": "minio:9000"})
    assert "upload_checkpoints is set but model_store_uri is empty" in " ".join(errors)
    assert "model_store_endpoint='minio:9000' is not an http(s) URL" in " ".join(errors)


def test_an_interrupted_upload_resumes_with_only_the_missing_parts_and_equals_the_source(s3_server, tmp_path):
    src = tmp_path / "final"
    files = _model_folder(src, 3 * PART + 12345)  # 4 parts
    dest = storage.parse_store_uri(f"s3://{BUCKET}/runs/r1/sft/final")
    s3 = s3_server.client()
    key = dest.key("model-00001.bin")
    sent: list[int] = []

    def stop_after_two(name: str, number: int, size: int) -> None:
        if name == key:
            sent.append(number)
        if len(sent) == 2:
            raise Interrupted("the pod was evicted")

    with pytest.raises(Interrupted):  # one part in flight at a time: stopped after exactly two
        storage.upload_folder(
            dest,
            str(src),
            endpoint=s3_server.endpoint,
            credentials=s3_server.keys,
            part_size=PART,
            workers=1,
            on_part=stop_after_two,
        )
    # Cut short: the small files (sent side by side) but no weights and no manifest; the open upload holds the parts
    # that arrived.
    listed = s3.list_objects_v2(Bucket=BUCKET, Prefix=dest.prefix)["Contents"]
    assert [o["Key"] for o in listed] == [dest.key("config.json"), dest.key("tokenizer/tokenizer.json")]
    assert storage.read_manifest(dest, client=s3) is None
    (upload,) = s3.list_multipart_uploads(Bucket=BUCKET, Prefix=key)["Uploads"]
    held = {p["PartNumber"] for p in s3.list_parts(Bucket=BUCKET, Key=key, UploadId=upload["UploadId"])["Parts"]}
    assert held == {1, 2}, held

    resent: list[tuple[str, int]] = []
    manifest = storage.upload_folder(
        f"s3://{BUCKET}/runs/r1/sft/final",
        str(src),
        endpoint=s3_server.endpoint,
        credentials=s3_server.keys,
        part_size=PART,
        workers=2,
        on_part=lambda k, n, size: resent.append((k, n)),
    )
    assert sorted(n for k, n in resent if k == key) == sorted({1, 2, 3, 4} - held)  # only what the server lacked
    assert manifest["uploaded"]["model-00001.bin"] == f"{4 - len(held)} of 4 parts sent"
    assert s3.list_multipart_uploads(Bucket=BUCKET, Prefix=key).get("Uploads", []) == []
    for name, data in files.items():
        assert s3.get_object(Bucket=BUCKET, Key=dest.key(name))["Body"].read() == data, name
        assert manifest["files"][name]["size"] == len(data) and manifest["files"][name]["sha256"] == _sha(data)
        assert "ChecksumSHA256" in manifest["files"][name]["server_checksum"], name  # the server's, moto's included
    assert storage.read_manifest(dest, client=s3)["files"] == manifest["files"]

    # Once whole, nothing is sent again; a download gets the same bytes, checked against the manifest.
    again: list = []
    storage.upload_folder(
        dest, str(src), client=s3, part_size=PART, on_part=lambda *a: again.append(a), progress_seconds=0
    )
    assert again == []
    out = tmp_path / "copy"
    storage.download_folder(dest, str(out), client=s3, part_size=PART, workers=2)
    assert {n: (out / n).read_bytes() for n in files} == files
    assert json.loads((out / storage.MANIFEST).read_text())["files"] == manifest["files"]


def test_a_wrong_key_fails_validate_inputs_before_any_training(s3_server, monkeypatch):
    from components.validate.checks import validate

    run = {
        **P.resolve("local-tiny"),
        "model_store_uri": f"s3://{BUCKET}/llm",
        "model_store_endpoint": s3_server.endpoint,
    }
    _local_env(monkeypatch, s3_server, {**s3_server.keys, "AWS_SECRET_ACCESS_KEY": "not-the-key"})
    with pytest.raises(ValueError) as refused:
        validate(run)
    message = str(refused.value)
    assert message.startswith("invalid settings: model_store_secret is empty, and the credentials of this process:")
    assert "refuses these credentials" in message and "\n" not in message
    _local_env(monkeypatch, s3_server, s3_server.keys)
    assert preflight(run) == []
    assert preflight({**run, "model_store_uri": "s3://no-such-bucket"}) == [
        "model_store_uri='s3://no-such-bucket': bucket 'no-such-bucket' does not exist; create it or name another"
    ]


def test_on_a_cluster_preflight_reads_model_store_secret_and_asks_the_store(s3_server):
    run = {
        **PARAMS,
        "model_store_uri": f"s3://{BUCKET}/llm",
        "model_store_endpoint": s3_server.endpoint,
        "model_store_secret": "llm-store",
    }
    with FakeKubeAPI() as api:
        ready_cluster(api)

        def store_problems() -> list[str]:
            return [p for p in preflight(run, api_client=api.client, namespace=NS) if "model_store" in p]

        assert store_problems() == [
            f"model_store_secret='llm-store': Secret not found in {NS}; create it (kubectl create secret generic "
            f"llm-store -n {NS} --from-literal=AWS_ACCESS_KEY_ID=... --from-literal=AWS_SECRET_ACCESS_KEY=...)"
        ]
        api.add_secret(NS, "llm-store", {"AWS_ACCESS_KEY_ID": s3_server.keys["AWS_ACCESS_KEY_ID"]})
        assert store_problems() == [
            "model_store_secret='llm-store' has no key AWS_SECRET_ACCESS_KEY (it has: AWS_ACCESS_KEY_ID)"
        ]
        api.add_secret(NS, "llm-store", {**s3_server.keys, "AWS_SECRET_ACCESS_KEY": "wrong"})
        (problem,) = store_problems()
        assert problem.startswith("model_store_secret='llm-store': the server refuses these credentials")
        api.add_secret(NS, "llm-store", s3_server.keys)
        assert store_problems() == []


def _safetensors(data: bytes) -> bytes:
    header = json.dumps({"w": {"dtype": "U8", "shape": [len(data)], "data_offsets": [0, len(data)]}}).encode()
    return struct.pack("<Q", len(header)) + header + data


def test_the_train_step_uploads_a_whole_final_model_and_complete_checkpoints(s3_server, tmp_path, monkeypatch):
    _local_env(monkeypatch, s3_server, s3_server.keys)
    s = Settings.from_flat(
        {
            "model_store_uri": f"s3://{BUCKET}/team",
            "model_store_endpoint": s3_server.endpoint,
            "upload_checkpoints": True,
        }
    )
    model_root = tmp_path / "models"
    out_dir = model_root / "runs" / "r2" / "sft"
    final = out_dir / "final"
    final.mkdir(parents=True)
    (final / "config.json").write_text("{}")
    weights = _safetensors(b"\x01" * 64)
    (final / "model.safetensors").write_bytes(weights[:-8])  # cut short: not uploaded
    with pytest.raises(RuntimeError, match="model.safetensors"):
        model_store.upload_model(s.storage, str(final), model_root=str(model_root), local=True)
    (final / "model.safetensors").write_bytes(weights)
    uri = model_store.upload_model(s.storage, str(final), model_root=str(model_root), local=True)
    assert uri == f"s3://{BUCKET}/team/runs/r2/sft/final"
    s3 = s3_server.client()
    assert s3.get_object(Bucket=BUCKET, Key="team/runs/r2/sft/final/model.safetensors")["Body"].read() == weights

    for step, marked in ((2, True), (4, False)):  # checkpoint-4: the job stopped while writing it
        checkpoint = out_dir / f"checkpoint-{step}"
        checkpoint.mkdir()
        (checkpoint / "trainer_state.json").write_text("{}")
        if marked:
            (checkpoint / "COMPLETE").write_text(f"step {step}\n")
    with model_store.CheckpointUploads(
        s.storage, str(out_dir), model_root=str(model_root), local=True, poll=3600
    ) as uploads:
        pass
    assert list(uploads.sent.values()) == [f"s3://{BUCKET}/team/runs/r2/sft/checkpoint-2"]
    assert storage.read_manifest(f"s3://{BUCKET}/team/runs/r2/sft/checkpoint-2", client=s3) is not None


def test_serving_from_the_store_renders_an_s3_storage_uri_the_crd_accepts():
    from components.deploy.manifest import inference_service_for_run

    s = Settings.from_flat(
        {
            **P.resolve("qwen3-30b-a3b-full"),
            "model_store_uri": "gs://team-models/llm",
            "serving_service_account": "kserve-s3",
        }
    )
    isvc = inference_service_for_run(
        s.deploy,
        s.job,
        s.network,
        s.storage,
        run_id="r3",
        namespace=NS,
        storage_uri="pvc://llm-models/runs/r3/sft/final",
    )
    predictor = isvc["spec"]["predictor"]
    assert predictor["model"]["storageUri"] == "s3://team-models/llm/runs/r3/sft/final"
    assert predictor["serviceAccountName"] == "kserve-s3"
    assert crd_errors(isvc, "serving.kserve.io_inferenceservices.yaml") == []
    # Without a serving account the claim still serves, as before.
    plain = Settings.from_flat({**P.resolve("qwen3-30b-a3b-full"), "model_store_uri": "s3://team-models"})
    isvc = inference_service_for_run(
        plain.deploy,
        plain.job,
        plain.network,
        plain.storage,
        run_id="r3",
        namespace=NS,
        storage_uri="pvc://llm-models/runs/r3/sft/final",
    )
    assert isvc["spec"]["predictor"]["model"]["storageUri"] == "pvc://llm-models/runs/r3/sft/final"
    assert "serviceAccountName" not in isvc["spec"]["predictor"]


def test_the_command_line_fetches_an_uploaded_model_for_a_later_run(s3_server, tmp_path, monkeypatch):
    _local_env(monkeypatch, s3_server, s3_server.keys)
    src = tmp_path / "final"
    files = _model_folder(src, 1000)
    uri = f"s3://{BUCKET}/cli/final"
    assert storage.main(["upload", uri, str(src), "--endpoint", s3_server.endpoint]) == 0
    assert storage.main(["download", uri, str(tmp_path / "base"), "--endpoint", s3_server.endpoint]) == 0
    assert {n: (tmp_path / "base" / n).read_bytes() for n in files} == files
    with pytest.raises(ValueError, match="has no MANIFEST.json"):
        storage.download_folder(f"s3://{BUCKET}/cli", str(tmp_path / "none"), endpoint=s3_server.endpoint)


def test_a_base_model_uri_is_refused_with_the_download_fix():
    errors = [e for e in check({**P.resolve("local-tiny"), "model_name_or_path": "s3://models/base"}) if "s3://" in e]
    assert len(errors) == 1 and "python -m components.storage download" in errors[0], errors


def test_a_local_train_stage_uploads_its_final_model_and_records_the_uri(s3_server, tmp_path, monkeypatch):
    """train_stage itself (components/train/launcher/run.py), torchrun stubbed: the trainer leaves a checkpoint and
    final/."""
    from components.settings import defaults
    from components.train.launcher import local_torchrun as train_local
    from components.train.launcher.run import train_stage

    _local_env(monkeypatch, s3_server, s3_server.keys)
    weights = _safetensors(b"\x02" * 32)

    def torchrun(config_path, nproc_per_node, env=None):
        out = json.loads(open(config_path).read())["output_dir"]
        for folder in ("checkpoint-3", "final"):
            os.makedirs(os.path.join(out, folder))
            with open(os.path.join(out, folder, "model.safetensors"), "wb") as f:
                f.write(weights)
        open(os.path.join(out, "final", "config.json"), "w").write("{}")
        open(os.path.join(out, "checkpoint-3", "COMPLETE"), "w").write("step 3\n")
        open(os.path.join(out, "metrics.json"), "w").write(json.dumps({"global_step": 3}))

    monkeypatch.setattr(train_local, "run_torchrun", torchrun)
    monkeypatch.setattr(train_local, "cuda_available", lambda: False)
    s = Settings.from_flat(
        {
            **defaults(),
            "train_backend": "local",
            "deepspeed_config": "none",
            "metrics_port": 0,
            "model_store_uri": f"s3://{BUCKET}/local",
            "model_store_endpoint": s3_server.endpoint,
            "upload_checkpoints": True,
        }
    )
    models = tmp_path / "models"
    trained = train_stage(
        s,
        stage="sft",
        base_model_path="builtin:tiny-qwen3",
        tuned={},
        dataset_path=str(tmp_path / "data" / "dataset"),
        packing=False,
        data_root=str(tmp_path / "data"),
        model_root=str(models),
        run_id="run-7",
    )
    assert trained.metadata["store_uri"] == f"s3://{BUCKET}/local/runs/run-7/train/final"
    s3 = s3_server.client()
    for folder in ("final", "checkpoint-3"):
        manifest = storage.read_manifest(f"s3://{BUCKET}/local/runs/run-7/train/{folder}", client=s3)
        entry = manifest["files"]["model.safetensors"]
        assert (entry["size"], entry["sha256"]) == (len(weights), _sha(weights)), folder


def test_an_upload_killed_mid_way_resumes_where_it_stopped(s3_server, tmp_path, monkeypatch):
    """The uploading process SIGKILLed after some parts arrived (an evicted pod), then the upload run again."""
    import signal
    import subprocess
    import sys
    import time

    src = tmp_path / "final"
    files = _model_folder(src, 10 * PART)  # 10 parts, one in flight at a time
    uri = f"s3://{BUCKET}/killed/final"
    key = "killed/final/model-00001.bin"
    env = {**os.environ, **s3_server.keys}
    command = [sys.executable, "-m", "components.storage", "upload", uri, str(src)]
    command += ["--endpoint", s3_server.endpoint, "--workers", "1", "--part-size-mib", "5"]
    s3 = s3_server.client()

    def held() -> set[int]:
        uploads = s3.list_multipart_uploads(Bucket=BUCKET, Prefix=key).get("Uploads", [])
        if not uploads:
            return set()
        parts = s3.list_parts(Bucket=BUCKET, Key=key, UploadId=uploads[0]["UploadId"]).get("Parts", [])
        return {p["PartNumber"] for p in parts}

    upload = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    while len(held()) < 2 and upload.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    upload.send_signal(signal.SIGKILL)
    upload.wait()
    before = held()
    assert 2 <= len(before) < 10, before  # killed mid-way
    assert storage.read_manifest(uri, client=s3) is None

    resent: list[int] = []
    _local_env(monkeypatch, s3_server, s3_server.keys)
    manifest = storage.upload_folder(
        uri,
        str(src),
        endpoint=s3_server.endpoint,
        part_size=PART,
        on_part=lambda k, n, size: resent.append(n) if k == key else None,
    )
    assert sorted(resent) == sorted(set(range(1, 11)) - before)
    assert s3.get_object(Bucket=BUCKET, Key=key)["Body"].read() == files["model-00001.bin"]
    assert manifest["files"]["model-00001.bin"]["sha256"] == _sha(files["model-00001.bin"])


def test_a_file_rewritten_after_an_interrupted_upload_is_stored_as_it_is_now(s3_server, tmp_path):
    """The open upload's parts that still match are kept, but it recorded the old file's sha256: sent again whole."""
    src = tmp_path / "final"
    src.mkdir()
    weights = src / "model.bin"
    weights.write_bytes(os.urandom(2 * PART + 10))  # 3 parts
    uri = f"s3://{BUCKET}/rewritten"

    def stop_at_first(key: str, number: int, size: int) -> None:
        raise Interrupted("evicted")

    with pytest.raises(Interrupted):
        storage.upload_folder(
            uri, str(src), client=s3_server.client(), part_size=PART, workers=1, on_part=stop_at_first
        )
    now = weights.read_bytes()[: 2 * PART] + b"re-exported"  # the last part differs now
    weights.write_bytes(now)
    storage.upload_folder(uri, str(src), client=s3_server.client(), part_size=PART, workers=1)
    s3 = s3_server.client()
    assert s3.get_object(Bucket=BUCKET, Key="rewritten/model.bin")["Body"].read() == now
    assert storage.read_manifest(uri, client=s3)["files"]["model.bin"]["sha256"] == _sha(now)
