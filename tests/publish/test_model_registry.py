"""components/publish/model_registry.py against a fake Kubeflow Model Registry (tests/fakes/model_registry.py) that the
official client (``model-registry``) talks to over HTTP, every request and answer checked against the registry's own
OpenAPI spec: the model, its version (metrics, run id, base model) and the version's artifact (the URI, safetensors)
created; the service account's token sent and never printed; a version registered twice, an unreachable registry and
a malformed URL, one line each."""

from __future__ import annotations

import ast
import json
import logging
import socket
import sys
from pathlib import Path

import pytest

from components.publish import model_registry
from components.publish.model_registry import RegistryError, register_model
from tests.fakes.model_registry import API, FakeModelRegistry, load_spec, running_fake_model_registry

TOKEN = "eyJhbGciOiJSUzI1NiJ9.sa-token-of-the-runner.c2lnbmF0dXJl"
METRICS = {"eval_loss": 1.25, "judge_win_rate": 0.625, "lm_eval/gsm8k": 1}
# What register_model sends, in order: the client's connection check, then register_model's calls, then the lookups
# of the version and the artifact for their ids.
REGISTRATION = [
    ("GET", "/registered_models"),
    ("GET", "/registered_model"),
    ("POST", "/registered_models"),
    ("GET", "/model_version"),
    ("POST", "/model_versions"),
    ("POST", "/model_versions/2/artifacts"),
    ("GET", "/registered_model"),
    ("GET", "/model_version"),
    ("GET", "/registered_model"),
    ("GET", "/model_version"),
    ("GET", "/model_artifact"),
]


@pytest.fixture
def registry():
    """The fake registry, requiring the token; no request or answer of a test may break the spec."""
    with running_fake_model_registry(token=TOKEN) as fake:
        yield fake
        assert fake.problems == []


@pytest.fixture
def token_file(tmp_path):
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")  # a trailing newline is not part of the token
    return path


def _register(registry: FakeModelRegistry, token_path, **overrides):
    arguments = {
        "server_url": registry.url,
        "name": "qwen3-30b-a3b-sft",
        "version": "run-7f3a",
        "uri": "s3://models/qwen3-30b-a3b-sft/run-7f3a",
        "metrics": METRICS,
        "run_id": "7f3a9c1e-run",
        "base_model": "Qwen/Qwen3-30B-A3B",
        "description": "SFT on the support conversations",
        "token_path": str(token_path),
    }
    return register_model(**{**arguments, **overrides})


def test_registration_creates_model_version_and_artifact_sends_the_token_and_never_prints_it(
    registry, token_file, capfd, caplog
):
    caplog.set_level(logging.DEBUG)
    result = _register(registry, token_file)

    assert [(r.method, r.path) for r in registry.requests] == REGISTRATION
    assert {r.headers.get("authorization") for r in registry.requests} == {f"Bearer {TOKEN}"}
    [model] = registry.registered_models.values()
    [version] = registry.model_versions.values()
    [artifact] = registry.artifacts.values()
    assert model["name"] == "qwen3-30b-a3b-sft" and model["owner"] == model_registry.AUTHOR
    assert version["name"] == "run-7f3a" and version["registeredModelId"] == model["id"]
    assert version["description"] == "SFT on the support conversations"
    assert version["customProperties"] == {
        "eval_loss": {"metadataType": "MetadataDoubleValue", "double_value": 1.25},
        "judge_win_rate": {"metadataType": "MetadataDoubleValue", "double_value": 0.625},
        "lm_eval/gsm8k": {"metadataType": "MetadataDoubleValue", "double_value": 1.0},  # an int metric: a double
        "kfp_run_id": {"metadataType": "MetadataStringValue", "string_value": "7f3a9c1e-run"},
        "base_model": {"metadataType": "MetadataStringValue", "string_value": "Qwen/Qwen3-30B-A3B"},
    }
    assert artifact["artifactType"] == "model-artifact" and artifact["modelVersionId"] == version["id"]
    assert artifact["uri"] == "s3://models/qwen3-30b-a3b-sft/run-7f3a" and artifact["name"] == model["name"]
    assert (artifact["modelFormatName"], artifact["modelFormatVersion"]) == ("safetensors", "1")
    assert result == {
        "registered_model_id": model["id"],
        "model_version_id": version["id"],
        "model_artifact_id": artifact["id"],
        "name": "qwen3-30b-a3b-sft",
        "version": "run-7f3a",
        "uri": "s3://models/qwen3-30b-a3b-sft/run-7f3a",
        # 127.0.0.1 names no Service: Kubeflow's registry Service name
        "ui_path": f"/model-registry/model-registry-service/registered-models/{model['id']}/versions/{version['id']}",
    }

    # The same version again: one line naming the version and the setting; nothing is written.
    posts = len([r for r in registry.requests if r.method == "POST"])
    with pytest.raises(RegistryError) as refused:
        _register(registry, token_file, metrics={"eval_loss": 0.5})
    message = str(refused.value)
    assert "\n" not in message and "model_registry_url=" in message and "'run-7f3a'" in message
    assert "already has version" in message
    assert len([r for r in registry.requests if r.method == "POST"]) == posts and len(registry.model_versions) == 1

    out, err = capfd.readouterr()
    assert TOKEN not in out + err + caplog.text + message
    assert str(token_file) in caplog.text  # where the token came from is logged, not the token


