"""A person in charge of a chat in the agent's place: an operator takes a
live session over, writes to the page user, and hands the chat back.

Who is in charge is the session row's (``operator``, ``operator_name``,
``taken_over_at``): taking over is one conditional UPDATE, so two operators
clicking at once, on any processes, leave exactly one in charge and the
other is told who. Each step is recorded (``OperatorAction``; taking over
and handing back are events of the audit chain too) and then carried out by
the process holding the session, as a ``session.command``
(``aitp.operator_commands``): the running turn is cut, the page user's
messages go to the operator instead of the model, the operator's reach the
page as the agent's text, the page's tools of risk none or low run for the
operator through the session's own ledger, and at the hand back the model is
given what was said and done meanwhile (``agent.conversation.human_block``).

Sync functions, one transaction each; the notice goes out once it commits.
"""
from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction
from django.utils import timezone

from aitp import notify
from aitp.ledger import new_call_id
from aitp.models import OperatorAction, Session
from aitp.operator_commands import HAND_BACK, OPERATOR_SAYS, OPERATOR_TOOL, TAKE_OVER
from approvals.audit import append_event

MAX_TEXT_CHARS = 2000
# The page tools an operator may run: those nobody is asked to approve.
OPERATOR_TOOL_RISKS = ("none", "low")
MAX_ARGUMENTS_CHARS = 4000


@dataclass(frozen=True)
class InCharge:
    """Who is in charge of a session after an operator asked to take it over."""

    taken: bool  # this operator is (now or already)
    name: str  # the operator in charge ("" when the session has ended)


def operator_name(user) -> str:
    """How the page user is told the operator's name."""
    return (user.get_full_name() or user.get_username())[:150]


def session_take_over(*, session: Session, user, channel: str = "admin") -> InCharge:
    """Put ``user`` in charge of a live session, unless someone else is."""
    name = operator_name(user)
    with transaction.atomic():
        taken = Session.objects.filter(pk=session.pk, operator__isnull=True, ended_at__isnull=True).update(
            operator=user, operator_name=name, taken_over_at=timezone.now(),
            handoff_requested_at=None, handoff_reason="")
        if not taken:
            row = Session.objects.filter(pk=session.pk).values("operator_id", "operator_name", "ended_at").first()
            if row is None or row["ended_at"] is not None:
                return InCharge(False, "")
            return InCharge(row["operator_id"] == user.pk, row["operator_name"])
        _record(session, user, "session_take_over", {"operator": name, "channel": channel},
                audit="taken_over", channel=channel)
    transaction.on_commit(lambda: notify.session_command(session.pk, TAKE_OVER, operator=name))
    return InCharge(True, name)


def in_charge(session_id: str, user) -> bool:
    return Session.objects.filter(pk=session_id, operator=user, ended_at__isnull=True).exists()


def session_operator_says(*, session: Session, user, text: str, channel: str = "admin") -> bool:
    """Send the page user ``text`` from the operator in charge; False when
    ``user`` is not (any more) in charge of the live session."""
    text = text.strip()[:MAX_TEXT_CHARS]
    if not text:
        raise ValueError("an operator's message needs words")
    with transaction.atomic():
        if not in_charge(session.pk, user):
            return False
        name = operator_name(user)
        _record(session, user, "session_operator_says", {"text": text, "channel": channel})
    transaction.on_commit(lambda: notify.session_command(session.pk, OPERATOR_SAYS, operator=name, text=text))
    return True


def operator_tools(session: Session) -> list[dict]:
    """The page tools the operator in charge may run, as the page declared
    them last (risk none or low)."""
    return [tool for tool in session.tools or []
            if isinstance(tool, dict) and tool.get("risk", "none") in OPERATOR_TOOL_RISKS and tool.get("name")]


def session_operator_runs_tool(*, session: Session, user, tool: str, arguments: dict,
                               channel: str = "admin") -> str | None:
    """Have the page run ``tool`` for the operator in charge, through the
    session's own ledger (``Agent.operator_call``, which checks it against
    the tools the page offers then); the call's id, or None when ``user`` is
    not in charge of the live session. Raises ValueError for a tool the
    operator may not run."""
    if tool not in {t["name"] for t in operator_tools(session)}:
        raise ValueError(f"the page offers no tool {tool} of risk none or low")
    call_id = new_call_id()
    with transaction.atomic():
        if not in_charge(session.pk, user):
            return None
        name = operator_name(user)
        _record(session, user, "session_operator_tool",
                {"tool": tool, "arguments": arguments, "call_id": call_id, "channel": channel})
    transaction.on_commit(lambda: notify.session_command(
        session.pk, OPERATOR_TOOL, operator=name, call_id=call_id, tool=tool, arguments=arguments))
    return call_id


def session_hand_back(*, session: Session, user, note: str = "", channel: str = "admin") -> bool:
    """The agent answers again, told what was said meanwhile and ``note``;
    False when ``user`` was not in charge. A superuser may hand back a chat
    another operator left in charge."""
    note = note.strip()[:MAX_TEXT_CHARS]
    with transaction.atomic():
        rows = Session.objects.filter(pk=session.pk, operator__isnull=False)
        if not user.is_superuser:
            rows = rows.filter(operator=user)
        name = rows.values_list("operator_name", flat=True).first()
        if name is None or not rows.update(operator=None, operator_name="", taken_over_at=None):
            return False
        _record(session, user, "session_hand_back", {"operator": name, "note": note, "channel": channel},
                audit="handed_back", channel=channel)
    transaction.on_commit(lambda: notify.session_command(session.pk, HAND_BACK, operator=name, note=note))
    return True


def _record(session: Session, user, action: str, data: dict, *, audit: str = "", channel: str = "admin") -> None:
    OperatorAction.objects.create(session=session, tenant_id=session.tenant_id, user=user, action=action,
                                  data=data)
    if audit:
        append_event(tenant_id=session.tenant_id, action=audit, actor_kind="operator",
                     actor=user.get_username(), channel=channel, session_id=session.pk,
                     data={"operator": data["operator"]})
