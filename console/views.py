"""The tenant console: keys, usage, session records and members of one tenant.

Views only read (selectors/querysets filtered by the caller's tenant) and call
services to write; ``console.access.tenant_view`` decides who gets in.
"""
from __future__ import annotations

import logging
import smtplib
from datetime import datetime, time
from decimal import Decimal
from urllib.parse import quote, urlencode

from django.contrib import messages
from django.contrib.auth import login
from django.contrib.auth.decorators import login_required
from django.db import IntegrityError
from django.db.models import BooleanField, Case, Count, Q, Sum, Value, When
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_POST

from aitp import budgets, selectors, tenancy
from aitp.models import AlertDelivery, ApiKey, OperatorAction, Session, ToolCall
from aitp.quota import tenant_quota_status
from aitp.store import admission
from aitp.transcript import message_blocks, pretty_json
from console.access import Access, render_page, tenant_view
from console.forms import (
    ApiKeyCreateForm,
    ApiKeyEditForm,
    BudgetForm,
    InvitationSignUpForm,
    InviteForm,
    MemberRoleForm,
    WidgetAppearanceForm,
)
from console.usage import bar_chart, daily_usage, day_label, day_title
from runtime.config import config
from tenants.models import BudgetAlert, Invitation, TenantMembership
from widget.assets import Preview, embed_snippet
from widget.assets import preview as widget_preview
from widget.services import key_set_appearance

logger = logging.getLogger(__name__)

RECENT_SESSIONS = 50
# The most sessions a visitor's page lists (the newest).
VISITOR_SESSIONS = 200


def _live_q(prefix: str = "") -> Q:
    live = admission.live_sessions_filter(timezone.now())
    return Q(**{prefix + field: value for field, value in live.items()})


def _start_of_today() -> datetime:
    return timezone.make_aware(datetime.combine(timezone.localdate(), time.min))


# --- choosing a tenant ----------------------------------------------------------


@login_required
def index(request: HttpRequest) -> HttpResponse:
    memberships = list(
        TenantMembership.objects.filter(user=request.user).select_related("tenant").order_by("tenant__name")
    )
    if len(memberships) == 1:
        return redirect("console:usage", slug=memberships[0].tenant.slug)
    return render(request, "console/index.html", {"memberships": memberships, "page_title": "Tenants"})


# --- usage and session records ---------------------------------------------------


@tenant_view()
def usage(request: HttpRequest, access: Access) -> HttpResponse:
    days = daily_usage(access.tenant, today=timezone.localdate())
    labels = [day_title(day.date) for day in days]
    ticks = [day_label(day.date) for day in days]
    recent = list(
        Session.objects.filter(tenant=access.tenant)
        .select_related("api_key")
        .annotate(live_now=Case(When(_live_q(), then=Value(True)), default=Value(False),
                                output_field=BooleanField()),
                  cost_micros=Sum("turn_records__cost_micros"))
        .order_by("-started_at")[:RECENT_SESSIONS]
    )
    for session in recent:
        session.visitor_url = visitor_url(access.tenant.slug, session.visitor_id)
    costs = [d.cost_micros for d in days if d.cost_micros is not None]
    return render_page(
        request, access, "console/usage.html", title="Usage", section="usage",
        days=days,
        # The table lists the days something happened; the chart shows them all.
        used_days=[day for day in reversed(days) if day.used],
        sessions_chart=bar_chart([d.sessions for d in days], labels, unit="sessions", tick_labels=ticks),
        tokens_chart=bar_chart([d.tokens for d in days], labels, unit="tokens", tick_labels=ticks),
        totals={
            "sessions": sum(d.sessions for d in days),
            "turns": sum(d.turns for d in days),
            "tokens": sum(d.tokens for d in days),
            "audio_heard_seconds": sum(d.audio_heard_ms for d in days) / 1000,
            "audio_spoken_seconds": sum(d.audio_spoken_ms for d in days) / 1000,
            "cost_micros": sum(costs) if costs else None,
        },
        recent_sessions=recent,
        recent_limit=RECENT_SESSIONS,
        quota=tenant_quota_status(access.tenant),
    )


