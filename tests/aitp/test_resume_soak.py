"""Many drops in a row on one conversation: the page drops its socket at
random points of its turns (before answering a call, after answering it,
after the answer) and comes back with its token each time. Whatever the
point, the conversation goes on as one session, the model is never sent a
call without exactly one result, every call of the ledger ends, and no call
reaches the page twice."""
from __future__ import annotations

import random

import pytest

from agent.conversation import Conversation
from aitp.models import ConversationMessage, Session, ToolCall
from tests.aitp.conftest import ADD_TO_CART, ORIGIN

pytestmark = [pytest.mark.django_db(transaction=True)]

DROPS = 60
WHERE = ("before_the_result", "after_the_result", "after_the_answer")


async def resumed(connect, raw_key: str, token: str | None):
    page = await connect(origin=ORIGIN)
    answer = await page.handshake(raw_key, resume={"token": token} if token else {})
    assert answer["type"] == "HANDSHAKE_ACK", answer
    ack = answer["payload"]
    await page.context(url="/products/headphones", title="Pro Headphones", tools=[ADD_TO_CART])
    return page, ack


async def test_sixty_drops_at_random_points_leave_one_conversation_whole(connect, api_key):
    chance = random.Random(28)
    token, session_id, calls_seen = None, None, []

    for _ in range(DROPS):
        page, ack = await resumed(connect, api_key.raw, token)
        assert session_id in (None, ack["sessionId"]) and (token is None or ack["resumed"])
        session_id, token = ack["sessionId"], ack["resumeToken"]
        where = chance.choice(WHERE)
        await page.send("USER_INPUT", {"modality": "text", "content": '/tool add_to_cart {"quantity": 1}'})
        call = (await page.recv_until("TOOL_CALL", timeout=15))["payload"]["callId"]
        calls_seen.append(call)
        if where != "before_the_result":
            await page.send("TOOL_RESULT", {"callId": call, "status": "success", "result": {"added": True}})
        if where == "after_the_answer":
            await page.recv_until("AGENT_RESPONSE", timeout=15, done=True)
        await page.ws.disconnect(code=chance.choice((1001, 1006)), timeout=15)

    stored = [{"seq": m.seq, "role": m.role, "content": m.content} async for m in
              ConversationMessage.objects.filter(session_id=session_id).order_by("seq")]
    history = Conversation.restored(stored).history
    uses = [b["id"] for m in history if m["role"] == "assistant" for b in m["content"] if b["type"] == "tool_use"]
    results = [b["tool_use_id"] for m in history if m["role"] == "user" for b in m["content"]
               if b["type"] == "tool_result"]
    assert sorted(uses) == sorted(results) and len(set(uses)) == len(uses) == DROPS
    assert [m["role"] for m in history] == [("user", "assistant")[n % 2] for n in range(len(history))]
    assert len(set(calls_seen)) == DROPS
    statuses = [c.status async for c in ToolCall.objects.filter(session_id=session_id)]
    assert len(statuses) == DROPS and all(s in ToolCall.FINAL_STATUSES for s in statuses)
    row = await Session.objects.aget(id=session_id)
    assert row.resumes == DROPS - 1 and len(row.sockets) == DROPS