def test_the_token_comes_from_the_clients_default_variable_and_a_refused_one_is_one_line(
    registry, tmp_path, monkeypatch, capfd
):
    wrong = tmp_path / "projected-token"
    wrong.write_text("not-the-registry-token")
    monkeypatch.setenv(model_registry.TOKEN_PATH_ENV, str(wrong))
    with pytest.raises(RegistryError) as refused:
        register_model(
            server_url=registry.url, name="m", version="1", uri="pvc://models/m", metrics={}, run_id="r", base_model="b"
        )
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"model_registry_url='{registry.url}': ")
    assert "401" in message and "service account" in message
    [request] = registry.requests  # refused at the client's connection check: nothing written
    assert request.headers["authorization"] == "Bearer not-the-registry-token"
    out, err = capfd.readouterr()
    assert "not-the-registry-token" not in out + err + message


def test_an_unreadable_token_path_is_one_line_naming_it(tmp_path):
    with pytest.raises(RegistryError, match=r"^model_registry_url: cannot read the service account token at token_p"):
        register_model(
            server_url="http://model-registry-service.kubeflow.svc.cluster.local:8080",
            name="m",
            version="1",
            uri="s3://b/m",
            metrics={},
            run_id="r",
            base_model="b",
            token_path=str(tmp_path / "absent"),
        )


def test_an_unreachable_registry_is_one_line_naming_the_setting_and_the_fix(token_file):
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(RegistryError) as unreachable:
        register_model(
            server_url=url,
            name="m",
            version="1",
            uri="s3://b/m",
            metrics={},
            run_id="r",
            base_model="b",
            token_path=str(token_file),
        )
    message = str(unreachable.value)
    assert "\n" not in message and message.startswith(f"model_registry_url='{url}': the Model Registry does not answer")
    assert model_registry.EXAMPLE_URL in message and TOKEN not in message


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("model-registry-service:8080", "is not an http:// or https:// URL with a host"),
        ("ftp://model-registry-service:8080", "is not an http:// or https:// URL with a host"),
        ("http://model-registry-service:8080/api/model_registry/v1alpha3", "only scheme, host and port are taken"),
        ("http://user:pw@model-registry-service:8080", "only scheme, host and port are taken"),
        ("http://model-registry-service:8080?x=1", "only scheme, host and port are taken"),
        ("http://model-registry-service:99999", "Port out of range"),
        ("http://model_registry:8080", "is not a host name"),
        ("https://", "is not an http:// or https:// URL with a host"),
    ],
)
def test_a_malformed_url_is_one_line_naming_the_setting_before_any_request(url, why):
    with pytest.raises(ValueError) as bad:
        register_model(server_url=url, name="m", version="1", uri="s3://b/m", metrics={}, run_id="r", base_model="b")
    message = str(bad.value)
    assert "\n" not in message and message.startswith(f"model_registry_url={url!r}") and why in message


