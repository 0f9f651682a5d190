"""A session continued on another daphne process: after a reload that lands
elsewhere (the process that held the session past its socket lets it go),
after the drain of a stopping process (1001), after a kill -9. The
conversation is the database's, so any process can go on with it."""
from __future__ import annotations

import asyncio
import signal

import pytest
from asgiref.sync import sync_to_async

from aitp import notify, tenancy
from aitp.models import ConversationMessage, Session
from aitp_client import AitpClient

pytestmark = pytest.mark.django_db(transaction=True)

ORIGIN = "http://page.example"
SOON = 30.0


@pytest.fixture
def raw_key(db) -> str:
    tenant = tenancy.tenant_create(slug="resume", name="Resume")
    _, raw = tenancy.key_create(tenant=tenant, name="web", allowed_origins=[ORIGIN], max_sessions=3)
    return raw


def page_for(server, raw_key: str, resume: dict) -> AitpClient:
    return AitpClient(server.ws_url(), api_key=raw_key, origin=ORIGIN, resume=resume)


async def talked(server, raw_key: str) -> tuple[AitpClient, dict]:
    """A page on ``server`` that said one thing and was answered: (page, ack)."""
    page = page_for(server, raw_key, {})
    ack = await page.connect(timeout=SOON)
    await page.context_update(url="/", title="Home")
    await page.say("hello", timeout=SOON)
    return page, ack


async def continued_on(server, raw_key: str, ack: dict) -> AitpClient:
    page = page_for(server, raw_key, {"token": ack["resumeToken"]})
    again = await page.connect(timeout=SOON)
    assert (again["sessionId"], again["resumed"]) == (ack["sessionId"], True)
    await page.context_update(url="/", title="Home")
    await page.say("hello again", timeout=SOON)
    return page


async def ended_row(session_id: str) -> Session:
    """The session's row once the process that held it has recorded its end:
    the page is sent the close first, the row is written after."""
    for _ in range(int(SOON / 0.1)):
        row = await Session.objects.aget(id=session_id)
        if row.ended_at is not None:
            return row
        await asyncio.sleep(0.1)
    raise AssertionError(f"session {session_id} was never recorded as ended")


async def numbered(session_id: str) -> list[tuple[int, int]]:
    return [(m.seq, m.turn) async for m in
            ConversationMessage.objects.filter(session_id=session_id).order_by("seq")]


async def test_a_page_back_on_the_same_process_goes_on_from_the_last_frame_it_handled(daphne_factory, raw_key):
    server = daphne_factory()
    page, ack = await talked(server, raw_key)
    await page.close(1001)

    again = await went_on(server, raw_key, page, ack, "hello again")

    assert await numbered(ack["sessionId"]) == [(1, 1), (2, 1), (3, 2), (4, 2)]
    await again.close()


async def went_on(server, raw_key: str, page: AitpClient, ack: dict, question: str) -> AitpClient:
    """The page's next socket on ``server``, offering where ``page`` left off,
    continues the session and asks ``question``: its frames are numbered on."""
    again = page_for(server, raw_key, page.next_resume())
    ack_again = await again.connect(timeout=SOON)
    await again.context_update(url="/", title="Home")
    await again.say(question, timeout=SOON)
    assert (ack_again["sessionId"], ack_again["resumed"]) == (ack["sessionId"], True)
    numbers = [frame["meta"]["seq"] for frame in again.history]
    assert numbers == list(range(page.last_seq, page.last_seq + len(numbers)))
    return again


async def reloaded_on_the_other(first, second, raw_key: str) -> None:
    """A page that talked on ``first`` reloads and reaches ``second``: its conversation goes on there."""
    page, ack = await talked(first, raw_key)
    await page.close(1001)

    again = await continued_on(second, raw_key, ack)

    assert await numbered(ack["sessionId"]) == [(1, 1), (2, 1), (3, 2), (4, 2)]
    row = await Session.objects.aget(id=ack["sessionId"])
    assert row.resumes == 1 and row.ended_at is None and f":{second.process.pid}:" in row.process
    await again.close()


async def test_a_session_closed_with_its_socket_is_continued_on_another_process(daphne_factory, raw_key):
    await reloaded_on_the_other(daphne_factory(OWLLAYER_RESUME_HOLD_SECONDS="0"),
                                daphne_factory(OWLLAYER_RESUME_HOLD_SECONDS="0"), raw_key)


