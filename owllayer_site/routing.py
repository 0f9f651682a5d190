"""The WebSocket endpoints: the AITP endpoint (OWLLAYER_WS_PATH), the staff
watch socket, and an answer for every other path.

A page whose endpoint is mistyped must learn it at once: a refusal at the
HTTP upgrade would look like a network failure its client retries, and an
unmatched path used to end in a server error with a traceback. So any other
path is accepted, told ``unknown_endpoint`` (naming the right path) and
closed with 1008, which the client takes as final and shows.
"""
import logging

from django.urls import path, re_path

from aitp import protocol as p
from aitp.close_codes import CLOSE_POLICY
from aitp.consumer import AitpConsumer
from connection.runner import ConnectionRunner
from operators.routing import websocket_urlpatterns as operator_websocket_urlpatterns
from runtime.config import config

logger = logging.getLogger(__name__)

# What of the client's path goes back into the error message and the log.
SHOWN_PATH_CHARS = 100


async def unknown_endpoint(scope, receive, send) -> None:
    """A raw ASGI app: no session, no channel layer, no database."""
    shown = scope.get("path", "")[:SHOWN_PATH_CHARS]
    while True:
        message = await receive()
        if message["type"] == "websocket.connect":
            logger.info("websocket to unknown path %r refused (1008)", shown)
            await send({"type": "websocket.accept"})
            refusal = p.error_event(
                "unknown_endpoint",
                f"There is no OwlLayer endpoint at {shown}; "
                f"the endpoint is {config().protocol.ws_path}.",
            )
            await send({"type": "websocket.send", "text": p.serialize(refusal)})
            await send({"type": "websocket.close", "code": CLOSE_POLICY, "reason": "unknown endpoint"})
        elif message["type"] == "websocket.disconnect":
            return


websocket_urlpatterns = [
    path(config().protocol.ws_path.lstrip("/"), AitpConsumer.as_asgi(runner=ConnectionRunner)),
    *operator_websocket_urlpatterns,
    # Last: whatever no route above took.
    re_path(r"", unknown_endpoint),
]
