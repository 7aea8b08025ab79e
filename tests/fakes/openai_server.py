"""A local OpenAI-compatible chat endpoint standing in for the model server (vLLM, ``transformers serve``)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class OpenAIServer:
    """A local OpenAI-compatible chat endpoint; ``fail`` makes it answer 500; each request also appends
    "smoke" to ``events`` (to check what happened before it)."""

    def __init__(self, fail: bool = False, events: list | None = None):
        self.fail, self.requests, self.events = fail, [], events if events is not None else []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests.append((self.path, body))
                outer.events.append("smoke")
                reply = {"index": 0, "message": {"role": "assistant", "content": "Hi! How can I help?"}}
                status, payload = (
                    (500, {"error": "CUDA out of memory"})
                    if outer.fail
                    else (200, {"object": "chat.completion", "model": body["model"], "choices": [reply]})
                )
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
