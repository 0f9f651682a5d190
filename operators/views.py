"""The live pages in the admin: the list of open sessions and one session's
page, the counts of what waits for a person (in every admin page's header),
plus the operator's actions on a session: commands to the page, approval
decisions, and taking the chat over from the agent, writing to the page
user, running the page's tools and handing the chat back (each one recorded by the service it goes
through).

Every view is wrapped in ``admin.site.admin_view`` (operators/urls.py): staff
only, CSRF-protected, never cached. Tenancy is checked here on top: a session
of another tenant is a 404, whatever id is guessed.
"""
from __future__ import annotations

import logging
from collections.abc import Callable

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.forms import Form
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseRedirect, JsonResponse
from django.shortcuts import render
from django.template.response import TemplateResponse
from django.urls import reverse
from django.views.decorators.http import require_GET, require_POST

from aitp import services
from aitp.models import Session
from approvals.forms import decide_from_post
from approvals.models import Approval
from operators import handover, selectors
from operators.forms import HandBackForm, OperatorMessageForm, OperatorToolForm, SessionCommandForm
from operators.routing import WATCH_PATH
from runtime.config import config
from tenants.selectors import may_change_tenant

logger = logging.getLogger(__name__)


# What each command did, told to the operator after it was sent.
COMMAND_SENTENCES = {
    "end": "The session is ending: the page user's chat closes with your message.",
    "reload": "The page user's page is reloading.",
    "redirect": "The page user's page is being sent to the address you gave.",
}
NOT_SENT_ENDED = "Not sent: the session has already ended."


def _visible_session(request: HttpRequest, session_id: str) -> Session:
    session = selectors.visible_sessions(request.user).filter(pk=session_id).first()
    if session is None:
        raise Http404("no such session")
    return session


def _changeable_session(request: HttpRequest, session_id: str) -> Session:
    """A visible session the user may act on: viewers of its tenant get 403."""
    session = _visible_session(request, session_id)
    if not may_change_tenant(request.user, session.tenant_id):
        raise PermissionDenied("viewers change nothing")
    return session


def _session_url(session: Session) -> str:
    return reverse("operators:live_session", args=[session.pk])


def _page_config(**extra) -> dict:
    """What the page's script needs, passed through json_script."""
    return {"watchPath": WATCH_PATH, **extra}


@require_GET
def live_list(request: HttpRequest) -> HttpResponse:
    rows = selectors.live_session_rows(request.user)
    context = {
        **admin.site.each_context(request),
        "title": "Live sessions",
        "rows": rows,
        "config": _page_config(
            # Without a "closed" notice (its process died) a row only goes
            # away when the list is read again: once per heartbeat interval.
            refreshSeconds=config().store.heartbeat_interval,
        ),
    }
    return TemplateResponse(request, "operators/live_list.html", context)


@require_GET
def live_alerts(request: HttpRequest) -> JsonResponse:
    """The counts in every admin page's header (read again every few
    seconds by static/owllayer/admin-alerts.js), and where each is dealt with."""
    return JsonResponse({
        **selectors.alert_counts(request.user),
        "live_url": reverse("operators:live_list"),
        "approvals_url": reverse("admin:approvals_pendingapproval_changelist"),
    })


def _session_context(session: Session, user) -> dict:
    record = selectors.session_record(session)
    may_act = may_change_tenant(user, session.tenant_id)
    if not may_act:
        record["pending_approvals"] = []
    in_charge = session.operator_id is not None and session.operator_id == user.pk
    return {
        **record,
        "row": selectors.session_row(session),
        "may_act": may_act,
        "in_charge": in_charge,
        # A superuser may hand back a chat another operator left in charge.
        "may_hand_back": may_act and (in_charge or user.is_superuser),
        "max_text_chars": handover.MAX_TEXT_CHARS,
        "max_arguments_chars": handover.MAX_ARGUMENTS_CHARS,
        "operator_tools": handover.operator_tools(session) if in_charge and may_act else [],
    }


@require_GET
def live_session(request: HttpRequest, session_id: str) -> HttpResponse:
    session = _visible_session(request, session_id)
    record = _session_context(session, request.user)
    context = {
        **admin.site.each_context(request),
        **record,
        "title": f"Session {session.pk}",
        "config": _page_config(
            sessionId=session.pk,
            live=record["row"]["live"],
            panelUrl=reverse("operators:live_session_panel", args=[session.pk]),
        ),
    }
    return TemplateResponse(request, "operators/live_session.html", context)


@require_GET
def live_session_panel(request: HttpRequest, session_id: str) -> HttpResponse:
    """The session page's record, alone: the page fetches it again each time
    the watch socket says the session changed."""
    session = _visible_session(request, session_id)
    return render(request, "operators/_session_panel.html", _session_context(session, request.user))