@tenant_view()
def session_detail(request: HttpRequest, access: Access, session_id: str) -> HttpResponse:
    session = get_object_or_404(
        Session.objects.select_related("api_key"), tenant=access.tenant, pk=session_id
    )
    conversation = [
        {"message": message, "blocks": message_blocks(message.content)}
        for message in selectors.session_conversation(session)
    ]
    tool_calls = [
        {"call": call, "arguments": pretty_json(call.arguments), "result": pretty_json(call.result)}
        for call in session.tool_calls.order_by("created_at", "pk")
    ]
    actions = OperatorAction.objects.filter(session=session, tenant=access.tenant).select_related("user")
    return render_page(
        request, access, "console/session_detail.html", title=f"Session {session.id}",
        section="usage", session=session, conversation=conversation, tool_calls=tool_calls,
        turns=list(session.turn_records.order_by("number")),
        page_history=session.page_history if isinstance(session.page_history, list) else [],
        actions=actions, visitor_url=visitor_url(access.tenant.slug, session.visitor_id),
        final_errors=sorted(str(s) for s in ToolCall.FINAL_STATUSES if s != ToolCall.Status.SUCCESS),
    )


def visitor_url(slug: str, visitor_id: str) -> str:
    """The page of a visitor's conversations; "" for a session without one.
    The id is the tenant's own string: every character but letters, digits
    and ``_.-~`` is escaped, "/" too, so that no part of it reads as a step
    of the path (only an id that is just "." or ".." still would, in a
    browser)."""
    if not visitor_id:
        return ""
    placeholder = "-"
    base = reverse("console:visitor", args=[slug, placeholder]).removesuffix(placeholder + "/")
    return f"{base}{quote(visitor_id, safe='')}/"


@tenant_view()
def visitor(request: HttpRequest, access: Access, visitor_id: str) -> HttpResponse:
    """The tenant's sessions with this visitor (its backend's id, from a
    visitor token), newest first; none of another tenant's, whatever the id."""
    sessions = list(
        Session.objects.filter(tenant=access.tenant, visitor_id=visitor_id)
        .annotate(live_now=Case(When(_live_q(), then=Value(True)), default=Value(False),
                                output_field=BooleanField()))
        .order_by("-started_at", "-pk")[:VISITOR_SESSIONS + 1]
    )
    return render_page(
        request, access, "console/visitor.html", title=f"Visitor {visitor_id}", section="usage",
        visitor_id=visitor_id, sessions=sessions[:VISITOR_SESSIONS],
        more=len(sessions) > VISITOR_SESSIONS, limit=VISITOR_SESSIONS,
    )


# --- keys ------------------------------------------------------------------------


@never_cache  # an owner sees the visitor secret here
@tenant_view()
def keys(request: HttpRequest, access: Access) -> HttpResponse:
    rows = (
        ApiKey.objects.filter(tenant=access.tenant)
        .annotate(
            sessions_today=Count(
                "sessions", filter=Q(sessions__started_at__gte=_start_of_today()), distinct=True
            ),
            live_sessions=Count("sessions", filter=_live_q("sessions__"), distinct=True),
        )
        .order_by("-created_at")
    )
    # The tenant's ceilings, set by the service's operators: shown, never changed here.
    ceilings = {
        "keys_held": sum(1 for key in rows if key.status != ApiKey.Status.REVOKED),
        "tenant_live_sessions": sum(key.live_sessions for key in rows),
    }
    return render_page(request, access, "console/keys.html", title="Keys", section="keys", keys=rows,
                       **ceilings)


@never_cache
@tenant_view(owner_only=True)
def key_create(request: HttpRequest, access: Access) -> HttpResponse:
    form = ApiKeyCreateForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            key, raw_key = tenancy.key_create(
                tenant=access.tenant,
                by=request.user,
                name=form.cleaned_data["name"],
                allowed_origins=form.cleaned_data["allowed_origins"],
                max_sessions=form.cleaned_data["max_sessions"],
                expires_at=form.cleaned_data["expires_at"],
                handoff=form.cleaned_data["handoff"],
            )
        except tenancy.KeyCeilingReached as refused:
            form.add_error(None, str(refused))
            return render_page(request, access, "console/key_form.html", title="New key",
                               section="keys", form=form, creating=True)
        logger.info("key created tenant=%s prefix=%s user=%s",
                    access.tenant.slug, key.prefix, request.user.pk)
        # The answer is never cached; reloading asks the browser to post
        # again, which would make another key.
        return render_page(request, access, "console/key_created.html", title=f"Key {key.prefix}",
                           section="keys", key=key, raw_key=raw_key,
                           embed_snippet=embed_snippet(request, raw_key))
    return render_page(request, access, "console/key_form.html", title="New key", section="keys",
                       form=form, creating=True)


