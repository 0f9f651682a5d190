"""An operator takes a chat over from the agent on the session page, writes
to the page user and hands the chat back: who may, what each step records
and what the pages show of it."""
from __future__ import annotations

import pytest
from django.urls import reverse

from agent.conversation import HANDED_BACK, OPERATOR, TAKEN_OVER, TO_OPERATOR, human_block
from aitp import store
from aitp.models import ConversationMessage, OperatorAction, Session, ToolCall
from aitp.operator_commands import HAND_BACK, OPERATOR_SAYS, OPERATOR_TOOL, TAKE_OVER
from approvals.audit import verify_chain
from approvals.models import AuditEvent
from operators import handover
from operators.handover import MAX_TEXT_CHARS, InCharge
from tests.operators.conftest import make_user

pytestmark = pytest.mark.django_db


def url(name: str, session) -> str:
    return reverse(f"operators:live_session_{name}", args=[session.pk])


def shown(response) -> str:
    return response.content.decode()


@pytest.fixture
def otto(acme):
    """A second operator of Acme."""
    return make_user("otto", tenant=acme)


@pytest.fixture
def vera(acme):
    """A viewer of Acme: staff, sees the live pages, changes nothing."""
    return make_user("vera", tenant=acme, role="viewer")


def taken_over_by(session, user) -> Session:
    assert handover.session_take_over(session=session, user=user).taken
    return Session.objects.get(pk=session.pk)


def in_charge_as(client, user, session, sent: list, *, by=None) -> None:
    """``client`` signed in as ``user``; ``session`` taken over by ``by``
    (``user`` when not given); nothing sent so far."""
    taken_over_by(session, by or user)
    client.force_login(user)
    sent.clear()


# --- taking over ----------------------------------------------------------------


def test_an_operator_takes_a_live_chat_over_and_its_process_is_told_once_it_commits(
    client, olivia, acme_session, sent, django_capture_on_commit_callbacks
):
    client.force_login(olivia)
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        response = client.post(url("take_over", acme_session), follow=True)
        assert sent == []
    for callback in callbacks:
        callback()

    assert "You are in charge of this chat" in shown(response)
    session = Session.objects.get(pk=acme_session.pk)
    assert (session.operator, session.operator_name) == (olivia, "olivia") and session.taken_over_at
    action = OperatorAction.objects.get(session=acme_session)
    assert (action.action, action.user, action.data) == (
        "session_take_over", olivia, {"operator": "olivia", "channel": "admin"})
    assert sent == [("ses_acme", TAKE_OVER, {"operator": "olivia"})]


def test_two_operators_taking_over_at_once_leave_one_in_charge(olivia, otto, acme_session, sent):
    # Both read the session before either wrote: the database decides.
    first, second = Session.objects.get(pk=acme_session.pk), Session.objects.get(pk=acme_session.pk)

    assert handover.session_take_over(session=first, user=olivia) == InCharge(True, "olivia")
    assert handover.session_take_over(session=second, user=otto) == InCharge(False, "olivia")

    assert Session.objects.get(pk=acme_session.pk).operator == olivia
    assert OperatorAction.objects.filter(action="session_take_over").count() == 1
    assert AuditEvent.objects.filter(action="taken_over").count() == 1


def test_the_operator_who_clicked_second_is_told_who_took_the_chat_over(
    client, olivia, otto, acme_session, sent
):
    olivia.first_name, olivia.last_name = "Olivia", "Park"
    olivia.save()
    taken_over_by(acme_session, olivia)
    client.force_login(otto)

    response = client.post(url("take_over", acme_session), follow=True)

    assert "Olivia Park has already taken this chat over." in shown(response)
    assert Session.objects.get(pk=acme_session.pk).operator == olivia
    assert OperatorAction.objects.filter(user=otto).count() == 0


def test_the_operator_in_charge_taking_over_again_stays_in_charge_and_records_nothing_more(
    client, olivia, acme_session, sent
):
    taken_over_by(acme_session, olivia)
    client.force_login(olivia)

    response = client.post(url("take_over", acme_session), follow=True)

    assert "You are in charge of this chat" in shown(response)
    assert OperatorAction.objects.count() == 1