@require_POST
def live_session_command(request: HttpRequest, session_id: str) -> HttpResponse:
    session = _changeable_session(request, session_id)
    form = SessionCommandForm(request.POST)
    if not form.is_valid():
        messages.error(request, f"Not sent: {_form_errors(form)}.")
        return HttpResponseRedirect(_session_url(session))
    if session.ended_at is not None:
        messages.error(request, NOT_SENT_ENDED)
        return HttpResponseRedirect(_session_url(session))
    command = form.cleaned_data["command"]
    services.session_command(
        session=session, user=request.user, command=command,
        url=form.cleaned_data["url"], message=form.cleaned_data["message"], channel="admin",
    )
    logger.info("session %s: operator %s sent %s", session.pk, request.user.get_username(), command)
    messages.success(request, COMMAND_SENTENCES[command])
    return HttpResponseRedirect(_session_url(session))


def _form_errors(form: Form) -> str:
    return "; ".join(e for field_errors in form.errors.values() for e in field_errors)


def _not_in_charge(session: Session) -> str:
    """Why the user may not speak for, or hand back, a chat they are not in charge of."""
    if session.operator_id is None:
        return "nobody is in charge of this chat: the agent answers it"
    return f"{session.operator_name} is in charge of this chat, not you"


@require_POST
def live_session_take_over(request: HttpRequest, session_id: str) -> HttpResponse:
    session = _changeable_session(request, session_id)
    if session.ended_at is not None:
        messages.error(request, NOT_SENT_ENDED)
        return HttpResponseRedirect(_session_url(session))
    outcome = handover.session_take_over(session=session, user=request.user, channel="admin")
    if outcome.taken:
        logger.info("session %s: operator %s took the chat over", session.pk, request.user.get_username())
        messages.success(request, "You are in charge of this chat: the agent stops answering, the page "
                                  "user's messages come to you and yours reach them as the assistant's.")
    elif outcome.name:
        messages.error(request, f"{outcome.name} has already taken this chat over.")
    else:
        messages.error(request, NOT_SENT_ENDED)
    return HttpResponseRedirect(_session_url(session))


def _in_charge_step(request: HttpRequest, session_id: str, form_for: Callable[[Session], Form], step, *,
                    done: str, refused: str) -> HttpResponse:
    """One step of the operator in charge (``step(session, **the data of
    form_for(session))`` says whether it was taken), told to them either way."""
    session = _changeable_session(request, session_id)
    form = form_for(session)
    if not form.is_valid():
        messages.error(request, f"{refused}: {_form_errors(form)}.")
    elif session.ended_at is not None:
        messages.error(request, NOT_SENT_ENDED)
    elif step(session, **form.cleaned_data):
        logger.info("session %s: operator %s: %s", session.pk, request.user.get_username(), step.__name__)
        messages.success(request, done)
    else:
        messages.error(request, f"{refused}: {_not_in_charge(session)}.")
    return HttpResponseRedirect(_session_url(session))


@require_POST
def live_session_say(request: HttpRequest, session_id: str) -> HttpResponse:
    def says(session: Session, text: str) -> bool:
        return handover.session_operator_says(session=session, user=request.user, text=text, channel="admin")

    return _in_charge_step(request, session_id, lambda session: OperatorMessageForm(request.POST), says,
                           done="Sent to the page user.", refused="Not sent")


@require_POST
def live_session_hand_back(request: HttpRequest, session_id: str) -> HttpResponse:
    def hands_back(session: Session, note: str) -> bool:
        return handover.session_hand_back(session=session, user=request.user, note=note, channel="admin")

    return _in_charge_step(request, session_id, lambda session: HandBackForm(request.POST), hands_back,
                           refused="Not handed back",
                           done="The chat is handed back: the agent answers the page user's next message.")


@require_POST
def live_session_run_tool(request: HttpRequest, session_id: str) -> HttpResponse:
    def runs(session: Session, tool: str, arguments: dict) -> bool:
        return handover.session_operator_runs_tool(session=session, user=request.user, tool=tool,
                                                   arguments=arguments, channel="admin") is not None

    def form_for(session: Session) -> Form:
        return OperatorToolForm(request.POST, tools=[tool["name"] for tool in handover.operator_tools(session)])

    return _in_charge_step(request, session_id, form_for, runs, refused="Not run",
                           done="Sent to the page: its answer shows under Tool calls.")


@require_POST
def live_approval_decide(request: HttpRequest, session_id: str, approval_id: int) -> HttpResponse:
    session = _changeable_session(request, session_id)
    approval = Approval.objects.filter(pk=approval_id, session=session).first()
    if approval is None:
        raise Http404("no such approval")
    decide_from_post(request, approval)
    return HttpResponseRedirect(_session_url(session))
