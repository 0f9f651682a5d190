"""A conversation read again over HTTP (docs/protocol.md §3b, §3c): what
lets a widget draw the earlier messages after a reload without a copy of
its own, or a visitor's last conversation on a later visit.

``POST <OWLLAYER_WS_PATH>/conversation`` with the body
``{"apiKey": "<publishable key>", "token": "<resume token>"}`` (that
session's conversation) or ``{"apiKey": ..., "visitorToken": "<JWT>"}``
(the visitor's latest conversation among the key's tenant's), sent as plain
text, so a browser sends it across origins without a preflight, and no
token appears in a URL or an access log. The answer is JSON:
``{"sessionId", "startedAt", "messages": [...], "truncated"}`` (aitp.transcript.
visible_history), or ``{"error": {"code", "message"}}`` with 400 (the body),
401/403 (the key, as a handshake would refuse it; 401 a visitor token
refused) or 404 (no conversation for this token: forged, spent, of another
key or origin, past the window, or ended for good). The key must allow the
page's origin (a resume token's session must be of that origin too); the
answer carries ``Access-Control-Allow-Origin`` for that origin only.
Reading spends nothing: a resume token still serves the next socket.
"""
from __future__ import annotations

import json
import time

from django.http import JsonResponse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from aitp import resume, selectors, transcript, visitors
from aitp.models import ApiKey, ConversationMessage, Session
from aitp.store import admission, keys, resuming
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


def _credentials(request) -> dict | None:
    """{"apiKey", and "token" or "visitorToken"}, all strings; None when the body is not that."""
    if len(request.body) > MAX_BODY_BYTES:
        return None
    try:
        body = json.loads(request.body)
    except (UnicodeDecodeError, ValueError):
        return None
    if not isinstance(body, dict) or not isinstance(body.get("apiKey"), str):
        return None
    tokens = [name for name in ("token", "visitorToken") if name in body]
    if len(tokens) != 1 or not isinstance(body[tokens[0]], str):
        return None
    return body


UNKNOWN = "unknown_conversation"


def _resumed(key: ApiKey, offered: str, origin: str) -> Session | str:
    """The session the resume token reads, or why none."""
    token = resume.parse(offered)
    session = token and resuming.readable_session(key=key, token=token, origin=origin,
                                                  window=config().protocol.resume_window)
    return session or "No conversation goes on with this token."


def _visitors_last(key: ApiKey, token: str) -> Session | visitors.VisitorRefusal | str:
    """The latest conversation of the visitor the token vouches for, among
    the key's tenant's sessions; or why none."""
    found = visitors.visitor_id(token, selectors.visitor_secret(key.tenant_id), now=time.time())
    if isinstance(found, visitors.VisitorRefusal):
        return found
    return selectors.visitor_last_conversation(key.tenant_id, found) or "This visitor has no conversation yet."


@csrf_exempt
@never_cache
@require_POST
def conversation(request):
    credentials = _credentials(request)
    if credentials is None:
        return _error(400, "invalid_message",
                      'The body must be {"apiKey": ..., "token": ...} or {"apiKey": ..., "visitorToken": ...} '
                      "as JSON.")
    origin = request.headers.get("Origin", "")
    key = keys.api_key_lookup(credentials["apiKey"])
    refusal = admission.api_key_refusal(key, origin=origin, now=timezone.now())
    if refusal is not None or key is None:
        code, message = (refusal.code, refusal.message) if refusal else ("invalid_api_key", "")
        return _error(401 if code in UNAUTHORISED else 403, code, message)
    found = _visitors_last(key, credentials["visitorToken"]) if "visitorToken" in credentials else \
        _resumed(key, credentials["token"], origin)
    if isinstance(found, visitors.VisitorRefusal):
        return _error(401, found.code, found.message, origin)
    if isinstance(found, str):
        return _error(404, UNKNOWN, found, origin)
    session = found
    messages, truncated = transcript.visible_history(
        ConversationMessage.objects.filter(session=session).order_by("seq").only("seq", "turn", "role",
                                                                                 "content"))
    return _allowed(JsonResponse({"sessionId": session.id, "startedAt": session.started_at.isoformat(),
                                  "messages": messages, "truncated": truncated}), origin)