def test_an_ended_session_cannot_be_taken_over(client, olivia, acme_session, sent):
    store.current().session_close(session_id=acme_session.id, code=1000)
    client.force_login(olivia)

    response = client.post(url("take_over", acme_session), follow=True)

    assert "Not sent: the session has already ended." in shown(response)
    assert Session.objects.get(pk=acme_session.pk).operator is None
    assert not OperatorAction.objects.exists() and sent == []


def test_a_session_that_ended_meanwhile_is_not_taken_over(olivia, acme_session, sent):
    stale = Session.objects.get(pk=acme_session.pk)
    store.current().session_close(session_id=acme_session.id, code=1000)

    assert handover.session_take_over(session=stale, user=olivia) == InCharge(False, "")
    assert not OperatorAction.objects.exists()


@pytest.mark.parametrize("step", ["take_over", "say", "run_tool", "hand_back"])
def test_a_viewer_can_neither_take_over_nor_write_nor_hand_back(client, vera, acme_session, sent, step):
    client.force_login(vera)

    response = client.post(url(step, acme_session), {"text": "hello", "note": ""})

    assert response.status_code == 403
    assert not OperatorAction.objects.exists() and sent == []


@pytest.mark.parametrize("step", ["take_over", "say", "run_tool", "hand_back"])
def test_another_tenants_session_is_not_found(client, olivia, globex_session, sent, step):
    client.force_login(olivia)
    assert client.post(url(step, globex_session), {"text": "hello"}).status_code == 404
    assert Session.objects.get(pk=globex_session.pk).operator is None


@pytest.mark.parametrize("step", ["take_over", "say", "run_tool", "hand_back"])
def test_the_steps_are_posts_only(client, olivia, acme_session, step):
    client.force_login(olivia)
    assert client.get(url(step, acme_session)).status_code == 405



# --- running the page's tools ---------------------------------------------------------

PAGE_TOOLS = [{"name": "open_product", "description": "Open a product's page", "risk": "none"},
              {"name": "add_to_cart", "description": "Add to the cart", "risk": "low"},
              {"name": "checkout", "description": "Start the checkout", "risk": "high"},
              {"name": "pay", "description": "Pay", "risk": "critical"}]


@pytest.fixture
def tooled_session(acme_session) -> Session:
    acme_session.tools = PAGE_TOOLS
    acme_session.save(update_fields=["tools"])
    return acme_session


def test_the_operator_in_charge_runs_a_page_tool_and_its_process_is_told_with_the_call_id(
    client, olivia, tooled_session, sent, django_capture_on_commit_callbacks
):
    in_charge_as(client, olivia, tooled_session, sent)

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(url("run_tool", tooled_session),
                               {"tool": "open_product", "arguments": '{"id": "p1"}'}, follow=True)

    assert "Sent to the page: its answer shows under Tool calls." in shown(response)
    action = OperatorAction.objects.get(action="session_operator_tool")
    call_id = action.data["call_id"]
    assert (action.user, action.data) == (olivia, {"tool": "open_product", "arguments": {"id": "p1"},
                                                   "call_id": call_id, "channel": "admin"})
    assert call_id.startswith("tc_")
    assert sent == [("ses_acme", OPERATOR_TOOL, {"operator": "olivia", "call_id": call_id, "tool": "open_product",
                                                  "arguments": {"id": "p1"}})]


def test_a_page_tool_runs_with_no_arguments_when_none_are_written(client, olivia, tooled_session, sent):
    taken_over_by(tooled_session, olivia)
    client.force_login(olivia)

    client.post(url("run_tool", tooled_session), {"tool": "add_to_cart", "arguments": ""})

    assert OperatorAction.objects.get(action="session_operator_tool").data["arguments"] == {}


@pytest.mark.parametrize("tool", ["checkout", "pay", "delete_account"])
def test_a_tool_the_page_does_not_offer_to_operators_is_not_run(client, olivia, tooled_session, sent, tool):
    in_charge_as(client, olivia, tooled_session, sent)

    response = client.post(url("run_tool", tooled_session), {"tool": tool, "arguments": "{}"}, follow=True)

    assert "Not run: the page offers no such tool to run." in shown(response)
    assert not OperatorAction.objects.filter(action="session_operator_tool").exists() and sent == []


@pytest.mark.parametrize("arguments, error", [("{not json", "the arguments are not JSON"),
                                              ('["p1"]', "the arguments are a JSON object")])
