"""components/publish/hub_push.py against a fake Hugging Face Hub (tests/fakes/hub.py) that huggingface_hub's own
create_repo and upload_folder talk to over HTTP: the repository created private, the weights over the LFS protocol
with the right sha256, the other files as they are, checkpoints left behind; a second push a new commit; the
errors a user fixes, one line each."""

from __future__ import annotations

import base64
import hashlib
import json
import logging
import urllib.error
import urllib.request

import numpy as np
import pytest
from huggingface_hub import HfApi, constants
from safetensors.numpy import save_file

from components.publish.hub_push import push_to_hub
from tests.fakes.hub import running_fake_hub

WRITE_TOKEN = "hf_write_aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
READ_TOKEN = "hf_read_bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
REPO = "team/tiny-qwen3-sft"
# What export_final writes into final/ besides the weights (components/train/trainer/export.py).
EXPORT_FILES = {
    "config.json": '{"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3"}\n',
    "generation_config.json": '{"eos_token_id": 2}\n',
    "tokenizer.json": '{"version": "1.0", "model": {"type": "BPE"}}\n',
    "tokenizer_config.json": '{"tokenizer_class": "Qwen2Tokenizer"}\n',
    "chat_template.jinja": "{% for m in messages %}{{ m.content }}{% endfor %}\n",
    "model.json": '{"base_model": "builtin:tiny-qwen3", "method": "full"}\n',
    "README.md": "---\nlicense: apache-2.0\nbase_model: Qwen/Qwen3-30B-A3B\n---\n# tiny-qwen3-sft\n",
}


@pytest.fixture
def hub(monkeypatch, tmp_path):
    """The fake Hub; huggingface_hub without telemetry, offline mode or Xet, and with an unroutable default endpoint:
    a request that ignored ``endpoint`` would fail here instead of reaching huggingface.co."""
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", True)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", True)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("HF_XET_CACHE", str(tmp_path / "xet"))
    with running_fake_hub(tokens={WRITE_TOKEN: "write", READ_TOKEN: "read"}) as fake:
        yield fake


def weights(seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"model.embed_tokens.weight": rng.standard_normal((32, 16), dtype=np.float32)}  # 2 KiB


@pytest.fixture
def export(tmp_path):
    """An export folder as final/ holds it (a few KB of safetensors), with what must not be pushed beside it."""
    folder = tmp_path / "final"
    folder.mkdir()
    save_file(weights(0), str(folder / "model.safetensors"), metadata={"format": "pt"})
    for name, text in EXPORT_FILES.items():
        (folder / name).write_text(text)
    checkpoint = folder / "checkpoint-10"
    checkpoint.mkdir()
    save_file(weights(1), str(checkpoint / "model.safetensors"))
    (checkpoint / "config.json").write_text("{}")
    (checkpoint / "optimizer.pt").write_bytes(b"\x80\x02optimizer")
    (checkpoint / "trainer_state.json").write_text('{"global_step": 10}')
    (folder / "training_args.bin").write_bytes(b"\x80\x02args")
    (folder / "trainer_state.json").write_text('{"global_step": 10}')
    (folder / "model-00001.safetensors.partial").write_bytes(b"\0half")
    return folder


def push(hub, folder, **kwargs) -> str:
    args = {"repo_id": REPO, "token": WRITE_TOKEN, "commit_message": "tiny-qwen3 sft, run 7", "endpoint": hub.url}
    return push_to_hub(folder=str(folder), **{**args, **kwargs})


