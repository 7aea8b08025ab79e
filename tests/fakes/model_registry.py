"""A fake Kubeflow Model Registry REST API (v1alpha3): a real HTTP server the official client (``model-registry``)
can talk to.

It speaks exactly what ``ModelRegistry(...)`` and its ``register_model``, ``get_model_version`` and
``get_model_artifact`` call: list registered models (the client's connection check on construction), find a
registered model by name, create one, find a model version by name and parent, create one, upsert a model version's
artifact, find a model artifact by name and parent. State is kept in memory and every request is logged for tests to
inspect. Everything is checked against the real OpenAPI spec (``tests/reference/model-registry/model-registry.yaml``,
kubeflow/hub, unchanged) with jsonschema, ``$ref``s resolved into its ``components/schemas``:

- the request: the path and method are an operation of the spec, the query parameters are the ones the operation
  declares and match their schemas, the JSON body matches the operation's ``requestBody`` schema, with no field
  the schema does not name (the Go server decodes with ``DisallowUnknownFields``); a violation is answered 400 with
  the spec's ``Error`` body, as the server's ``DefaultErrorHandler`` would, and recorded in ``problems``;
- the response: its body matches the schema the spec gives for that operation and status code; a violation (a bug
  in the fake) is recorded in ``problems`` and answered 500.

A ``token`` makes every request need ``Authorization: Bearer <token>`` (else 401, as kube-rbac-proxy or Istio in
front of Kubeflow's registry answer). Usage::

    with running_fake_model_registry(token="t0k3n") as registry:
        ModelRegistry(registry.url, author="me", is_secure=False, user_token="t0k3n").register_model(...)
        assert registry.problems == [] and registry.requests_to("POST", "/registered_models")
"""

from __future__ import annotations

import contextlib
import copy
import functools
import json
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import jsonschema
import yaml

from tests.helpers.repo import REFERENCE  # one place for the specs: REFERENCE_DIR moves it

SPEC_PATH = REFERENCE / "model-registry" / "model-registry.yaml"
API = "/api/model_registry/v1alpha3"


@dataclass(frozen=True)
class LoggedRequest:
    """One request as the fake received it.

    Attributes:
        method: HTTP method.
        path: Path below ``API``, without the query, e.g. ``/registered_models``.
        query: Query parameters (the last value of each).
        json: The parsed JSON body, or None.
        headers: Request headers with lower-case names.
    """

    method: str
    path: str
    query: dict[str, str]
    json: Any
    headers: dict[str, str]