def test_arguments_that_are_not_a_json_object_are_not_sent(client, olivia, tooled_session, sent, arguments, error):
    in_charge_as(client, olivia, tooled_session, sent)

    response = client.post(url("run_tool", tooled_session), {"tool": "open_product", "arguments": arguments},
                           follow=True)

    assert f"Not run: {error}" in shown(response)
    assert sent == []


def test_an_operator_not_in_charge_runs_no_page_tool(client, olivia, otto, tooled_session, sent):
    in_charge_as(client, otto, tooled_session, sent, by=olivia)

    response = client.post(url("run_tool", tooled_session), {"tool": "open_product", "arguments": "{}"},
                           follow=True)

    assert "Not run: olivia is in charge of this chat, not you." in shown(response)
    assert sent == []


def test_the_operator_in_charge_is_offered_only_the_page_tools_of_risk_none_or_low(
        client, olivia, tooled_session, sent):
    taken_over_by(tooled_session, olivia)
    client.force_login(olivia)

    content = shown(client.get(url("panel", tooled_session)))

    assert f'action="{url("run_tool", tooled_session)}"' in content
    assert '<option value="open_product">' in content and '<option value="add_to_cart">' in content
    assert 'value="checkout"' not in content and 'value="pay"' not in content


def test_the_session_page_says_the_agent_asked_for_a_person_and_why_until_an_operator_takes_over(
        client, olivia, acme_session, sent):
    from aitp import services

    services.session_handoff_requested(session_id=acme_session.pk, reason="wants a refund")
    client.force_login(olivia)
    waiting = shown(client.get(url("panel", acme_session)))
    taken_over_by(acme_session, olivia)
    taken = shown(client.get(url("panel", acme_session)))

    assert 'id="handoff-waiting"' in waiting and "“wants a refund”" in waiting
    assert 'id="handoff-waiting"' not in taken


def test_the_agent_answering_offers_no_page_tool_to_run(client, olivia, tooled_session):
    client.force_login(olivia)
    assert 'id="operator-tool"' not in shown(client.get(url("panel", tooled_session)))


def test_a_call_an_operator_ran_is_marked_so_among_the_tool_calls(client, olivia, tooled_session):
    ToolCall.objects.create(session=tooled_session, call_id="tc_op1", tool_use_id="operator_tc_op1",
                            name="open_product", arguments={"id": "p1"}, status="success")
    ToolCall.objects.create(session=tooled_session, call_id="tc_model1", tool_use_id="toolu_1",
                            name="open_product", arguments={"id": "p2"}, status="success")
    client.force_login(olivia)

    content = shown(client.get(url("panel", tooled_session)))

    assert content.count("run by an operator") == 1
    operator_row = content[content.index('id="tool-call-tc_op1"'):content.index('id="tool-call-tc_model1"')]
    assert "run by an operator" in operator_row


# --- writing to the page user --------------------------------------------------------


def test_the_operator_in_charge_writes_to_the_page_user(
    client, olivia, acme_session, sent, django_capture_on_commit_callbacks
):
    in_charge_as(client, olivia, acme_session, sent)

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(url("say", acme_session), {"text": "  I have refunded order A1.  "}, follow=True)

    assert "Sent to the page user." in shown(response)
    action = OperatorAction.objects.get(action="session_operator_says")
    assert (action.user, action.data) == (olivia, {"text": "I have refunded order A1.", "channel": "admin"})
    assert sent == [("ses_acme", OPERATOR_SAYS, {"operator": "olivia", "text": "I have refunded order A1."})]


def test_an_operator_not_in_charge_is_told_who_is_and_nothing_is_sent(client, olivia, otto, acme_session, sent):
    in_charge_as(client, otto, acme_session, sent, by=olivia)

    response = client.post(url("say", acme_session), {"text": "Hello from Otto"}, follow=True)

    assert "Not sent: olivia is in charge of this chat, not you." in shown(response)
    assert not OperatorAction.objects.filter(action="session_operator_says").exists() and sent == []


def test_writing_while_the_agent_answers_is_refused(client, olivia, acme_session, sent):
    client.force_login(olivia)

    response = client.post(url("say", acme_session), {"text": "Hello"}, follow=True)

    assert "Not sent: nobody is in charge of this chat: the agent answers it." in shown(response)
    assert not OperatorAction.objects.exists() and sent == []


@pytest.mark.parametrize("text, error", [("   ", "write a message first"),
                                         ("x" * (MAX_TEXT_CHARS + 1), f"at most {MAX_TEXT_CHARS} characters")])
