"""Server tools that answer hostile values, for tests: a Python tool and a
webhook receiver (a real HTTP server on 127.0.0.1), both told what to answer
by the call's own arguments (``{"kind": name}``, a name of the tables in
``tests.aitp.hostile``)."""
from __future__ import annotations

import json
import threading
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from approvals.server_tools import ToolRunError, register_python_tool
from tests.aitp.hostile import (
    HOSTILE_RETURNS,
    HOSTILE_WEBHOOK_BODIES,
    MORE_RETURNS,
    MORE_WEBHOOK_BODIES,
)

PYTHON_TOOL = "hostile_python_answer"
KIND = {"type": "OBJECT", "properties": {"kind": {"type": "STRING"}}, "required": ["kind"]}
RETURNS = {**HOSTILE_RETURNS, **MORE_RETURNS}
BODIES = {**HOSTILE_WEBHOOK_BODIES, **MORE_WEBHOOK_BODIES}

# Values a test queued for the kind "next" (drawn by hypothesis), oldest first.
QUEUED: deque = deque()


@register_python_tool(PYTHON_TOOL, description="Answers what the test asks for", parameters=KIND)
def hostile_python_answer(args: dict, *, session_id: str, tenant_id: int):
    if args["kind"] == "next":
        return QUEUED.popleft() if QUEUED else None
    if args["kind"] == "fails_in_bad_words":
        raise ToolRunError("card \ud83d declined\x00")
    return RETURNS.get(args["kind"])


class _Answers(BaseHTTPRequestHandler):
    def log_message(self, *args) -> None:  # keep test output quiet
        pass

    def do_POST(self) -> None:
        try:
            request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        except ValueError:
            return  # the caller gave up half way (its turn was cut): nobody to answer
        body = BODIES.get(request["arguments"].get("kind"), b"{}")
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class HostileReceiver:
    """A tenant's webhook endpoint answering ``BODIES[arguments.kind]``."""

    def __enter__(self) -> HostileReceiver:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Answers)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/answer"

    def __exit__(self, *exc_info) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()


def offer_hostile_tools(tenant, webhook_url: str, *, webhook_name: str = "hostile_webhook_answer",
                        python_name: str = PYTHON_TOOL) -> None:
    """Offer both tools to the tenant (low risk: they run without asking)."""
    from approvals.models import ServerTool

    ServerTool.objects.create(tenant=tenant, name=python_name, kind=ServerTool.Kind.PYTHON,
                              python_handler=PYTHON_TOOL)
    ServerTool.objects.create(tenant=tenant, name=webhook_name, description="Answers what it is asked",
                              kind=ServerTool.Kind.WEBHOOK, webhook_url=webhook_url, parameters=KIND,
                              webhook_networks="127.0.0.1/32")
