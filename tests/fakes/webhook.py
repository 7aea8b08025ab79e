"""An incoming webhook (Slack's kind) on localhost that fails the way Slack's does, for the alert tests."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOKEN_PATH = "/services/T0001/B0002/s3cr3tT0k3n"  # an incoming webhook's path is its credential


class Hook:
    """An incoming webhook on localhost that answers each POST with the next scripted reply, then 200 ``ok``.

    A reply is ``(status, headers, body)``, ``"drop"`` (read the request, close the connection without an
    answer) or ``"hang"`` (answer nothing for ``hang_seconds``, longer than the client waits). Every request is
    kept with its arrival time.
    """

    def __init__(self, *replies, hang_seconds: float = 2.5):
        self.replies = list(replies)
        self.requests: list[dict] = []
        hook = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                hook.requests.append(
                    {"path": self.path, "headers": dict(self.headers), "body": body, "at": time.monotonic()}
                )
                reply = hook.replies.pop(0) if hook.replies else (200, {}, "ok")
                if reply == "drop":
                    self.close_connection = True
                    return
                if reply == "hang":
                    time.sleep(hang_seconds)
                    self.close_connection = True
                    return
                status, headers, text = reply
                self.send_response(status)
                for k, v in {"Content-Type": "text/plain", **headers}.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(text)))
                self.end_headers()
                self.wfile.write(text.encode())

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}{TOKEN_PATH}"

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()