def _ended_by_origins(key: ApiKey, origins: list[str]) -> int:
    """Live sessions of the key that a new list of allowed origins would end
    (an empty list allows any origin)."""
    if not origins:
        return 0
    return Session.objects.filter(_live_q(), api_key=key).exclude(origin__in=origins).count()


@never_cache
@tenant_view(owner_only=True)
def key_created(request: HttpRequest, access: Access, key_id: int) -> HttpResponse:
    # A publishable key is public by design: its page shows it and its
    # snippet at any time (a key made before keys were kept says it cannot).
    key = get_object_or_404(ApiKey, tenant=access.tenant, pk=key_id)
    raw_key = _published(key)
    return render_page(request, access, "console/key_created.html", title=f"Key {key.prefix}",
                       section="keys", key=key, raw_key=raw_key,
                       embed_snippet=embed_snippet(request, raw_key) if raw_key else None)


def _published(key: ApiKey) -> str | None:
    """The key itself (None for a key made before keys were kept)."""
    return key.publishable or None


def _preview(request: HttpRequest, key: ApiKey) -> Preview | None:
    """The real widget of this key on this console page, for the member
    reading it (docs/widget.md, Preview); None for a revoked key or one
    made before keys were kept."""
    raw_key = _published(key)
    if raw_key is None or key.status == ApiKey.Status.REVOKED:
        return None
    return widget_preview(request, raw_key, key_id=key.pk, user_id=request.user.pk)


@tenant_view(owner_only=True)
def key_edit(request: HttpRequest, access: Access, key_id: int) -> HttpResponse:
    key = get_object_or_404(ApiKey, tenant=access.tenant, pk=key_id)
    if key.status == ApiKey.Status.REVOKED:
        messages.error(request, "A revoked key cannot be changed.")
        return redirect("console:keys", slug=access.tenant.slug)
    initial = {"name": key.name, "allowed_origins": key.allowed_origins, "max_sessions": key.max_sessions,
               "handoff": key.handoff}
    form = ApiKeyEditForm(request.POST or None, initial=initial)
    ending = 0
    if request.method == "POST" and form.is_valid():
        changes = {
            field: form.cleaned_data[field]
            for field in initial
            if form.cleaned_data[field] != initial[field]
        }
        if "allowed_origins" in changes:
            ending = _ended_by_origins(key, changes["allowed_origins"])
        # Narrowing the origins ends the live sessions from the others: the
        # owner is told how many and saves again to go ahead.
        if ending and request.POST.get("confirm_ending") != str(ending):
            return render_page(request, access, "console/key_form.html", title=f"Edit key {key.prefix}",
                               section="keys", form=form, key=key, creating=False, ending=ending,
                               live_sessions=Session.objects.filter(_live_q(), api_key=key).count())
        if changes:
            tenancy.key_update(key=key, by=request.user, changes=changes)
            messages.success(request, f"Key {key.prefix} updated." + (
                f" {ending} live session{'s' if ending != 1 else ''} from removed origins "
                f"{'are' if ending != 1 else 'is'} being ended." if ending else ""))
        else:
            messages.info(request, "Nothing changed.")
        return redirect("console:keys", slug=access.tenant.slug)
    raw_key = _published(key)
    return render_page(request, access, "console/key_form.html", title=f"Edit key {key.prefix}",
                       section="keys", form=form, key=key, creating=False,
                       live_sessions=Session.objects.filter(_live_q(), api_key=key).count(),
                       embed_snippet=embed_snippet(request, raw_key) if raw_key else None,
                       appearance_form=WidgetAppearanceForm(initial=WidgetAppearanceForm.initial_of(
                           key.widget_appearance)))