def test_the_model_goes_to_a_new_private_repo_weights_over_lfs_checkpoints_left_behind(hub, export, caplog):
    caplog.set_level(logging.INFO, logger="publish.hub")
    url = push(hub, export)

    repo = hub.repos[REPO]
    head = repo.resolve("main")
    assert url == f"{hub.url}/{REPO}/commit/{head.oid}"
    assert repo.private
    assert json.loads(hub.requests_to("POST", "^/api/repos/create$")[0].body)["visibility"] == "private"
    assert head.summary == "tiny-qwen3 sft, run 7"
    # The model files, nothing else: no checkpoint folder, leftovers or half-written shard.
    files = hub.files(REPO)
    assert set(files) == {".gitattributes", "model.safetensors", *EXPORT_FILES}
    for name in ("model.safetensors", *EXPORT_FILES):
        assert files[name] == (export / name).read_bytes(), name
    # The weights as an LFS object with their sha256 and size; the other files committed as regular files.
    local = (export / "model.safetensors").read_bytes()
    assert head.files["model.safetensors"].lfs_oid == hashlib.sha256(local).hexdigest()
    assert repo.lfs_objects[hashlib.sha256(local).hexdigest()] == local
    [upload] = hub.requests_to("PUT", "^/lfs-storage/")
    assert "authorization" not in upload.headers  # a pre-signed URL, as the Hub's S3 ones
    lines = [json.loads(line) for line in hub.requests_to("POST", "/commit/main$")[0].body.splitlines()]
    assert {line["value"]["path"]: line["key"] for line in lines[1:]} == {
        "model.safetensors": "lfsFile",
        **dict.fromkeys(EXPORT_FILES, "file"),
    }
    # The token went to the Hub as a bearer token and nowhere else.
    assert {r.headers.get("authorization") for r in hub.requests if r.method != "PUT"} == {f"Bearer {WRITE_TOKEN}"}
    assert WRITE_TOKEN not in caplog.text and REPO in caplog.text


def test_a_second_push_is_a_new_commit_in_the_same_private_repo(hub, export):
    first = push(hub, export)
    save_file(weights(2), str(export / "model.safetensors"), metadata={"format": "pt"})
    (export / "model.json").write_text('{"base_model": "builtin:tiny-qwen3", "method": "full", "steps": 20}\n')

    second = push(hub, export, commit_message="run 8")

    repo = hub.repos[REPO]
    assert hub.requests_to("POST", "^/api/repos/create$")[1:]  # asked again: 409, the repo reused
    assert [c.summary for c in repo.history()] == ["run 8", "tiny-qwen3 sft, run 7", "initial commit"]
    assert second != first and second.endswith(repo.resolve("main").oid)
    assert repo.private
    assert hub.files(REPO)["model.safetensors"] == (export / "model.safetensors").read_bytes()
    # Never made public, and an unchanged folder makes no commit: the URL of the commit that holds it.
    assert push(hub, export, private=False, commit_message="run 8 again") == second
    assert repo.private and len(repo.history()) == 3


def test_a_branch_is_created_from_main_and_main_stays(hub, export):
    push(hub, export)
    main = hub.repos[REPO].resolve("main").oid
    (export / "model.json").write_text('{"candidate": true}\n')

    url = push(hub, export, revision="run-8")

    repo = hub.repos[REPO]
    assert repo.resolve("main").oid == main
    assert url.endswith(repo.branches["run-8"]) and repo.resolve("run-8").parent == main
    assert hub.files(REPO, "run-8")["model.json"] == b'{"candidate": true}\n'


def test_a_public_push_creates_a_public_repo_and_a_private_one_refuses_it(hub, export):
    push(hub, export, private=False, repo_id="team/open-model")
    assert not hub.repos["team/open-model"].private
    commits = len(hub.repos["team/open-model"].history())

    with pytest.raises(ValueError, match=r"^hub_repo_id='team/open-model' is a public repository") as e:
        push(hub, export, repo_id="team/open-model")

    assert "\n" not in str(e.value)
    assert len(hub.repos["team/open-model"].history()) == commits


def test_a_wrong_token_is_one_line_naming_hub_token_secret(hub, export):
    with pytest.raises(ValueError) as e:
        push(hub, export, token="hf_not_a_token_cccccccccccccccccccccccccc")

    message = str(e.value)
    assert message.startswith("hub_token_secret: ") and "HTTP 401" in message and "\n" not in message
    assert "Invalid credentials in Authorization header" in message
    assert "hf_not_a_token" not in message and e.value.__cause__ is None
    assert hub.repos == {}


