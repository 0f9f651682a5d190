"""A conversation read again over HTTP (docs/protocol.md §3b): what lets a
widget draw the earlier messages after a reload without a copy of its own.

``POST <OWLLAYER_WS_PATH>/conversation`` with the body
``{"apiKey": "<publishable key>", "token": "<resume token>"}`` sent as plain
text, so a browser sends it across origins without a preflight, and the
token never appears in a URL or an access log. The answer is JSON:
``{"sessionId", "messages": [...], "truncated"}`` (aitp.transcript.
visible_history), or ``{"error": {"code", "message"}}`` with 400 (the body),
401/403 (the key, as a handshake would refuse it) or 404 (no conversation
for this token: forged, spent, of another key or origin, past the window,
or ended for good). The page's origin must be the session's and one the key
allows; the answer carries ``Access-Control-Allow-Origin`` for that origin
only. Reading spends nothing: the token still serves the next socket.
"""
from __future__ import annotations

import json

from django.http import JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from aitp import resume, transcript
from aitp.models import ConversationMessage
from aitp.store import resuming
from runtime.config import config

# A body larger than this is no request of this kind.
MAX_BODY_BYTES = 4096
# The key refusals a page's credentials are at fault for (401); the others, 403.
UNAUTHORISED = frozenset({"invalid_api_key"})


def _error(status: int, code: str, message: str, origin: str | None = None) -> JsonResponse:
    return _allowed(JsonResponse({"error": {"code": code, "message": message}}, status=status), origin)


def _allowed(answer: JsonResponse, origin: str | None) -> JsonResponse:
    """The answer readable by this origin's page (only once the key allows it)."""
    answer["Vary"] = "Origin"
    if origin:
        answer["Access-Control-Allow-Origin"] = origin
    return answer


def _credentials(request) -> tuple[str, str] | None:
    if len(request.body) > MAX_BODY_BYTES:
        return None
    try:
        body = json.loads(request.body)
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(body, dict) or not isinstance(body.get("apiKey"), str) \
            or not isinstance(body.get("token"), str):
        return None
    return body["apiKey"], body["token"]


@csrf_exempt
@never_cache
@require_POST
def conversation(request):
    credentials = _credentials(request)
    if credentials is None:
        return _error(400, "invalid_message", 'The body must be {"apiKey": ..., "token": ...} as JSON.')
    raw_key, offered = credentials
    origin = request.headers.get("Origin", "")
    token = resume.parse(offered)
    if token is None:
        return _error(404, "unknown_conversation", "No conversation goes on with this token.")
    session, refusal = resuming.readable_session(raw_key=raw_key, token=token, origin=origin,
                                                 window=config().protocol.resume_window)
    if refusal is not None:
        return _error(401 if refusal.code in UNAUTHORISED else 403, refusal.code, refusal.message)
    if session is None:
        return _error(404, "unknown_conversation", "No conversation goes on with this token.", origin)
    messages, truncated = transcript.visible_history(
        ConversationMessage.objects.filter(session=session).order_by("seq").only("seq", "turn", "role",
                                                                                 "content"))
    return _allowed(JsonResponse({"sessionId": session.id, "messages": messages, "truncated": truncated}),
                    origin)