@never_cache
@tenant_view()
def key_appearance(request: HttpRequest, access: Access, key_id: int) -> HttpResponse:
    """How the key's widget looks and speaks, with the real widget drawing
    it: owners change it (the key edit page's form posts here too), viewers
    read it; tenant_view refuses a viewer's post. A save from this page
    comes back to it, one from the edit page goes back there."""
    key = get_object_or_404(ApiKey, tenant=access.tenant, pk=key_id)
    if request.method == "POST" and key.status == ApiKey.Status.REVOKED:
        messages.error(request, "A revoked key cannot be changed.")
        return redirect("console:keys", slug=access.tenant.slug)
    initial = WidgetAppearanceForm.initial_of(key.widget_appearance)
    form = WidgetAppearanceForm(request.POST or None, initial=initial, read_only=not access.is_owner)
    if request.method == "POST" and form.is_valid():
        if key_set_appearance(key=key, look=form.cleaned_data["appearance"], by=request.user):
            messages.success(request, f"Appearance of the widget of key {key.prefix} saved: pages "
                                      "using it show it within a minute.")
        else:
            messages.info(request, "Nothing changed.")
        back = "console:key_appearance" if request.POST.get("from") == "preview" else "console:key_edit"
        return redirect(back, slug=access.tenant.slug, key_id=key.pk)
    return render_page(request, access, "console/key_appearance.html",
                       title=f"Appearance of the widget of key {key.prefix}", section="keys", key=key,
                       appearance_form=form, widget_preview=_preview(request, key))


@tenant_view(owner_only=True)
def key_revoke(request: HttpRequest, access: Access, key_id: int) -> HttpResponse:
    key = get_object_or_404(ApiKey, tenant=access.tenant, pk=key_id)
    if request.method == "POST":
        if key.status == ApiKey.Status.REVOKED:
            messages.info(request, f"Key {key.prefix} was already revoked.")
        else:
            # The service closes the key's live sessions on every process.
            tenancy.key_revoke(key=key, by=request.user)
            logger.info("key revoked tenant=%s prefix=%s user=%s", access.tenant.slug, key.prefix,
                        request.user.pk)
            messages.success(request, f"Key {key.prefix} revoked; its live sessions are being closed.")
        return redirect("console:keys", slug=access.tenant.slug)
    live = Session.objects.filter(_live_q(), api_key=key).count()
    return render_page(request, access, "console/key_revoke.html", title=f"Revoke key {key.prefix}",
                       section="keys", key=key, live_sessions=live,
                       demo_key=key.status != ApiKey.Status.REVOKED and selectors.is_the_demo_pages_key(key))


@require_POST
@tenant_view(owner_only=True)
def visitor_secret_rotate(request: HttpRequest, access: Access) -> HttpResponse:
    if request.POST.get("confirm") != "rotate":
        messages.error(request, "The visitor secret was not rotated: tick the box to confirm.")
    else:
        tenancy.visitor_secret_rotate(tenant=access.tenant, by=request.user)
        messages.success(request, "Visitor secret rotated. Visitor tokens signed with the old one are "
                                  "refused from now on: give your backend the new one.")
    return redirect(reverse("console:keys", args=[access.tenant.slug]) + "#visitor-tokens")


# --- budget ----------------------------------------------------------------------


