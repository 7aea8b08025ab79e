"""A fake Kubeflow Pipelines v2beta1 REST API: a real HTTP server that kfp.Client can talk to.

It speaks the part of the API that submitting a pipeline and managing its runs need (healthz, pipelines and
their upload endpoints, pipeline versions, experiments, runs: create, get, list, terminate, archive, delete;
recurring runs), keeps its state in memory and logs every request for tests to inspect (``operation_of`` names
the swagger operation a request called). Request bodies are checked against the definitions in the real
swagger spec (``tests/reference/kfp/kfp_api_single_file.swagger.json``):
unknown fields, wrong JSON types and missing required fields are answered with 400 as grpc-gateway
would, and the semantic checks the API server makes on the way (cron trigger, max_concurrency 1-10,
referenced pipeline/version/experiment exist, runtime parameters declared by the pipeline) are made too.

Usage::

    with running_fake_kfp(token="t0k3n", path_prefix="/pipeline") as kfp_api:
        kfp.Client(host=kfp_api.url, existing_token="t0k3n")...
        assert kfp_api.requests_to("POST", "/apis/v2beta1/runs")
"""

from __future__ import annotations

import contextlib
import datetime
import email.parser
import email.policy
import json
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml
from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2

from tests.helpers.repo import REFERENCE  # one place for the specs: REFERENCE_DIR moves it

SWAGGER_PATH = REFERENCE / "kfp" / "kfp_api_single_file.swagger.json"
API = "/apis/v2beta1"

# google.rpc.Code of each HTTP status grpc-gateway produces (runtime.HTTPStatusFromCode, inverted).
_GRPC_CODES = {400: 3, 401: 16, 403: 7, 404: 5, 409: 6, 500: 13, 503: 14}
# proto3 has no `required`; the spec says it in field descriptions ("Required input", "Input. Required.").
_REQUIRED_RE = re.compile(r"^(Required input|Input\. Required\.)")
_DATE_TIME_RE = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)$")
# What robfig/cron v1, the parser behind KFP's validation, accepts at the shape level.
_CRON_SHAPE_RE = re.compile(r"^(@\w+( .+)?|\S+( \S+){4,5})$")
_MAX_UPLOAD_BYTES = 32 * 1024 * 1024  # the spec's "Maximum size of 32MB is supported"


@dataclass(frozen=True)
class LoggedRequest:
    """One request as the fake received it.

    Attributes:
        method: HTTP method.
        path: Path below the fake's path prefix, without the query, e.g. ``/apis/v2beta1/runs``.
        query: Query parameters, each a list of values.
        json: The parsed JSON body, or None (no body, or multipart).
        form: Multipart fields: the file name for files, the value for plain fields.
        headers: Request headers with lower-case names.
    """

    method: str
    path: str
    query: dict[str, list[str]]
    json: Any
    form: dict[str, str]
    headers: dict[str, str]