@pytest.mark.redis
async def test_a_session_its_process_holds_goes_on_there_relayed_by_the_process_the_next_socket_reached(
        daphne_factory, raw_key):
    # The process holding the session is asked through the channel layer:
    # several processes share one only on Redis.
    holding, other = daphne_factory(), daphne_factory()
    page, ack = await talked(holding, raw_key)
    await page.close(1001)

    again = await went_on(other, raw_key, page, ack, "hello again")

    assert await numbered(ack["sessionId"]) == [(1, 1), (2, 1), (3, 2), (4, 2)]
    row = await Session.objects.aget(id=ack["sessionId"])
    assert row.resumes == 1 and row.ended_at is None and f":{holding.process.pid}:" in row.process
    assert '"WSCONNECT /owllayer"' in other.logs()

    await again.close(1001)
    # Held again where it runs: the next socket, back on that process, goes on.
    last = await went_on(holding, raw_key, again, ack, "and again")

    assert await numbered(ack["sessionId"]) == [(1, 1), (2, 1), (3, 2), (4, 2), (5, 3), (6, 3)]
    await last.close()


@pytest.mark.redis
async def test_a_relayed_session_ends_on_the_page_when_an_operator_ends_it(daphne_factory, raw_key):
    holding, other = daphne_factory(), daphne_factory()
    page, ack = await talked(holding, raw_key)
    await page.close(1001)
    again = page_for(other, raw_key, page.next_resume())
    await again.connect(timeout=SOON)

    await sync_to_async(notify.send)(notify.session_group(ack["sessionId"]), "session.command",
                                     command="end", message="Goodbye.")
    code, reason = await again.wait_closed(timeout=SOON)

    assert (code, reason) == (1008, "ended by operator")
    goodbye = [f for f in again.history if f["type"] == "SYSTEM_EVENT" and f["payload"]["kind"] == "disconnect"]
    assert goodbye[0]["payload"]["message"] == "Goodbye."
    row = await ended_row(ack["sessionId"])
    assert row.close_code == 1008


async def test_a_session_the_drain_of_a_stopping_process_closed_goes_on_on_the_one_that_stays(
        daphne_factory, raw_key):
    stopping, staying = daphne_factory(), daphne_factory()
    page, ack = await talked(stopping, raw_key)

    await asyncio.to_thread(stopping.stop)
    code, _ = await page.wait_closed(timeout=SOON)
    again = await continued_on(staying, raw_key, ack)

    assert code == 1001
    assert await numbered(ack["sessionId"]) == [(1, 1), (2, 1), (3, 2), (4, 2)]
    await again.close()


async def test_a_session_of_a_killed_process_goes_on_on_another_at_once(daphne_factory, raw_key):
    survivor, doomed = daphne_factory(), daphne_factory()
    page, ack = await talked(doomed, raw_key)

    doomed.process.send_signal(signal.SIGKILL)
    await asyncio.to_thread(doomed.process.wait, SOON)
    code, _ = await page.wait_closed(timeout=SOON)
    # No sweep has run: the row still looks open until the resume finds its process gone.
    assert (await Session.objects.aget(id=ack["sessionId"])).ended_at is None
    again = await continued_on(survivor, raw_key, ack)

    assert code == 1006
    assert await numbered(ack["sessionId"]) == [(1, 1), (2, 1), (3, 2), (4, 2)]
    await again.close()


@pytest.mark.redis
async def test_a_newer_socket_on_another_process_takes_over_a_session_whose_socket_is_open(
        daphne_factory, raw_key):
    # The phone's network dropped; the process holding the old socket has
    # not seen it close. The new socket lands on another process.
    holding, other = daphne_factory(), daphne_factory()
    page, ack = await talked(holding, raw_key)

    again = await continued_on(other, raw_key, ack)
    code, reason = await page.wait_closed(timeout=SOON)

    assert (code, reason) == (4409, "continued on another socket")
    goodbye = [f for f in page.received if f["type"] == "SYSTEM_EVENT" and f["payload"]["kind"] == "disconnect"]
    assert goodbye[0]["payload"]["message"] == "This conversation goes on in another tab or window."
    assert await numbered(ack["sessionId"]) == [(1, 1), (2, 1), (3, 2), (4, 2)]
    await again.close()


@pytest.mark.redis
async def test_a_page_relayed_to_a_killed_process_is_sent_away_and_goes_on_from_the_database(
        daphne_factory, raw_key):
    doomed, other = daphne_factory(), daphne_factory()
    page, ack = await talked(doomed, raw_key)
    await page.close(1001)
    relayed = page_for(other, raw_key, page.next_resume())
    assert (await relayed.connect(timeout=SOON))["resumed"] is True

    doomed.process.send_signal(signal.SIGKILL)
    await asyncio.to_thread(doomed.process.wait, SOON)
    code, _ = await relayed.wait_closed(timeout=SOON)
    again = await continued_on(other, raw_key, {**ack, "resumeToken": relayed.ack["resumeToken"]})

    assert code == 1001
    assert await numbered(ack["sessionId"]) == [(1, 1), (2, 1), (3, 2), (4, 2)]
    assert f":{other.process.pid}:" in (await Session.objects.aget(id=ack["sessionId"])).process
    await again.close()