@tenant_view()
def budget(request: HttpRequest, access: Access) -> HttpResponse:
    tenant = access.tenant
    initial = {
        "budget_usd": None if tenant.monthly_budget_micros is None
        else Decimal(tenant.monthly_budget_micros) / 1_000_000,
        "alert_webhook_url": tenant.alert_webhook_url,
    }
    form = BudgetForm(request.POST or None, initial=initial)
    if request.method == "POST" and form.is_valid():
        changed = tenancy.tenant_budget_update(
            tenant=tenant, by=request.user, monthly_budget_micros=form.budget_micros(),
            alert_webhook_url=form.cleaned_data["alert_webhook_url"],
        )
        if changed:
            messages.success(request, "Budget saved." if tenant.monthly_budget_micros
                             else "Budget saved: none is set, so no alert is sent.")
        else:
            messages.info(request, "Nothing changed.")
        return redirect("console:budget", slug=tenant.slug)
    now = timezone.now()
    month, _, _ = budgets.month_bounds(now)
    spent = budgets.spent_micros([tenant.pk], now).get(tenant.pk, 0)
    budget_micros = tenant.monthly_budget_micros or 0
    return render_page(
        request, access, "console/budget.html", title="Budget", section="budget", form=form,
        month=month, spent_usd=budgets.usd(spent), budget_usd=budgets.usd(budget_micros) if budget_micros else "",
        percent=round(spent * 100 / budget_micros) if budget_micros else None,
        alerts=BudgetAlert.objects.filter(tenant=tenant).order_by("-month", "-threshold")[:12],
        deliveries=AlertDelivery.objects.filter(tenant=tenant).order_by("-created_at", "-pk")[:12],
    )


# --- members ---------------------------------------------------------------------


@tenant_view()
def members(request: HttpRequest, access: Access) -> HttpResponse:
    form = InviteForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        # The same answer whatever accounts exist: an invitation is made and
        # sent for any address; who may accept is decided when the link is used.
        invitation, token = tenancy.invitation_create(
            tenant=access.tenant, email=form.cleaned_data["email"], role=form.cleaned_data["role"],
            by=request.user,
        )
        try:
            tenancy.invitation_send(
                invitation=invitation, accept_url=_invitation_url(request, token),
            )
        except (OSError, smtplib.SMTPException) as exc:
            logger.warning("invitation %s not sent: %s", invitation.pk, type(exc).__name__)
            tenancy.invitation_withdraw(invitation=invitation, by=None, reason="not sent")
            messages.error(request, f"The invitation to {invitation.email} could not be sent (the mail "
                                    "server did not take it); nothing changed. Try again later.")
            return redirect("console:members", slug=access.tenant.slug)
        messages.success(request, f"Invitation sent to {invitation.email}. The link works once, for "
                                  f"{_days(config().console.invitation_days)}; they become a "
                                  f"{invitation.get_role_display().lower()} when they accept.")
        return redirect("console:members", slug=access.tenant.slug)
    rows = (
        TenantMembership.objects.filter(tenant=access.tenant)
        .select_related("user")
        .order_by("user__username")
    )
    owners = sum(1 for row in rows if row.role == TenantMembership.Role.OWNER)
    pending = (
        Invitation.objects.filter(tenant=access.tenant, accepted_at__isnull=True,
                                  withdrawn_at__isnull=True, expires_at__gt=timezone.now())
        .select_related("invited_by").order_by("email")
    )
    return render_page(request, access, "console/members.html", title="Members", section="members",
                       members=rows, form=form, roles=TenantMembership.Role.choices,
                       last_owner=owners == 1, invitations=pending)


def _days(days: float) -> str:
    return f"{days:g} day{'s' if days != 1 else ''}"


def _invitation_url(request: HttpRequest, token: str) -> str:
    # The token travels as a query parameter: the access log writes its value
    # as [redacted] (owllayer_site/access_log.py).
    return request.build_absolute_uri(reverse("console:invitation") + "?" + urlencode({"token": token}))


@require_POST
@tenant_view(owner_only=True)
def invitation_withdraw(request: HttpRequest, access: Access, invitation_id: int) -> HttpResponse:
    invitation = get_object_or_404(Invitation, tenant=access.tenant, pk=invitation_id)
    if tenancy.invitation_withdraw(invitation=invitation, by=request.user):
        messages.success(request, f"The invitation to {invitation.email} was withdrawn; its link no "
                                  "longer works.")
    else:
        messages.info(request, f"The invitation to {invitation.email} was no longer pending.")
    return redirect("console:members", slug=access.tenant.slug)


# --- accepting an invitation (the invited person, not yet a member) -----------------

INVITATION_SESSION_KEY = "console_invitation_token"