def test_a_read_only_token_is_one_line_naming_hub_token_secret(hub, export):
    push(hub, export)
    commits = len(hub.repos[REPO].history())

    with pytest.raises(ValueError) as e:
        push(hub, export, token=READ_TOKEN, commit_message="from a read token")

    message = str(e.value)
    assert message.startswith(f"hub_token_secret: the Hub token may not write to hub_repo_id={REPO!r} (HTTP 403")
    assert "\n" not in message and READ_TOKEN not in message
    assert len(hub.repos[REPO].history()) == commits


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"repo_id": "team/bad--name"}, r"^hub_repo_id='team/bad--name' is not a Hub repository id: Cannot have --"),
        ({"repo_id": "models/team/model"}, r"^hub_repo_id='models/team/model' is not a Hub repository id"),
        ({"repo_id": "team/model.git"}, r"^hub_repo_id='team/model.git' is not a Hub repository id"),
        ({"repo_id": "tiny-qwen3-sft"}, r"^hub_repo_id='tiny-qwen3-sft' names no namespace"),
        ({"token": ""}, r"^hub_token_secret: no Hub token"),
    ],
)
def test_a_bad_repo_id_or_no_token_is_one_line_before_any_request(hub, export, change, expected):
    with pytest.raises(ValueError, match=expected) as e:
        push(hub, export, **change)

    assert "\n" not in str(e.value)
    assert hub.requests == []


def test_a_folder_without_a_model_or_offline_mode_is_refused_before_any_request(hub, export, tmp_path, monkeypatch):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="holds no exported model"):
        push(hub, tmp_path / "empty")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError, match="^HF_HUB_OFFLINE=1 forbids the push"):
        push(hub, export)
    assert hub.requests == []


def test_a_hub_without_xet_storage_is_one_line_naming_hf_hub_disable_xet(hub, export, monkeypatch):
    # With hf_xet installed (as it is with huggingface_hub on x86_64) the weights go over Xet, which the fake, like a
    # mirror without Xet storage, does not offer.
    pytest.importorskip("hf_xet")
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_XET", False)

    with pytest.raises(ValueError, match="offers no Xet storage .* set HF_HUB_DISABLE_XET=1") as e:
        push(hub, export)

    assert "\n" not in str(e.value)
    assert hub.requests_to("GET", f"^/api/models/{REPO}/xet-write-token/main$")


def _post(hub, path: str, body: bytes, token: str | None = WRITE_TOKEN) -> tuple[int, dict]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"{hub.url}{path}", data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_the_fake_hub_wants_a_bearer_token_and_refuses_an_lfs_pointer_without_its_object(hub):
    HfApi(endpoint=hub.url, token=WRITE_TOKEN).create_repo(REPO, private=True)
    assert _post(hub, "/api/repos/create", b'{"name": "x", "organization": "team"}', token=None)[0] == 401
    assert _post(hub, "/api/validate-yaml", b'{"content": ""}', token="hf_unknown")[0] == 401

    pointer = {"path": "model.safetensors", "algo": "sha256", "oid": hashlib.sha256(b"never sent").hexdigest()}
    binary = {"path": "blob.bin", "encoding": "base64", "content": base64.b64encode(b"\0\1\2").decode()}
    for key, value, refusal in (
        ("lfsFile", pointer, "an LFS pointer pointed to a file that does not exist"),
        ("file", binary, "it contains binary files"),
    ):
        lines = ({"key": "header", "value": {"summary": "x"}}, {"key": key, "value": value})
        status, answer = _post(
            hub, f"/api/models/{REPO}/commit/main", b"\n".join(json.dumps(x).encode() for x in lines)
        )
        assert status == 400 and refusal in answer["error"] and value["path"] in answer["error"]
    assert len(hub.repos[REPO].history()) == 1