class ApiError(Exception):
    """An error answer: grpc-gateway's google.rpc.Status body, or the upload handler's apiError body."""

    def __init__(self, status: int, message: str, *, upload: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.upload = upload

    def body(self) -> dict[str, Any]:
        if self.upload:  # backend/src/apiserver/server/pipeline_upload_server.go writeErrorToResponse
            return {"error_message": self.message, "error_details": self.message}
        return {"code": _GRPC_CODES.get(self.status, 2), "message": self.message, "details": []}


class SwaggerSchemas:
    """Checks and canonicalizes JSON bodies against the spec's definitions like protojson would.

    Canonical form is what the server would send back: int64 as strings, enums as names, and fields
    holding their zero value left out.
    """

    def __init__(self, spec: dict[str, Any]) -> None:
        self.definitions: dict[str, Any] = spec["definitions"]
        self.paths: dict[str, Any] = spec["paths"]

    def parse(self, definition: str, value: Any) -> dict[str, Any]:
        """Return the canonical form of ``value`` as a ``definition`` message; ApiError 400 if invalid."""
        return self._parse({"$ref": f"#/definitions/{definition}"}, value, definition)

    def _parse(self, schema: dict[str, Any], value: Any, where: str) -> Any:
        if "$ref" in schema:
            schema = self.definitions[schema["$ref"].rsplit("/", 1)[-1]]
        kind = schema.get("type")
        if "enum" in schema:
            return self._parse_enum(schema["enum"], value, where)
        if kind == "object":
            return self._parse_object(schema, value, where)
        if kind == "array":
            if not isinstance(value, list):
                raise _bad(f"{where}: expected an array, got {json.dumps(value)}")
            return [self._parse(schema["items"], item, f"{where}[{i}]") for i, item in enumerate(value)]
        if kind == "boolean":
            if not isinstance(value, bool):
                raise _bad(f"{where}: expected a boolean, got {json.dumps(value)}")
            return value
        if kind == "integer" or schema.get("format") in ("int64", "uint64"):
            return self._parse_integer(schema, value, where)
        if kind == "number":
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise _bad(f"{where}: expected a number, got {json.dumps(value)}")
            return value
        if kind == "string":
            if not isinstance(value, str):
                raise _bad(f"{where}: expected a string, got {json.dumps(value)}")
            if schema.get("format") == "date-time" and value and not _DATE_TIME_RE.match(value):
                raise _bad(f"{where}: {value!r} is not an RFC 3339 timestamp")
            return value
        return value  # untyped (`{}`): any JSON value, e.g. runtime parameter values

    @staticmethod
    def _parse_enum(names: list[str], value: Any, where: str) -> str:
        # protojson accepts the enum's name or its number.
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < len(names):
            return names[value]
        if value not in names:
            raise _bad(f"{where}: invalid value {json.dumps(value)}, expected one of {names}")
        return value

    @staticmethod
    def _parse_integer(schema: dict[str, Any], value: Any, where: str) -> int | str:
        # protojson accepts numbers and decimal strings for every integer type, and writes 64-bit
        # integers as strings.
        if isinstance(value, bool) or not (
            isinstance(value, int) or (isinstance(value, str) and re.fullmatch(r"-?\d+", value))
        ):
            raise _bad(f"{where}: expected an integer, got {json.dumps(value)}")
        number = int(value)
        return str(number) if schema.get("format") in ("int64", "uint64") else number

    def _parse_object(self, schema: dict[str, Any], value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise _bad(f"{where}: expected an object, got {json.dumps(value)}")
        properties = schema.get("properties")
        if properties is None:  # a map (additionalProperties) or google.protobuf.Struct
            item_schema = schema.get("additionalProperties") or {}
            return {key: self._parse(item_schema, item, f"{where}.{key}") for key, item in value.items()}
        parsed = {}
        for key, item in value.items():
            if key not in properties:
                raise _bad(f'{where}: unknown field "{key}"')
            if item is None:  # JSON null means "not set" in protojson
                continue
            canonical = self._parse(properties[key], item, f"{where}.{key}")
            if not self._is_zero(properties[key], canonical):
                parsed[key] = canonical
        for key, field_schema in properties.items():
            if self._is_required(field_schema) and key not in parsed:
                raise _bad(f"{where}.{key} is required")
        return parsed

    def _is_zero(self, field_schema: dict[str, Any], canonical: Any) -> bool:
        """Whether a field holds its proto3 default, which protojson treats as unset."""
        if "$ref" in field_schema:
            field_schema = self.definitions[field_schema["$ref"].rsplit("/", 1)[-1]]
        if "enum" in field_schema:
            return canonical == field_schema["enum"][0]
        if field_schema.get("format") in ("int64", "uint64"):
            return canonical == "0"
        return canonical in ("", 0, [])  # also False; messages and maps count as set even when empty

    def _is_required(self, field_schema: dict[str, Any]) -> bool:
        description = field_schema.get("description", "")
        if not description and "$ref" in field_schema:
            description = self.definitions[field_schema["$ref"].rsplit("/", 1)[-1]].get("description", "")
        return bool(_REQUIRED_RE.match(description))


def _bad(message: str) -> ApiError:
    return ApiError(400, f"Invalid input error: {message}")


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


Handler = Callable[..., Any]
Upload = tuple[str, bytes]  # (file name, content) of a multipart file field


class FakeKfpApi:
    """In-memory state and request handling of the fake; HTTP-agnostic so it can be driven directly.

    Args:
        spec: The parsed swagger spec.
        token: When set, every request must carry ``Authorization: Bearer <token>`` (else 401), as
            behind the Kubeflow gateway.
        multi_user: Report multi-user mode in healthz and require a namespace for experiments.
        path_prefix: Serve the API below this prefix (e.g. ``/pipeline``, as behind the Kubeflow
            gateway); other paths answer 404.
    """

    def __init__(
        self, spec: dict[str, Any], *, token: str | None = None, multi_user: bool = False, path_prefix: str = ""
    ) -> None:
        self.schemas = SwaggerSchemas(spec)
        self.token = token
        self.multi_user = multi_user
        self.path_prefix = path_prefix.rstrip("/")
        self.url = ""  # set once the HTTP server is listening
        self.requests: list[LoggedRequest] = []
        self.pipelines: dict[str, dict[str, Any]] = {}
        self.versions: dict[str, dict[str, Any]] = {}
        self.experiments: dict[str, dict[str, Any]] = {}
        self.runs: dict[str, dict[str, Any]] = {}
        self.recurring_runs: dict[str, dict[str, Any]] = {}
        self._failures: dict[str, int] = {}
        self._lock = threading.Lock()
        self._routes: list[tuple[str, re.Pattern[str], Handler]] = [
            ("GET", re.compile(rf"{API}/healthz"), self._healthz),
            ("GET", re.compile(rf"{API}/pipelines"), self._list_pipelines),
            ("POST", re.compile(rf"{API}/pipelines/upload"), self._upload_pipeline),
            ("POST", re.compile(rf"{API}/pipelines/upload_version"), self._upload_version),
            ("GET", re.compile(rf"{API}/pipelines/(?P<pipeline_id>[^/]+)"), self._get_pipeline),
            ("GET", re.compile(rf"{API}/pipelines/(?P<pipeline_id>[^/]+)/versions"), self._list_versions),
            ("GET", re.compile(rf"{API}/experiments"), self._list_experiments),
            ("POST", re.compile(rf"{API}/experiments"), self._create_experiment),
            ("GET", re.compile(rf"{API}/experiments/(?P<experiment_id>[^/]+)"), self._get_experiment),
            ("POST", re.compile(rf"{API}/runs"), self._create_run),
            ("GET", re.compile(rf"{API}/runs"), self._list_runs),
            ("GET", re.compile(rf"{API}/runs/(?P<run_id>[^/:]+)"), self._get_run),
            ("DELETE", re.compile(rf"{API}/runs/(?P<run_id>[^/:]+)"), self._delete_run),
            ("POST", re.compile(rf"{API}/runs/(?P<run_id>[^/:]+):terminate"), self._terminate_run),
            ("POST", re.compile(rf"{API}/runs/(?P<run_id>[^/:]+):archive"), self._archive_run),
            ("POST", re.compile(rf"{API}/recurringruns"), self._create_recurring_run),
            ("GET", re.compile(rf"{API}/recurringruns"), self._list_recurring_runs),
            ("GET", re.compile(rf"{API}/recurringruns/(?P<recurring_run_id>[^/:]+)"), self._get_recurring_run),
            ("DELETE", re.compile(rf"{API}/recurringruns/(?P<recurring_run_id>[^/:]+)"), self._delete_recurring_run),
            ("POST", re.compile(rf"{API}/recurringruns/(?P<recurring_run_id>[^/:]+):enable"), self._enable_recurring),
            ("POST", re.compile(rf"{API}/recurringruns/(?P<recurring_run_id>[^/:]+):disable"), self._disable_recurring),
        ]

    # ------------------------------------------------------------------------------ test helpers

    def fail_once(self, path: str, status: int = 500) -> None:
        """Answer the next request to ``path`` (below the prefix, any method) with ``status``."""
        self._failures[path] = status

    def requests_to(self, method: str, path: str) -> list[LoggedRequest]:
        """The logged requests with this method and path (below the prefix, without query)."""
        return [r for r in self.requests if r.method == method and r.path == path]

    def add_run(self, **fields: Any) -> dict[str, Any]:
        """Store a run as the API server would hold it (a run made elsewhere, in any state, with ``run_details``);
        ``fields`` are v2beta1Run fields, checked against the spec. Returns the stored run."""
        defaults = {"display_name": "run", "runtime_config": {}, "run_id": str(uuid.uuid4()), "created_at": _now()}
        run = self.schemas.parse("v2beta1Run", {**defaults, "storage_state": "AVAILABLE", **fields})
        with self._lock:
            self.runs[run["run_id"]] = run
        return run

    def add_recurring_run(self, **fields: Any) -> dict[str, Any]:
        """Store a recurring run as the API server would hold one created earlier (``fields``: v2beta1RecurringRun
        fields, checked against the spec; enabled, every day at 02:00, by default). Returns the stored one."""
        defaults = {
            "recurring_run_id": str(uuid.uuid4()),
            "display_name": "nightly",
            "created_at": _now(),
            "mode": "ENABLE",
            "status": "ENABLED",
            "max_concurrency": "1",
            "trigger": {"cron_schedule": {"cron": "0 0 2 * * *"}},
        }
        recurring = self.schemas.parse("v2beta1RecurringRun", {**defaults, **fields})
        with self._lock:
            self.recurring_runs[recurring["recurring_run_id"]] = recurring
        return recurring

    def operation_of(self, request: LoggedRequest) -> str:
        """The swagger operationId the request calls; AssertionError when the spec has no such path and method or the
        request sends a query parameter the operation does not declare."""
        for template, operations in self.schemas.paths.items():
            pattern = re.sub(r"\\{[^}]+\\}", "[^/:]+", re.escape(template))
            operation = operations.get(request.method.lower())
            if operation is not None and re.fullmatch(pattern, request.path):
                declared = {p["name"] for p in operation.get("parameters", []) if p["in"] == "query"}
                unknown = set(request.query) - declared
                assert not unknown, f"{request.method} {request.path}: query {sorted(unknown)} not in the spec"
                return operation["operationId"]
        raise AssertionError(f"{request.method} {request.path} is not an operation of the KFP v2beta1 API")

    # ------------------------------------------------------------------------------ dispatching

    def handle(self, method: str, raw_path: str, headers: dict[str, str], body: bytes) -> tuple[int, bytes, str]:
        """Answer one HTTP request.

        Returns:
            (status, body, content type).
        """
        split = urlsplit(raw_path)
        if not (split.path == self.path_prefix or split.path.startswith(self.path_prefix + "/")):
            return 404, b"404 page not found\n", "text/plain; charset=utf-8"  # Go's NotFound
        path = split.path[len(self.path_prefix) :]
        headers = {name.lower(): value for name, value in headers.items()}
        query = parse_qs(split.query, keep_blank_values=True)
        form, files, payload = self._decode_body(headers.get("content-type", ""), body)
        with self._lock:
            self.requests.append(LoggedRequest(method, path, query, payload, form, headers))
        try:
            status, answer = 200, self._answer(method, path, query, headers, payload, files)
        except ApiError as error:
            status, answer = error.status, error.body()
        return status, json.dumps(answer).encode(), "application/json"

    def _answer(
        self,
        method: str,
        path: str,
        query: dict[str, list[str]],
        headers: dict[str, str],
        payload: Any,
        files: dict[str, Upload],
    ) -> Any:
        if self.token is not None and headers.get("authorization") != f"Bearer {self.token}":
            raise ApiError(401, "Unauthenticated: missing or invalid bearer token")
        with self._lock:
            failure = self._failures.pop(path, None)
        if failure is not None:
            raise ApiError(failure, "injected failure")
        for route_method, pattern, handler in self._routes:
            match = pattern.fullmatch(path)
            if match and route_method == method:
                args = {
                    "query": {k: v[-1] for k, v in query.items()},
                    "payload": payload,
                    "files": files,
                    **match.groupdict(),
                }
                with self._lock:
                    return handler(**args)
        raise ApiError(404, "Not Found")  # grpc-gateway's answer for an unknown route

    @staticmethod
    def _decode_body(content_type: str, body: bytes) -> tuple[dict[str, str], dict[str, Upload], Any]:
        """Split a request body into (form fields, uploaded files, JSON payload)."""
        if content_type.startswith("multipart/form-data"):
            message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
                b"Content-Type: " + content_type.encode() + b"\r\n\r\n" + body
            )
            form, files = {}, {}
            for part in message.iter_parts():
                name = part.get_param("name", header="content-disposition")
                data = part.get_payload(decode=True) or b""
                if part.get_filename() is not None:
                    files[name] = (part.get_filename(), data)
                    form[name] = part.get_filename()
                else:
                    form[name] = data.decode()
            return form, files, None
        if not body:
            return {}, {}, None
        try:
            return {}, {}, json.loads(body)
        except ValueError:
            return {}, {}, body.decode(errors="replace")  # rejected by the handler's schema check

    # ---------------------------------------------------------------------------------- handlers

    def _healthz(self, **_: Any) -> dict[str, Any]:
        return {"multi_user": self.multi_user, "pipeline_store": "database"}

    def _list_pipelines(self, query: dict[str, str], **_: Any) -> dict[str, Any]:
        namespace = query.get("namespace", "")
        matches = [
            p
            for p in self.pipelines.values()
            if p.get("namespace", "") == namespace and _matches(p, query.get("filter"))
        ]
        return _page("pipelines", matches)

    def _get_pipeline(self, pipeline_id: str, **_: Any) -> dict[str, Any]:
        return _lookup(self.pipelines, pipeline_id, "Pipeline")

    def _list_versions(self, pipeline_id: str, query: dict[str, str], **_: Any) -> dict[str, Any]:
        _lookup(self.pipelines, pipeline_id, "Pipeline")
        matches = [
            v for v in self.versions.values() if v["pipeline_id"] == pipeline_id and _matches(v, query.get("filter"))
        ]
        return _page("pipeline_versions", matches)

    def _upload_pipeline(self, query: dict[str, str], files: dict[str, Upload], **_: Any) -> dict[str, Any]:
        filename, spec = self._uploaded_spec(files)
        name = query.get("name") or query.get("display_name") or filename.rsplit(".", 1)[0]
        namespace = query.get("namespace", "")
        if any(p["name"] == name and p.get("namespace", "") == namespace for p in self.pipelines.values()):
            raise ApiError(409, "Failed to create a pipeline and a pipeline version", upload=True)
        pipeline = _compact(
            {
                "pipeline_id": str(uuid.uuid4()),
                "name": name,
                "display_name": query.get("display_name") or name,
                "description": query.get("description", ""),
                "namespace": namespace,
                "created_at": _now(),
            }
        )
        self.pipelines[pipeline["pipeline_id"]] = pipeline
        # The server names the first version after the pipeline.
        self._add_version(pipeline["pipeline_id"], name, query.get("description", ""), spec)
        return pipeline

    def _upload_version(self, query: dict[str, str], files: dict[str, Upload], **_: Any) -> dict[str, Any]:
        filename, spec = self._uploaded_spec(files)
        pipeline_id = query.get("pipelineid", "")
        if pipeline_id not in self.pipelines:
            raise ApiError(400, "Failed to create a pipeline version", upload=True)
        name = query.get("name") or query.get("display_name") or filename.rsplit(".", 1)[0]
        if any(v["pipeline_id"] == pipeline_id and v["name"] == name for v in self.versions.values()):
            raise ApiError(409, "Failed to create a pipeline version", upload=True)
        return self._add_version(pipeline_id, name, query.get("description", ""), spec)

    def _add_version(self, pipeline_id: str, name: str, description: str, spec: dict[str, Any]) -> dict[str, Any]:
        version = _compact(
            {
                "pipeline_id": pipeline_id,
                "pipeline_version_id": str(uuid.uuid4()),
                "name": name,
                "display_name": name,
                "description": description,
                "created_at": _now(),
                "pipeline_spec": spec,
            }
        )
        self.versions[version["pipeline_version_id"]] = version
        return version

    @staticmethod
    def _uploaded_spec(files: dict[str, Upload]) -> tuple[str, dict[str, Any]]:
        """The uploaded file name and its pipeline spec, strictly parsed as KFP IR."""
        if "uploadfile" not in files:
            raise ApiError(400, "Failed to read pipeline from file", upload=True)
        filename, data = files["uploadfile"]
        if len(data) > _MAX_UPLOAD_BYTES:
            raise ApiError(413, "pipeline file exceeds 32MB", upload=True)
        try:
            documents = list(yaml.safe_load_all(data))
            json_format.ParseDict(documents[0], pipeline_spec_pb2.PipelineSpec())
            for platform in documents[1:]:
                json_format.ParseDict(platform, pipeline_spec_pb2.PlatformSpec())
        except (yaml.YAMLError, json_format.ParseError, IndexError, TypeError, AttributeError):
            raise ApiError(400, "Failed to read a pipeline spec file", upload=True) from None
        return filename, documents[0]

    def _list_experiments(self, query: dict[str, str], **_: Any) -> dict[str, Any]:
        namespace = query.get("namespace", "")
        if self.multi_user and not namespace:
            raise _bad("In multi-user mode, ListExperiment requires filtering by namespace")
        matches = [
            e
            for e in self.experiments.values()
            if e.get("namespace", "") == namespace and _matches(e, query.get("filter"))
        ]
        return _page("experiments", matches)

    def _create_experiment(self, payload: Any, **_: Any) -> dict[str, Any]:
        experiment = self.schemas.parse("v2beta1Experiment", payload)
        namespace = experiment.get("namespace", "")
        if self.multi_user and not namespace:
            raise _bad("In multi-user mode, experiment namespace must be specified")
        if any(
            e["display_name"] == experiment["display_name"] and e.get("namespace", "") == namespace
            for e in self.experiments.values()
        ):
            raise ApiError(409, f"Experiment {experiment['display_name']!r} already exists")
        experiment.update(experiment_id=str(uuid.uuid4()), created_at=_now(), storage_state="AVAILABLE")
        self.experiments[experiment["experiment_id"]] = experiment
        return experiment

    def _get_experiment(self, experiment_id: str, **_: Any) -> dict[str, Any]:
        return _lookup(self.experiments, experiment_id, "Experiment")

    def _create_run(self, payload: Any, **_: Any) -> dict[str, Any]:
        run = self.schemas.parse("v2beta1Run", payload)
        self._check_run_target(run)
        run.update(run_id=str(uuid.uuid4()), created_at=_now(), state="PENDING", storage_state="AVAILABLE")
        self.runs[run["run_id"]] = run
        return run

    def _get_run(self, run_id: str, **_: Any) -> dict[str, Any]:
        return _lookup(self.runs, run_id, "Run")

    def _list_runs(self, query: dict[str, str], **_: Any) -> dict[str, Any]:
        """ListRuns: by experiment or namespace, a filter, ``sort_by`` ("<field>[ desc]") and pages (the page token
        is the offset of the next page)."""
        runs = [r for r in self.runs.values() if _matches(r, query.get("filter"))]
        if query.get("experiment_id"):
            runs = [r for r in runs if r.get("experiment_id") == query["experiment_id"]]
        elif self.multi_user:
            namespace = query.get("namespace", "")
            if not namespace:
                raise _bad("In multi-user mode, ListRuns requires filtering by namespace or experiment")
            runs = [
                r for r in runs if self.experiments.get(r.get("experiment_id", ""), {}).get("namespace") == namespace
            ]
        return _sorted_page("runs", runs, query)

    def _delete_run(self, run_id: str, **_: Any) -> dict[str, Any]:
        _lookup(self.runs, run_id, "Run")
        del self.runs[run_id]
        return {}

    def _terminate_run(self, run_id: str, **_: Any) -> dict[str, Any]:
        """The server marks a run it can still stop CANCELING; the persistence agent later records CANCELED."""
        run = _lookup(self.runs, run_id, "Run")
        if run.get("state") in ("SUCCEEDED", "FAILED", "CANCELED", "SKIPPED"):
            raise ApiError(400, f"Failed to terminate run {run_id}: the run has already finished ({run['state']})")
        run["state"] = "CANCELING"
        return {}

    def _archive_run(self, run_id: str, **_: Any) -> dict[str, Any]:
        _lookup(self.runs, run_id, "Run")["storage_state"] = "ARCHIVED"
        return {}

    def _create_recurring_run(self, payload: Any, **_: Any) -> dict[str, Any]:
        recurring = self.schemas.parse("v2beta1RecurringRun", payload)
        self._check_run_target(recurring)
        _check_trigger(recurring["trigger"])
        if not 1 <= int(recurring["max_concurrency"]) <= 10:
            raise _bad(
                "Max concurrency of a recurring run must be at least 1 and at most 10. "
                f"Received {recurring['max_concurrency']}"
            )
        experiment = self.experiments[recurring["experiment_id"]]
        recurring.update(
            recurring_run_id=str(uuid.uuid4()),
            created_at=_now(),
            updated_at=_now(),
            status="ENABLED" if recurring["mode"] == "ENABLE" else "DISABLED",
            namespace=experiment.get("namespace", ""),
        )
        self.recurring_runs[recurring["recurring_run_id"]] = _compact(recurring)
        return self.recurring_runs[recurring["recurring_run_id"]]

    def _get_recurring_run(self, recurring_run_id: str, **_: Any) -> dict[str, Any]:
        return _lookup(self.recurring_runs, recurring_run_id, "RecurringRun")

    def _list_recurring_runs(self, query: dict[str, str], **_: Any) -> dict[str, Any]:
        """ListRecurringRuns: by experiment or namespace (required in multi-user mode, as for runs), newest first
        with ``sort_by`` "created_at desc", in pages (the token is the next page's offset)."""
        found = list(self.recurring_runs.values())
        if query.get("experiment_id"):
            found = [r for r in found if r.get("experiment_id") == query["experiment_id"]]
        elif self.multi_user:
            if not query.get("namespace"):
                raise _bad("In multi-user mode, ListRecurringRuns requires filtering by namespace or experiment")
            found = [r for r in found if r.get("namespace") == query["namespace"]]
        return _sorted_page("recurringRuns", found, query)

    def _delete_recurring_run(self, recurring_run_id: str, **_: Any) -> dict[str, Any]:
        _lookup(self.recurring_runs, recurring_run_id, "RecurringRun")
        del self.recurring_runs[recurring_run_id]
        return {}

    def _enable_recurring(self, recurring_run_id: str, **_: Any) -> dict[str, Any]:
        found = _lookup(self.recurring_runs, recurring_run_id, "RecurringRun")
        found.update(mode="ENABLE", status="ENABLED", updated_at=_now())
        return {}

    def _disable_recurring(self, recurring_run_id: str, **_: Any) -> dict[str, Any]:
        found = _lookup(self.recurring_runs, recurring_run_id, "RecurringRun")
        found.update(mode="DISABLE", status="DISABLED", updated_at=_now())
        return {}

    def _check_run_target(self, run: dict[str, Any]) -> None:
        """The API server's checks of a run's experiment, pipeline version and parameters."""
        if not run.get("experiment_id"):
            raise _bad("experiment_id is required (the fake has no default experiment)")
        _lookup(self.experiments, run["experiment_id"], "Experiment")
        if ("pipeline_spec" in run) == ("pipeline_version_reference" in run):
            raise _bad("Exactly one of pipeline_spec or pipeline_version_reference must be set")
        spec = run.get("pipeline_spec")
        if "pipeline_version_reference" in run:
            reference = run["pipeline_version_reference"]
            _lookup(self.pipelines, reference["pipeline_id"], "Pipeline")
            if "pipeline_version_id" not in reference:  # "If unset, the latest pipeline version is used."
                reference["pipeline_version_id"] = [
                    v for v in self.versions.values() if v["pipeline_id"] == reference["pipeline_id"]
                ][-1]["pipeline_version_id"]
            version = _lookup(self.versions, reference["pipeline_version_id"], "PipelineVersion")
            if version["pipeline_id"] != reference["pipeline_id"]:
                raise _bad(
                    f"Pipeline version {version['pipeline_version_id']} does not belong to "
                    f"pipeline {reference['pipeline_id']}"
                )
            spec = version["pipeline_spec"]
        declared = spec.get("root", {}).get("inputDefinitions", {}).get("parameters", {})
        for name in run.get("runtime_config", {}).get("parameters", {}):
            if name not in declared:
                raise _bad(f"Parameter {name!r} is not declared by the pipeline (declared: {sorted(declared)})")


def _check_trigger(trigger: dict[str, Any]) -> None:
    """Trigger is a oneof: a cron schedule or a periodic schedule, with a usable value."""
    if ("cron_schedule" in trigger) == ("periodic_schedule" in trigger):
        raise _bad("trigger must set exactly one of cron_schedule or periodic_schedule")
    if "cron_schedule" in trigger:
        cron = trigger["cron_schedule"].get("cron", "")
        if not _CRON_SHAPE_RE.match(cron):
            raise _bad(
                "Schedule cron is not a supported format(https://godoc.org/github.com/robfig/cron). "
                f"Error: expected 5 or 6 fields, found: {cron!r}"
            )
    elif int(trigger["periodic_schedule"].get("interval_second", "0")) < 1:
        raise _bad("Found invalid period schedule interval. Set at interval to least 1 second")


def _matches(resource: dict[str, Any], raw_filter: str | None) -> bool:
    """Apply a ListXxx ``filter`` (a JSON v2beta1Filter); only EQUALS on string fields is supported."""
    if not raw_filter:
        return True
    try:
        predicates = json.loads(raw_filter).get("predicates", [])
    except (ValueError, AttributeError):
        raise _bad(f"filter is not a JSON Filter: {raw_filter!r}") from None
    for predicate in predicates:
        if predicate.get("operation") not in (1, "EQUALS"):
            raise _bad(f"the fake supports only EQUALS predicates, got {predicate!r}")
        # protojson reads both the proto name and the lowerCamel JSON name.
        expected = predicate.get("string_value", predicate.get("stringValue"))
        if resource.get(predicate.get("key", "")) != expected:
            return False
    return True


def _sorted_page(field: str, items: list[dict[str, Any]], query: dict[str, str]) -> dict[str, Any]:
    """One page of ``items`` as a List call answers: ``sort_by`` ("<field>[ desc]"), ``page_size`` (default 20) from
    ``page_token`` (the offset), a ``next_page_token`` while more are left, and the total."""
    key, _, order = (query.get("sort_by") or "created_at").partition(" ")
    items = sorted(items, key=lambda r: str(r.get(key, "")), reverse=order == "desc")
    size = int(query.get("page_size") or 0) or 20
    start = int(query.get("page_token") or 0)
    page = _page(field, items[start : start + size])
    if start + size < len(items):
        page["next_page_token"] = str(start + size)
    page["total_size"] = len(items)
    return page


def _page(field: str, items: list[dict[str, Any]]) -> dict[str, Any]:
    # Like protojson: an empty list and a zero total are left out.
    return _compact({field: items, "total_size": len(items)})


def _compact(message: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in message.items() if value not in ("", 0, [], None)}


def _lookup(table: dict[str, dict[str, Any]], key: str, kind: str) -> dict[str, Any]:
    if key not in table:
        raise ApiError(404, f"{kind} {key!r} not found")
    return table[key]


class _RequestHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as urllib3 pools connections
    timeout = 10  # lets idle keep-alive handler threads end
    disable_nagle_algorithm = True  # headers and body go out as two writes; don't wait for delayed ACKs
    server: _FakeHttpServer

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        status, body, content_type = self.server.api.handle(
            self.command, self.path, dict(self.headers.items()), self.rfile.read(length)
        )
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _serve

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - BaseHTTPRequestHandler's name
        """Stay quiet: tests read ``FakeKfpApi.requests`` instead of the access log."""


class _FakeHttpServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, api: FakeKfpApi) -> None:
        super().__init__(("127.0.0.1", 0), _RequestHandler)
        self.api = api