@never_cache
def invitation(request: HttpRequest) -> HttpResponse:
    """The link in the e-mail. Its token is moved into the session at once
    and the browser sent on to this page without it, so the token is not left
    in the history or sent on in a Referer header; signing in keeps it."""
    if "token" in request.GET:
        request.session[INVITATION_SESSION_KEY] = request.GET["token"][:200]
        return redirect("console:invitation")
    token = request.session.get(INVITATION_SESSION_KEY)
    found = tenancy.invitation_for_token(token)
    user = request.user if request.user.is_authenticated else None
    sign_up = None
    if request.method == "POST":
        try:
            if request.POST.get("action") == "accept" and user is not None:
                membership, created = tenancy.invitation_accept(token=token, user=user)
                return _joined(request, membership, created)
            if request.POST.get("action") == "sign_up" and user is None:
                sign_up = InvitationSignUpForm(request.POST)
                if sign_up.is_valid():
                    new_user = tenancy.invitation_sign_up(
                        token=token, username=sign_up.cleaned_data["username"],
                        password=sign_up.cleaned_data["password1"],
                    )
                    login(request, new_user, backend="django.contrib.auth.backends.ModelBackend")
                    membership = TenantMembership.objects.select_related("tenant").get(
                        user=new_user, tenant_id=found.tenant_id)
                    return _joined(request, membership, True)
        except tenancy.InvitationRefused as refused:
            messages.error(request, str(refused))
        except IntegrityError:  # the username was taken meanwhile
            messages.error(request, "That username was just taken: choose another.")
    refusal = tenancy.invitation_refusal(found, user)
    usable = tenancy.invitation_refusal(found) is None
    has_account = usable and tenancy.invitation_has_account(found)
    if usable and user is None and not has_account and config().console.invitation_sign_up:
        sign_up = sign_up or InvitationSignUpForm()
    else:
        sign_up = None
    return render(request, "console/invitation.html", {
        "page_title": "Invitation",
        "invitation": found if usable else None,
        "refusal": refusal,
        "has_account": has_account,
        "sign_up": sign_up,
        "sign_up_allowed": config().console.invitation_sign_up,
    }, status=200 if usable else 404)


def _joined(request: HttpRequest, membership: TenantMembership, created: bool) -> HttpResponse:
    request.session.pop(INVITATION_SESSION_KEY, None)
    tenant = membership.tenant
    if created:
        messages.success(request, f"You joined {tenant.name} as {membership.get_role_display().lower()}.")
    else:
        messages.info(request, f"You were already a member of {tenant.name}; nothing changed.")
    return redirect("console:usage", slug=tenant.slug)


@require_POST
@tenant_view(owner_only=True)
def member_role(request: HttpRequest, access: Access, membership_id: int) -> HttpResponse:
    membership = get_object_or_404(TenantMembership, tenant=access.tenant, pk=membership_id)
    form = MemberRoleForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Unknown role.")
    else:
        try:
            tenancy.membership_set_role(
                membership=membership, role=form.cleaned_data["role"], by=request.user
            )
            messages.success(request, f"{membership.user.get_username()} is now {form.cleaned_data['role']}.")
        except tenancy.LastOwnerError:
            messages.error(
                request, "The last owner cannot stop being an owner; make someone else owner first."
            )
    return redirect("console:members", slug=access.tenant.slug)


@tenant_view(owner_only=True)
def member_remove(request: HttpRequest, access: Access, membership_id: int) -> HttpResponse:
    membership = get_object_or_404(
        TenantMembership.objects.select_related("user"), tenant=access.tenant, pk=membership_id
    )
    if request.method == "POST":
        try:
            tenancy.membership_remove(membership=membership, by=request.user)
        except tenancy.LastOwnerError:
            messages.error(request, "The last owner cannot be removed; make someone else owner first.")
            return redirect("console:members", slug=access.tenant.slug)
        messages.success(request, f"{membership.user.get_username()} removed.")
        if membership.user_id == request.user.pk:
            return redirect("console:index")  # no longer a member here
        return redirect("console:members", slug=access.tenant.slug)
    last_owner = (membership.role == TenantMembership.Role.OWNER and not TenantMembership.objects.filter(
        tenant=access.tenant, role=TenantMembership.Role.OWNER).exclude(pk=membership.pk).exists())
    return render_page(request, access, "console/member_remove.html",
                       title=f"Remove {membership.user.get_username()}", section="members",
                       member=membership, last_owner=last_owner)
