"""A voice turn in the tenant's pages: the usage page counts the seconds of
speech heard and spoken per day and per session, and a session's record
shows what was heard, what was said and where a barge-in cut it -- in the
console and on the operators' live page alike. The record is built through
the services a voice turn writes with (tests/aitp/test_voice_usage.py makes
it with a real turn)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from django.urls import reverse
from django.utils import timezone

from agent.voice import voice_record
from aitp import store
from aitp.models import DailyUsage, Session
from aitp.store import usage
from aitp.transcript import INTERRUPTED_NOTE, Block, message_blocks
from tests.console.conftest import make_session

pytestmark = pytest.mark.django_db

SPEAKING = SimpleNamespace(failed=None)


@pytest.fixture
def at_once(settings, monkeypatch):
    """Usage counts written as they come, by a buffer of this test's own."""
    settings.OWLLAYER_USAGE_FLUSH_INTERVAL = 0
    monkeypatch.setattr(usage, "_usage", usage.UsageBuffer())


def voice_turn(session: Session, *, turn: int, seq: int, heard: str, said: str, interrupted: bool,
               heard_ms: int, spoken_ms: int) -> None:
    """One voice turn's last checkpoint, as the agent writes it."""
    messages = [
        {"seq": seq, "role": "user",
         "content": voice_record("user", [{"type": "text", "text": heard}], SPEAKING, interrupted=False)},
        {"seq": seq + 1, "role": "assistant",
         "content": voice_record("assistant", [{"type": "text", "text": said}], SPEAKING,
                                 interrupted=interrupted)},
    ]
    store.current().turn_checkpoint(
        session_id=session.pk, tenant_id=session.tenant_id, turn=turn, messages=messages,
        usage={"turns": 1, "input_tokens": 10, "output_tokens": 5, "cache_read_tokens": 0,
               "cache_write_tokens": 0, "audio_heard_ms": heard_ms, "audio_spoken_ms": spoken_ms},
    )


def typed_turn(session: Session, *, turn: int, seq: int) -> None:
    store.current().turn_checkpoint(
        session_id=session.pk, tenant_id=session.tenant_id, turn=turn,
        messages=[{"seq": seq, "role": "user", "content": [{"type": "text", "text": "thanks"}]},
                  {"seq": seq + 1, "role": "assistant", "content": [{"type": "text", "text": "Of course."}]}],
        usage={"turns": 1, "input_tokens": 10, "output_tokens": 5, "cache_read_tokens": 0,
               "cache_write_tokens": 0},
    )


def test_a_voice_turns_text_reads_as_heard_said_or_interrupted_and_only_the_cut_has_a_note():
    blocks = message_blocks([
        {"type": "text", "text": "what is in my cart", "voice": "heard"},
        {"type": "text", "text": "Two pairs.", "voice": "said"},
        {"type": "text", "text": "They ship", "voice": "interrupted"},
        {"type": "text", "text": "typed"},
    ])
    assert [(b.kind, b.voice) for b in blocks] == [("text", "heard"), ("text", "said"),
                                                   ("text", "interrupted"), ("text", "")]
    assert [b.title for b in blocks] == ["heard (spoken by the page user)", "said aloud",
                                         "said aloud until the page user interrupted", ""]
    assert [b.cut_note for b in blocks] == ["", "", INTERRUPTED_NOTE, ""]


def test_an_unknown_voice_mark_reads_as_plain_text():
    for mark in ("whispered", ["heard"], {"said": 1}, None):
        assert message_blocks([{"type": "text", "text": "hi", "voice": mark}]) == [Block(kind="text", text="hi")]


def test_voice_turns_add_their_seconds_to_the_session_and_the_day_and_the_usage_page_shows_them(
        owner_client, acme_key, at_once):
    session = make_session(acme_key)
    voice_turn(session, turn=1, seq=1, heard="what is in my cart", said="Two pairs.", interrupted=False,
               heard_ms=1500, spoken_ms=2250)
    voice_turn(session, turn=2, seq=3, heard="and the speakers", said="None", interrupted=True,
               heard_ms=1000, spoken_ms=250)
    typed_turn(session, turn=3, seq=5)

    session.refresh_from_db()
    assert (session.audio_heard_ms, session.audio_spoken_ms, session.turns) == (2500, 2500, 3)
    day = DailyUsage.objects.get(tenant_id=session.tenant_id, date=timezone.localdate())
    assert (day.audio_heard_ms, day.audio_spoken_ms, day.turns) == (2500, 2500, 3)

    html = owner_client.get(reverse("console:usage", args=["acme"])).content.decode()
    assert "2.5 s of speech heard and 2.5 s spoken" in html
    table = html.split('data-table="daily"')[1].split("</table>")[0]
    assert '<td class="num" data-heard>2.5</td><td class="num" data-spoken>2.5</td>' in table
    assert "2.5 / 2.5" in html  # the session's row


def test_a_day_with_only_voice_is_a_day_with_use(owner_client, acme):
    DailyUsage.objects.create(tenant=acme, date=timezone.localdate(), audio_heard_ms=800)
    html = owner_client.get(reverse("console:usage", args=["acme"])).content.decode()
    assert 'data-heard>0.8</td>' in html and "data-no-use" not in html


def test_both_records_show_a_spoken_answer_as_said_and_a_typed_turn_as_plain_text(
        owner_client, olivia, acme_key, at_once):
    session = make_session(acme_key)
    voice_turn(session, turn=1, seq=1, heard="what is in my cart", said="Two pairs of headphones.",
               interrupted=False, heard_ms=1500, spoken_ms=2300)
    typed_turn(session, turn=2, seq=3)
    olivia.is_staff = True
    olivia.save(update_fields=["is_staff"])

    console = owner_client.get(reverse("console:session", args=["acme", session.pk])).content.decode()
    live = owner_client.get(reverse("operators:live_session", args=[session.pk])).content.decode()

    for html in (console, live):
        assert html.index('data-voice="heard"') < html.index("what is in my cart")
        assert html.index('data-voice="said"') < html.index("Two pairs of headphones.")
        assert html.count("data-voice=") == 2 and INTERRUPTED_NOTE not in html
        assert "1.5 s heard, 2.3 s spoken" in html


def test_a_session_without_voice_says_so(owner_client, acme_key):
    session = make_session(acme_key)
    html = owner_client.get(reverse("console:session", args=["acme", session.pk])).content.decode()
    assert "<dd data-audio>none</dd>" in html