def load_swagger(path: Path = SWAGGER_PATH) -> dict[str, Any]:
    """The KFP v2beta1 swagger spec; FileNotFoundError names the path when it is absent."""
    if not path.is_file():
        raise FileNotFoundError(f"KFP swagger spec not found at {path}")
    return json.loads(path.read_text())


@contextlib.contextmanager
def running_fake_kfp(
    *, token: str | None = None, multi_user: bool = False, path_prefix: str = ""
) -> Iterator[FakeKfpApi]:
    """Run a fake KFP API server on 127.0.0.1 in a background thread for the duration of the block.

    Args:
        token: Require ``Authorization: Bearer <token>`` on every request.
        multi_user: Behave as a multi-user deployment (namespace required for experiments).
        path_prefix: Serve below this path prefix, e.g. ``/pipeline``.

    Yields:
        The fake, with ``url`` (including the prefix) set, its state and its request log.
    """
    api = FakeKfpApi(load_swagger(), token=token, multi_user=multi_user, path_prefix=path_prefix)
    server = _FakeHttpServer(api)
    host, port = server.server_address[:2]
    api.url = f"http://{host}:{port}{api.path_prefix}"
    # A short poll interval makes shutdown() at the end of each test return quickly.
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.02}, name="fake-kfp-api", daemon=True
    )
    thread.start()
    try:
        yield api
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
