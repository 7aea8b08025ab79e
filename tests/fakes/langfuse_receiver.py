"""Langfuse's ingestion endpoint on localhost: records what the Langfuse SDK sends, decoded.

The Python SDK (v3 and later; v5 here) exports OpenTelemetry spans with OTLP over HTTP, protobuf-encoded, to
``{LANGFUSE_HOST}/api/public/otel/v1/traces`` with HTTP Basic auth ``public_key:secret_key``
(langfuse/_client/span_processor.py); Langfuse's observation fields are span attributes named
``langfuse.observation.*`` and ``langfuse.trace.*`` (langfuse/_client/attributes.py). The receiver decodes each
request with OpenTelemetry's own protobuf classes and keeps every span as a plain dict.
"""

from __future__ import annotations

import base64
import gzip
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

TRACES_PATH = "/api/public/otel/v1/traces"


def _value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


class LangfuseReceiver:
    """``url`` is the LANGFUSE_HOST to give the SDK; ``spans`` every span received (name, ids, attributes with
    JSON-string values decoded where they parse), ``auth`` the (public, secret) pairs the requests carried."""

    def __init__(self):
        self.spans: list[dict] = []
        self.auth: list[tuple[str, str]] = []
        self.paths: list[str] = []
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver.paths.append(self.path)
                scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
                if scheme == "Basic":
                    public, _, secret = base64.b64decode(token).decode().partition(":")
                    receiver.auth.append((public, secret))
                if self.path == TRACES_PATH:
                    request = trace_service_pb2.ExportTraceServiceRequest()
                    request.ParseFromString(body)
                    for resource in request.resource_spans:
                        for scope in resource.scope_spans:
                            for span in scope.spans:
                                receiver.spans.append(receiver._span(span))
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"

    @staticmethod
    def _span(span) -> dict:
        attributes = {}
        for kv in span.attributes:
            value = _value(kv.value)
            if isinstance(value, str):
                try:
                    value = json.loads(value)
                except ValueError:
                    pass
            attributes[kv.key] = value
        return {
            "name": span.name,
            "trace_id": span.trace_id.hex(),
            "span_id": span.span_id.hex(),
            "parent_span_id": span.parent_span_id.hex(),
            "attributes": attributes,
        }

    def by_type(self, kind: str) -> list[dict]:
        """The spans whose ``langfuse.observation.type`` is ``kind`` (span, generation, event, ...)."""
        return [s for s in self.spans if s["attributes"].get("langfuse.observation.type") == kind]

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