class ApiError(Exception):
    """An error answer: the spec's ``Error`` body, ``code`` being the status text (the server's ErrorResponse)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def body(self) -> dict[str, str]:
        return {"code": HTTPStatus(self.status).phrase, "message": self.message}


def _with_discriminators(node: Any) -> Any:
    """A copy of a spec fragment where each ``oneOf`` with a ``discriminator`` picks its branch by the discriminating
    property, as OpenAPI means it (plain JSON Schema ``oneOf`` would find several artifact kinds valid at once)."""
    if isinstance(node, list):
        return [_with_discriminators(item) for item in node]
    if not isinstance(node, dict):
        return node
    node = {key: _with_discriminators(value) for key, value in node.items()}
    discriminator = node.pop("discriminator", None)
    if discriminator and "oneOf" in node:
        prop = discriminator["propertyName"]
        node["oneOf"] = [
            {"allOf": [{"properties": {prop: {"enum": [value]}}, "required": [prop]}, {"$ref": ref}]}
            for value, ref in discriminator["mapping"].items()
        ]
    return node


class OpenApiSpec:
    """The spec's operations and schemas, and checks of requests and responses against them."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self.spec = spec
        self.components = _with_discriminators(spec["components"])
        self._operations = [
            (re.compile("^" + re.sub(r"\{[^/]+\}", "[^/]+", path) + "$"), path) for path in spec["paths"]
        ]

    def _resolve(self, node: dict[str, Any]) -> dict[str, Any]:
        while "$ref" in node:
            *_, kind, name = node["$ref"].split("/")
            node = self.components[kind][name]
        return node

    def operation(self, method: str, path: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """The operation ``method path`` (``path`` in full, ``/api/...``) and its parameters; ApiError 404/405."""
        for pattern, template in self._operations:
            if pattern.match(path):
                item = self.spec["paths"][template]
                if method.lower() not in item:
                    raise ApiError(405, f"{method} {template} is not an operation of the spec")
                operation = item[method.lower()]
                parameters = [self._resolve(p) for p in item.get("parameters", []) + operation.get("parameters", [])]
                return operation, parameters
        raise ApiError(404, f"{path} is not a path of the spec")

    def validate(self, schema: dict[str, Any], value: Any, where: str) -> None:
        """AssertionError naming ``where`` unless ``value`` matches ``schema`` and names only fields it declares."""
        validator = jsonschema.Draft7Validator({**schema, "components": self.components})
        errors = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))
        if errors:
            error = errors[0]
            at = "/".join(str(p) for p in error.absolute_path)
            raise AssertionError(f"{where}{'/' + at if at else ''}: {error.message}")
        unknown = self._unknown_fields(schema, value)
        if unknown:
            raise AssertionError(f"{where}: unknown fields {sorted(unknown)}")

    def _unknown_fields(self, schema: dict[str, Any], value: Any) -> set[str]:
        if not isinstance(value, dict):
            return set()
        known = self._properties(schema, value)
        return set() if known is None else set(value) - known

    def _properties(self, schema: dict[str, Any], value: dict[str, Any]) -> set[str] | None:
        """The property names ``schema`` declares for ``value`` (through ``$ref``, ``allOf`` and the branch of a
        discriminated ``oneOf``); None when it allows any (a map)."""
        schema = self._resolve(schema)
        if "additionalProperties" in schema and schema["additionalProperties"] is not False:
            return None
        names = set(schema.get("properties", {}))
        for part in schema.get("allOf", []):
            found = self._properties(part, value)
            if found is None:
                return None
            names |= found
        for branch in schema.get("oneOf", []):
            # A discriminated branch: {"allOf": [{"properties": {prop: {"enum": [value]}}}, {"$ref": ...}]}
            selector = branch.get("allOf", [{}])[0].get("properties", {})
            if selector and all(value.get(p) in s["enum"] for p, s in selector.items()):
                found = self._properties(branch, value)
                return None if found is None else names | found
        return names

    def check_request(self, method: str, path: str, query: dict[str, str], body: Any) -> dict[str, Any]:
        """The operation a request calls, after checking its query and body; ApiError 400 when they break the spec."""
        operation, parameters = self.operation(method, path)
        declared = {p["name"]: p for p in parameters if p["in"] == "query"}
        try:
            for name, value in query.items():
                if name not in declared:
                    raise AssertionError(f"query parameter {name!r} is not declared by {operation['operationId']}")
                self.validate(declared[name]["schema"], value, f"query {name}")
            if "requestBody" in operation:
                schema = operation["requestBody"]["content"]["application/json"]["schema"]
                self.validate(schema, body, f"{operation['operationId']} body")
            elif body is not None:
                raise AssertionError(f"{operation['operationId']} takes no body")
        except AssertionError as exc:
            raise ApiError(400, str(exc)) from None
        return operation

    def check_response(self, operation: dict[str, Any], status: int, body: Any) -> None:
        """AssertionError unless the spec declares ``status`` for the operation and ``body`` matches its schema."""
        responses = operation["responses"]
        if str(status) not in responses:
            raise AssertionError(f"{operation['operationId']} declares no {status} answer")
        response = self._resolve(responses[str(status)])
        self.validate(response["content"]["application/json"]["schema"], body, f"{operation['operationId']} {status}")


def _now_ms() -> str:
    return str(int(time.time() * 1000))


Handler = Callable[..., tuple[int, Any]]