def test_an_empty_or_overlong_message_is_not_sent(client, olivia, acme_session, sent, text, error):
    in_charge_as(client, olivia, acme_session, sent)

    response = client.post(url("say", acme_session), {"text": text}, follow=True)

    assert error in shown(response)
    assert not OperatorAction.objects.filter(action="session_operator_says").exists() and sent == []


def test_a_message_to_an_ended_session_is_not_sent(client, olivia, acme_session, sent):
    taken_over_by(acme_session, olivia)
    store.current().session_close(session_id=acme_session.id, code=1000)
    client.force_login(olivia)
    sent.clear()

    response = client.post(url("say", acme_session), {"text": "Still there?"}, follow=True)

    assert "Not sent: the session has already ended." in shown(response)
    assert sent == []


# --- handing back ----------------------------------------------------------------------


def test_the_operator_in_charge_hands_the_chat_back_with_a_note(
    client, olivia, acme_session, sent, django_capture_on_commit_callbacks
):
    in_charge_as(client, olivia, acme_session, sent)

    with django_capture_on_commit_callbacks(execute=True):
        response = client.post(url("hand_back", acme_session), {"note": "Refund done, be kind."}, follow=True)

    assert "The chat is handed back" in shown(response)
    session = Session.objects.get(pk=acme_session.pk)
    assert (session.operator, session.operator_name, session.taken_over_at) == (None, "", None)
    action = OperatorAction.objects.get(action="session_hand_back")
    assert (action.user, action.data) == (
        olivia, {"operator": "olivia", "note": "Refund done, be kind.", "channel": "admin"})
    assert sent == [("ses_acme", HAND_BACK, {"operator": "olivia", "note": "Refund done, be kind."})]


def test_a_superuser_hands_back_a_chat_another_operator_left_in_charge(
    client, olivia, root, acme_session, sent, django_capture_on_commit_callbacks
):
    in_charge_as(client, root, acme_session, sent, by=olivia)

    with django_capture_on_commit_callbacks(execute=True):
        client.post(url("hand_back", acme_session), {"note": ""})

    assert Session.objects.get(pk=acme_session.pk).operator is None
    action = OperatorAction.objects.get(action="session_hand_back")
    assert (action.user, action.data["operator"]) == (root, "olivia")
    assert sent == [("ses_acme", HAND_BACK, {"operator": "olivia", "note": ""})]


def test_another_operator_cannot_hand_the_chat_back(client, olivia, otto, acme_session, sent):
    in_charge_as(client, otto, acme_session, sent, by=olivia)

    response = client.post(url("hand_back", acme_session), {"note": "mine now"}, follow=True)

    assert "Not handed back: olivia is in charge of this chat, not you." in shown(response)
    assert Session.objects.get(pk=acme_session.pk).operator == olivia
    assert not OperatorAction.objects.filter(action="session_hand_back").exists() and sent == []


def test_a_chat_nobody_took_over_is_not_handed_back(client, olivia, acme_session, sent):
    client.force_login(olivia)

    response = client.post(url("hand_back", acme_session), {"note": ""}, follow=True)

    assert "Not handed back: nobody is in charge of this chat" in shown(response)
    assert not OperatorAction.objects.exists() and sent == []


def test_taking_over_and_handing_back_extend_the_audit_chain_which_still_verifies(olivia, acme_session, sent):
    taken_over_by(acme_session, olivia)
    handover.session_operator_says(session=acme_session, user=olivia, text="One moment.")
    handover.session_hand_back(session=acme_session, user=olivia, note="")

    events = list(AuditEvent.objects.filter(session_id=acme_session.pk).order_by("seq"))
    assert [(e.action, e.actor_kind, e.actor, e.channel, e.data) for e in events] == [
        ("taken_over", "operator", "olivia", "admin", {"operator": "olivia"}),
        ("handed_back", "operator", "olivia", "admin", {"operator": "olivia"}),
    ]
    result = verify_chain()
    assert result.ok and result.count >= 2


# --- what the pages show -----------------------------------------------------------------


def test_the_session_page_offers_to_take_over_while_the_agent_answers(client, olivia, acme_session):
    client.force_login(olivia)
    content = shown(client.get(url("panel", acme_session)))
    assert "The agent answers this chat." in content
    assert f'action="{url("take_over", acme_session)}"' in content
    assert 'id="operator-say"' not in content and 'id="hand-back"' not in content