def test_urls_the_registry_is_reached_at():
    assert model_registry.parse_server_url("http://model-registry-service.kubeflow.svc.cluster.local:8080") == (
        "http",
        "model-registry-service.kubeflow.svc.cluster.local",
        8080,
    )
    assert model_registry.parse_server_url("https://kubeflow.example.com") == ("https", "kubeflow.example.com", 443)
    assert model_registry.parse_server_url("http://10.0.0.5/") == ("http", "10.0.0.5", 80)
    assert model_registry.parse_server_url("http://[fd00::5]:8080") == ("http", "[fd00::5]", 8080)


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [
        ("metrics", {"eval_loss": float("nan")}, "is not a finite number"),
        ("metrics", {"accuracy": True}, "is not a finite number"),
        ("metrics", {"kfp_run_id": 1.0}, "metric name 'kfp_run_id'"),
        ("version", "", "model registry version=''"),
        ("name", "qwen3 ", "model registry name='qwen3 '"),
        ("name", "modèle", "printable ASCII"),
        ("uri", " ", "model registry uri is empty"),
    ],
)
def test_what_the_registry_would_refuse_is_refused_before_any_request(field, value, why):
    arguments = {"name": "m", "version": "1", "uri": "s3://b/m", "metrics": {}, "run_id": "r", "base_model": "b"}
    with pytest.raises(ValueError, match=why):
        register_model(server_url="http://127.0.0.1:9", **{**arguments, field: value})


def test_an_https_registry_without_any_token_is_refused_before_any_request(monkeypatch, tmp_path):
    monkeypatch.delenv(model_registry.TOKEN_PATH_ENV, raising=False)
    monkeypatch.setattr(model_registry, "POD_TOKEN_PATH", str(tmp_path / "no-pod-token"))
    with pytest.raises(RegistryError, match=r"an https:// registry needs the service account's token"):
        register_model(
            server_url="https://kubeflow.example.com",
            name="m",
            version="1",
            uri="s3://b/m",
            metrics={},
            run_id="r",
            base_model="b",
        )


def test_the_module_imports_the_client_only_when_it_registers():
    """Importing this module costs nothing (the client takes seconds to import): no module-level import of it."""
    tree = ast.parse(Path(model_registry.__file__).read_text())
    imported = {a.name for n in tree.body if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in tree.body if isinstance(n, ast.ImportFrom)}
    assert not {m for m in imported if m and m.split(".")[0] in ("model_registry", "mr_openapi", "aiohttp")}


def test_the_clients_import_leaves_the_root_logger_as_it_was_and_its_defaults_are_these(monkeypatch):
    """The client's first import runs ``logging.basicConfig`` (a stderr handler on the root logger, for the rest of
    the step): imported afresh here, the root logger keeps no handler it did not have."""
    for name in [m for m in sys.modules if m == "model_registry" or m.startswith("model_registry.")]:
        monkeypatch.delitem(sys.modules, name)  # put back after the test
    monkeypatch.setattr(logging.getLogger(), "handlers", [])
    model_registry._import_client()
    assert logging.getLogger().handlers == []
    client = sys.modules["model_registry._client"]
    assert client.DEFAULT_USER_TOKEN_ENVVAR == model_registry.TOKEN_PATH_ENV
    assert client.DEFAULT_K8S_SA_TOKEN_PATH == model_registry.POD_TOKEN_PATH


def test_the_fake_refuses_what_the_spec_refuses():
    """The fake is only as good as its checks: unknown fields, a wrong metadata type, an artifact without its
    ``artifactType``, undeclared query parameters and a path the spec lacks are answered 400 (or 404/405) and kept in
    ``problems``; a missing model is a 404 the spec declares, not a problem."""
    fake = FakeModelRegistry(load_spec())

    def call(method, path, body=None):
        status, answer = fake.handle(method, API + path, {}, json.dumps(body).encode() if body is not None else b"")
        return status, json.loads(answer)

    assert call("POST", "/registered_models", {"name": "m", "color": "red"})[0] == 400
    assert call("POST", "/registered_models", {"name": "m"})[0] == 201
    double = {"metadataType": "MetadataDoubleValue", "double_value": "high"}
    assert (
        call("POST", "/model_versions", {"name": "v", "registeredModelId": "1", "customProperties": {"a": double}})[0]
        == 400
    )
    assert call("POST", "/model_versions", {"name": "v", "registeredModelId": "1"})[0] == 201
    assert call("POST", "/model_versions/2/artifacts", {"uri": "s3://b/m"})[0] == 400
    assert call("GET", "/registered_models?limit=1")[0] in (400, 500)
    assert call("DELETE", "/registered_models")[0] == 405
    status, answer = call("GET", "/registered_model?name=absent")
    assert status == 404 and answer["code"] == "Not Found"
    assert len(fake.problems) == 6, fake.problems
    assert "unknown fields ['color']" in fake.problems[0]