class FakeModelRegistry:
    """In-memory state and request handling of the fake; HTTP-agnostic so it can be driven directly.

    Args:
        spec: The parsed OpenAPI spec.
        token: When set, every request must carry ``Authorization: Bearer <token>`` (else 401).
    """

    def __init__(self, spec: dict[str, Any], *, token: str | None = None) -> None:
        self.spec = OpenApiSpec(spec)
        self.token = token
        self.url = ""  # set once the HTTP server is listening
        self.requests: list[LoggedRequest] = []
        self.problems: list[str] = []  # spec violations: the client's (answered 400) and the fake's own (500)
        self.registered_models: dict[str, dict[str, Any]] = {}
        self.model_versions: dict[str, dict[str, Any]] = {}
        self.artifacts: dict[str, dict[str, Any]] = {}
        # ML Metadata's id spaces: registered models and versions are contexts, artifacts are artifacts.
        self._next_context_id = 1
        self._next_artifact_id = 1
        self._lock = threading.Lock()
        self._routes: list[tuple[str, re.Pattern[str], Handler]] = [
            ("GET", re.compile(r"/registered_models"), self._list_registered_models),
            ("GET", re.compile(r"/registered_model"), self._find_registered_model),
            ("POST", re.compile(r"/registered_models"), self._create_registered_model),
            ("GET", re.compile(r"/model_version"), self._find_model_version),
            ("POST", re.compile(r"/model_versions"), self._create_model_version),
            ("POST", re.compile(r"/model_versions/(?P<version_id>[^/]+)/artifacts"), self._upsert_version_artifact),
            ("GET", re.compile(r"/model_artifact"), self._find_model_artifact),
        ]

    # ------------------------------------------------------------------------------ test helpers

    def requests_to(self, method: str, path: str) -> list[LoggedRequest]:
        """The logged requests with this method and path (below ``API``, without query)."""
        return [r for r in self.requests if r.method == method and r.path == path]

    # ------------------------------------------------------------------------------ HTTP

    def handle(self, method: str, raw_path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        """Answer one request: (status, JSON body)."""
        url = urlsplit(raw_path)
        query = {key: values[-1] for key, values in parse_qs(url.query, keep_blank_values=True).items()}
        headers = {key.lower(): value for key, value in headers.items()}
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = body.decode(errors="replace")
        path = url.path[len(API) :] if url.path.startswith(API + "/") else url.path
        with self._lock:
            self.requests.append(LoggedRequest(method, path, query, parsed, headers))
            status, answer = self._answer(method, url.path, path, query, headers, parsed)
        return status, json.dumps(answer).encode()

    def _answer(
        self, method: str, full_path: str, path: str, query: dict[str, str], headers: dict[str, str], body: Any
    ) -> tuple[int, Any]:
        try:
            operation, _ = self.spec.operation(method, full_path)
        except ApiError as exc:
            self.problems.append(f"{method} {path}: {exc.message}")
            return exc.status, exc.body()
        try:
            if self.token is not None and headers.get("authorization") != f"Bearer {self.token}":
                raise ApiError(401, "Unauthorized: no valid bearer token")
            try:
                self.spec.check_request(method, full_path, query, body)
                for route_method, pattern, handler in self._routes:
                    match = pattern.fullmatch(path)
                    if route_method == method and match:
                        status, answer = handler(query=query, body=body, **match.groupdict())
                        break
                else:
                    raise ApiError(501, f"the fake does not implement {operation['operationId']}")
            except ApiError as exc:
                if exc.status not in (404, 409):  # what a real registry answers a valid request too
                    self.problems.append(f"{method} {path}: {exc.message}")
                raise
        except ApiError as exc:
            status, answer = exc.status, exc.body()
        try:
            self.spec.check_response(operation, status, answer)
        except AssertionError as exc:
            self.problems.append(f"the fake's answer to {method} {path}: {exc}")
            return 500, ApiError(500, str(exc)).body()
        return status, answer

    # ------------------------------------------------------------------------------ operations

    def _new_context_id(self) -> str:
        self._next_context_id += 1
        return str(self._next_context_id - 1)

    def _new_artifact_id(self) -> str:
        self._next_artifact_id += 1
        return str(self._next_artifact_id - 1)

    def _list_registered_models(self, query: dict[str, str], **_: Any) -> tuple[int, Any]:
        """getRegisteredModels: the first ``pageSize`` models by id; this fake needs no further pages."""
        size = int(query.get("pageSize") or 100)
        items = list(self.registered_models.values())[:size]
        return 200, {"items": copy.deepcopy(items), "nextPageToken": "", "pageSize": size, "size": len(items)}

    def _find_registered_model(self, query: dict[str, str], **_: Any) -> tuple[int, Any]:
        for model in self.registered_models.values():
            if model["name"] == query.get("name"):
                return 200, copy.deepcopy(model)
        raise ApiError(404, f"no registered model found for name={query.get('name', '')!r}")

    def _create_registered_model(self, body: dict[str, Any], **_: Any) -> tuple[int, Any]:
        if any(m["name"] == body["name"] for m in self.registered_models.values()):
            raise ApiError(409, f"a registered model named {body['name']!r} already exists")
        model = {"state": "LIVE", "customProperties": {}, **body, **self._server_fields(self._new_context_id())}
        self.registered_models[model["id"]] = model
        return 201, copy.deepcopy(model)

    def _find_model_version(self, query: dict[str, str], **_: Any) -> tuple[int, Any]:
        for version in self.model_versions.values():
            if version["name"] == query.get("name") and version["registeredModelId"] == query.get("parentResourceId"):
                return 200, copy.deepcopy(version)
        raise ApiError(404, f"no model version found for name={query.get('name', '')!r}")

    def _create_model_version(self, body: dict[str, Any], **_: Any) -> tuple[int, Any]:
        if body["registeredModelId"] not in self.registered_models:
            raise ApiError(404, f"no registered model with id {body['registeredModelId']}")
        if any(
            v["name"] == body["name"] and v["registeredModelId"] == body["registeredModelId"]
            for v in self.model_versions.values()
        ):
            raise ApiError(409, f"model version {body['name']!r} already exists")
        version = {"state": "LIVE", "customProperties": {}, **body, **self._server_fields(self._new_context_id())}
        self.model_versions[version["id"]] = version
        return 201, copy.deepcopy(version)

    def _upsert_version_artifact(self, version_id: str, body: dict[str, Any], **_: Any) -> tuple[int, Any]:
        """upsertModelVersionArtifact: a new artifact (no ``id``) is created and attributed to the version."""
        if version_id not in self.model_versions:
            raise ApiError(404, f"no model version with id {version_id}")
        if body.get("id"):
            raise ApiError(400, "the fake only creates artifacts (an upsert of an existing one sent an id)")
        artifact = {"customProperties": {}, **body, **self._server_fields(self._new_artifact_id())}
        artifact["modelVersionId"] = version_id  # the fake's own link (not sent back)
        self.artifacts[artifact["id"]] = artifact
        return 201, self._artifact_answer(artifact)

    def _find_model_artifact(self, query: dict[str, str], **_: Any) -> tuple[int, Any]:
        for artifact in self.artifacts.values():
            if artifact.get("name") == query.get("name") and artifact["modelVersionId"] == query.get(
                "parentResourceId"
            ):
                return 200, self._artifact_answer(artifact)
        raise ApiError(404, f"no model artifact found for name={query.get('name', '')!r}")

    @staticmethod
    def _artifact_answer(artifact: dict[str, Any]) -> dict[str, Any]:
        return {k: copy.deepcopy(v) for k, v in artifact.items() if k != "modelVersionId"}

    @staticmethod
    def _server_fields(new_id: str) -> dict[str, str]:
        now = _now_ms()
        return {"id": new_id, "createTimeSinceEpoch": now, "lastUpdateTimeSinceEpoch": now}


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as aiohttp pools connections
    timeout = 10  # lets idle keep-alive handler threads end
    disable_nagle_algorithm = True
    server: _FakeHttpServer

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        status, body = self.server.registry.handle(
            self.command, self.path, dict(self.headers.items()), self.rfile.read(length)
        )
        self.send_response(status)
        self.send_header("Content-Type", "application/json; charset=UTF-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PATCH = _serve

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - BaseHTTPRequestHandler's name
        """Stay quiet: tests read ``FakeModelRegistry.requests`` instead of the access log."""


class _FakeHttpServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, registry: FakeModelRegistry) -> None:
        super().__init__(("127.0.0.1", 0), _RequestHandler)
        self.registry = registry


@functools.cache
def load_spec(path: Path = SPEC_PATH) -> dict[str, Any]:
    """The Model Registry OpenAPI spec, parsed once per process (the fake only reads it); FileNotFoundError names the
    path when it is absent."""
    if not path.is_file():
        raise FileNotFoundError(f"Model Registry OpenAPI spec not found at {path}")
    return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


@contextlib.contextmanager
def running_fake_model_registry(*, token: str | None = None) -> Iterator[FakeModelRegistry]:
    """Run a fake Model Registry on 127.0.0.1 in a background thread for the duration of the block.

    Args:
        token: Require ``Authorization: Bearer <token>`` on every request.

    Yields:
        The fake, with ``url`` (``http://127.0.0.1:<port>``) set, its state, its request log and its ``problems``.
    """
    registry = FakeModelRegistry(load_spec(), token=token)
    server = _FakeHttpServer(registry)
    host, port = server.server_address[:2]
    registry.url = f"http://{host}:{port}"
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.02}, name="fake-model-registry", daemon=True
    )
    thread.start()
    try:
        yield registry
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