def test_the_operator_in_charge_gets_the_message_and_hand_back_forms(client, olivia, acme_session, sent):
    taken_over_by(acme_session, olivia)
    client.force_login(olivia)
    content = shown(client.get(reverse("operators:live_session", args=[acme_session.pk])))
    assert "You are in charge of this chat since" in content
    assert f'action="{url("say", acme_session)}"' in content
    assert f'maxlength="{MAX_TEXT_CHARS}"' in content and "Send to the page user" in content
    assert f'action="{url("hand_back", acme_session)}"' in content
    assert 'id="take-over"' not in content


def test_another_operator_reads_who_is_in_charge_and_since_when(client, olivia, otto, acme_session, sent):
    session = taken_over_by(acme_session, olivia)
    client.force_login(otto)
    content = shown(client.get(url("panel", acme_session)))
    assert "olivia is in charge of this chat since" in content
    assert session.taken_over_at.isoformat() in content
    assert 'id="take-over"' not in content and 'id="operator-say"' not in content
    assert 'id="hand-back"' not in content


def test_a_superuser_reads_who_is_in_charge_and_may_hand_the_chat_back(client, olivia, root, acme_session, sent):
    taken_over_by(acme_session, olivia)
    client.force_login(root)
    content = shown(client.get(url("panel", acme_session)))
    assert "olivia is in charge of this chat since" in content
    assert 'id="hand-back"' in content and 'id="operator-say"' not in content


def test_a_viewer_reads_who_answers_but_gets_no_button(client, vera, acme_session):
    client.force_login(vera)
    content = shown(client.get(url("panel", acme_session)))
    assert "The agent answers this chat." in content and 'id="take-over"' not in content


def test_an_ended_session_offers_no_take_over(client, olivia, acme_session):
    store.current().session_close(session_id=acme_session.id, code=1000)
    client.force_login(olivia)
    content = shown(client.get(url("panel", acme_session)))
    assert 'id="in-charge"' not in content


def test_a_live_list_row_names_the_operator_in_charge(client, olivia, acme_session, sent):
    session = taken_over_by(acme_session, olivia)
    client.force_login(olivia)
    (row,) = client.get(reverse("operators:live_list")).context["rows"]
    assert (row["operator_name"], row["taken_over_at"]) == ("olivia", session.taken_over_at.isoformat())


def test_the_operators_time_in_charge_is_listed_among_the_operator_actions(client, olivia, acme_session, sent):
    taken_over_by(acme_session, olivia)
    handover.session_operator_says(session=acme_session, user=olivia, text="One moment.")
    handover.session_hand_back(session=acme_session, user=olivia, note="")
    client.force_login(olivia)
    content = shown(client.get(url("panel", acme_session)))
    assert "Took the chat over" in content and "Wrote to the page user" in content
    assert "Handed the chat back" in content and "session_take_over" not in content


def time_in_charge(session) -> None:
    """The messages of an operator's time in charge, stored as the agent stores them."""
    blocks = [
        [{"type": "text", "text": "Where is my refund?"}],
        [human_block(TAKEN_OVER, operator="olivia")],
        [human_block(TO_OPERATOR, "Are you a person?")],
        [human_block(OPERATOR, "Yes, Olivia from Acme. Refunded.", operator="olivia")],
        [human_block(HANDED_BACK, "Refund A1 is done.", operator="olivia")],
    ]
    for seq, content in enumerate(blocks, start=1):
        ConversationMessage.objects.create(session=session, seq=seq, turn=1, role="user", content=content)


@pytest.mark.parametrize("page", ["admin", "console"])
def test_a_session_record_shows_the_operators_time_in_charge_with_headings(client, olivia, acme_session, page):
    time_in_charge(acme_session)
    client.force_login(olivia)
    address = (url("panel", acme_session) if page == "admin"
               else reverse("console:session", args=["acme", acme_session.pk]))

    content = shown(client.get(address))

    headings = ["olivia took the chat over", "to the operator", "operator olivia", "olivia handed the chat back"]
    if page == "console":
        headings = [heading[0].upper() + heading[1:] for heading in headings]
    at = [content.index(heading) for heading in headings]
    assert at == sorted(at)
    assert content.index("Are you a person?") < content.index("Yes, Olivia from Acme.") < content.index(
        "Refund A1 is done.")
    assert "&quot;human&quot;" not in content and '"human":' not in content
