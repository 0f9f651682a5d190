"""Writes to tenants, their members, their invitations and their keys, each
with its audit row: the one place they are made. The console's pages, the
Django admin (``console.admin``), the command line (``createtenant``,
``createapikey``, ``revokeapikey``) and the demo's set-up (``ensure_demo``)
all call these functions.

``by`` is the account that asked for the change, recorded on its
``OperatorAction`` row. A change of a key is recorded whoever made it (``by``
None: the command line, the demo's set-up); a new tenant or key is recorded
when an account made it.

Sync functions, one transaction per unit of work. A change that live
sessions must see (a key disabled, revoked, given other origins or another
expiry) is written first, then told over the channel layer
(``aitp.notify``); the receivers read the key again.
"""
from __future__ import annotations

import hashlib
import logging
import secrets
from datetime import datetime, timedelta

from django.contrib.auth import get_user_model
from django.core.mail import send_mail
from django.db import transaction
from django.utils import timezone
from django.utils.formats import date_format

from aitp import notify
from aitp.models import ApiKey, OperatorAction
from aitp.store import keys
from aitp.store.keys import KEY_PREFIX, LOOKUP_PREFIX_LENGTH
from runtime.config import config
from tenants.models import Invitation, Tenant, TenantMembership, generate_visitor_secret

logger = logging.getLogger(__name__)

OWNER = TenantMembership.Role.OWNER


# --- tenants --------------------------------------------------------------------------

# The tenant's ceilings (live sessions, keys): empty means none.
CEILING_FIELDS = ("max_sessions", "max_keys")
TENANT_FIELDS = ("slug", "name", "system_prompt", "monthly_token_quota", *CEILING_FIELDS)


def tenant_create(*, slug: str, by=None, name: str = "", system_prompt: str | None = None,
                  monthly_token_quota: int | None = None, **ceilings: int | None) -> Tenant:
    """Create a tenant, recording who did (the prompt by name only). It has no
    members yet: the service's operators, who alone create tenants, see every
    tenant without one and add its first owner. A ceiling not given is the
    default for new tenants; one given as None is no ceiling."""
    unknown = set(ceilings) - set(CEILING_FIELDS)
    if unknown:
        raise ValueError(f"not a tenant ceiling: {', '.join(sorted(unknown))}")
    given = {
        field: value for field, value in
        (("system_prompt", system_prompt), ("monthly_token_quota", monthly_token_quota))
        if value is not None
    } | ceilings
    with transaction.atomic():
        tenant = Tenant.objects.create(slug=slug, name=name or slug, **given)
        if by is not None:
            OperatorAction.objects.create(tenant=tenant, user=by, action="tenant_created", data={
                "fields": sorted({"slug", "name", *given}), "slug": tenant.slug, "name": tenant.name,
                "monthly_token_quota": tenant.monthly_token_quota,
                **{field: getattr(tenant, field) for field in CEILING_FIELDS},
            })
    if by is not None:
        logger.info("tenant created tenant=%s user=%s", tenant.slug, by.pk)
    return tenant


def tenant_update(*, tenant: Tenant, by, changes: dict) -> Tenant:
    """Change a tenant's slug, name, system prompt, monthly quota or ceilings,
    recording who did and what changed (the prompt by name only: it may be
    long). A lower ceiling closes nothing: it refuses what it no longer
    allows (new sessions, new keys) until the tenant is under it again."""
    unknown = set(changes) - set(TENANT_FIELDS)
    if unknown:
        raise ValueError(f"not a tenant field: {', '.join(sorted(unknown))}")
    if not changes:
        return tenant
    with transaction.atomic():
        for field, value in changes.items():
            setattr(tenant, field, value)
        tenant.save(update_fields=list(changes))
        data: dict = {"fields": sorted(changes)}
        for field in ("slug", "name", "monthly_token_quota", *CEILING_FIELDS):
            if field in changes:
                data[field] = changes[field]
        OperatorAction.objects.create(tenant=tenant, user=by, action="tenant_updated", data=data)
    return tenant


def tenant_budget_update(*, tenant: Tenant, by, monthly_budget_micros: int | None,
                         alert_webhook_url: str) -> bool:
    """Set the tenant's monthly budget (None: none) and its alert webhook
    (empty: e-mail only), recording who did; False when nothing changed. The
    budget only tells (``aitp.budgets``): it refuses nothing."""
    changes = {
        field: value for field, value in
        (("monthly_budget_micros", monthly_budget_micros), ("alert_webhook_url", alert_webhook_url))
        if getattr(tenant, field) != value
    }
    if not changes:
        return False
    with transaction.atomic():
        for field, value in changes.items():
            setattr(tenant, field, value)
        tenant.save(update_fields=list(changes))
        OperatorAction.objects.create(tenant=tenant, user=by, action="tenant_budget_updated",
                                      data={"fields": sorted(changes), **changes})
    logger.info("tenant budget updated tenant=%s fields=%s user=%s", tenant.slug,
                ",".join(sorted(changes)), getattr(by, "pk", None))
    return True


def visitor_secret_rotate(*, tenant: Tenant, by) -> str:
    """Give the tenant a new visitor secret, recording who did (never the
    secret); visitor tokens signed with the old one are refused from then on."""
    with transaction.atomic():
        tenant.visitor_secret = generate_visitor_secret()
        tenant.save(update_fields=["visitor_secret"])
        OperatorAction.objects.create(tenant=tenant, user=by, action="visitor_secret_rotated", data={})
    logger.info("visitor secret rotated tenant=%s user=%s", tenant.slug, getattr(by, "pk", None))
    return tenant.visitor_secret


# --- keys -----------------------------------------------------------------------------


class KeyCeilingReached(ValueError):
    """The tenant holds as many keys as its ceiling (``Tenant.max_keys``) allows."""


def key_ceiling_refusal(tenant_id: int, *, lock: bool = False) -> str | None:
    """Why this tenant may not have one more key (its keys that are not
    revoked already fill its ceiling), or None. ``lock``: counted under the
    tenant's row lock (inside a transaction), as ``key_create`` does; forms
    ask without it, to answer before anything is written."""
    tenants = Tenant.objects.select_for_update(no_key=True) if lock else Tenant.objects
    ceiling = tenants.values_list("max_keys", flat=True).get(pk=tenant_id)
    if ceiling is None:
        return None
    held = ApiKey.objects.filter(tenant_id=tenant_id).exclude(status=ApiKey.Status.REVOKED).count()
    if held < ceiling:
        return None
    count = "1 key" if held == 1 else f"{held} keys"
    return (f"This tenant already has {count}, as many as its ceiling allows: revoke a key it "
            "no longer uses, or ask the service's operators to raise the ceiling.")


def key_create(
    *,
    tenant: Tenant,
    by=None,
    name: str = "",
    allowed_origins: list[str] | tuple[str, ...] = (),
    max_sessions: int | None = None,
    expires_at: datetime | None = None,
    handoff: bool = False,
) -> tuple[ApiKey, str]:
    """Create a key, active; returns the row and the plaintext key (kept on
    the row, as publishable keys are public; never logged). Raises KeyCeilingReached when the tenant
    already holds ``max_keys`` keys that are not revoked (counted under the
    tenant's row lock, so two creations at once cannot both take the last
    one). ``max_sessions`` None: the default cap of a new key; ``handoff``:
    its sessions' agent may ask for a person (``connection.handoff``)."""
    raw_key = KEY_PREFIX + secrets.token_urlsafe(24).replace("-", "x").replace("_", "y")
    with transaction.atomic():
        refusal = key_ceiling_refusal(tenant.pk, lock=True)
        if refusal is not None:
            raise KeyCeilingReached(refusal)
        key = ApiKey.objects.create(
            tenant=tenant,
            name=name,
            prefix=raw_key[:LOOKUP_PREFIX_LENGTH],
            key_hash=keys.key_hash(raw_key),
            publishable=raw_key,
            allowed_origins=list(allowed_origins),
            max_sessions=max_sessions or config().store.default_session_cap,
            expires_at=expires_at,
            handoff=handoff,
        )
        if by is not None:
            OperatorAction.objects.create(
                tenant=tenant, user=by, action="key_created",
                data={
                    "prefix": key.prefix, "name": name, "allowed_origins": list(allowed_origins),
                    "max_sessions": key.max_sessions,
                    "expires_at": expires_at.isoformat() if expires_at else None,
                    "handoff": handoff,
                },
            )
    return key, raw_key


KEY_FIELDS = ("name", "allowed_origins", "max_sessions", "expires_at", "handoff", "widget_appearance", "status")


def key_update(*, key: ApiKey, changes: dict, by=None) -> ApiKey:
    """Change a key's name, origins, cap, expiry, hand-off, widget appearance or status,
    recording who did and what changed (a value the key already has is no
    change); ``expires_at=None`` clears the expiry. A revoked key is never
    made usable again (ValueError).

    The key's live sessions see the change at once, on every process: when
    its origins or expiry changed they check the key again (a page from a
    removed origin, or past the new expiry, closes), and when it was disabled
    or revoked they close. ``handoff`` is offered to the agent as a session
    opens: a change reaches the sessions opened after it.
    ``widget_appearance`` is kept whole, as given: it comes checked from
    ``widget.services.key_set_appearance`` (the widget reads it as it
    starts, docs/widget.md, appearance)."""
    unknown = set(changes) - set(KEY_FIELDS)
    if unknown:
        raise ValueError(f"not a key field: {', '.join(sorted(unknown))}")
    status = changes.get("status", key.status)
    if key.status == ApiKey.Status.REVOKED and status != ApiKey.Status.REVOKED:
        raise ValueError("a revoked key cannot be re-activated")
    status_changed = status != key.status
    fields = {
        field: list(value) if field == "allowed_origins" else value
        for field, value in changes.items()
        if field != "status" and value != getattr(key, field)
    }
    if not fields and not status_changed:
        return key
    with transaction.atomic():
        if fields:
            for field, value in fields.items():
                setattr(key, field, value)
            key.save(update_fields=list(fields))
            recorded = {field: value.isoformat() if isinstance(value, datetime) else value
                        for field, value in fields.items()}
            OperatorAction.objects.create(
                tenant_id=key.tenant_id, user=by, action="key_updated",
                data={"prefix": key.prefix, **recorded},
            )
        if status_changed:
            key.status = status
            if status == ApiKey.Status.REVOKED:
                key.revoked_at = timezone.now()
            key.save(update_fields=["status", "revoked_at"])
            OperatorAction.objects.create(
                tenant_id=key.tenant_id, user=by, action=f"key_{status}", data={"prefix": key.prefix}
            )
    keys.key_changed(key)
    recheck = "allowed_origins" in fields or "expires_at" in fields
    if recheck or (status_changed and status != ApiKey.Status.ACTIVE):
        transaction.on_commit(lambda: notify.key_changed(key.pk))
    return key


def key_revoke(*, key: ApiKey, by=None) -> ApiKey:
    """Revoke a key for good; its live sessions close on every process."""
    return key_update(key=key, changes={"status": ApiKey.Status.REVOKED}, by=by)


# --- members --------------------------------------------------------------------------


class LastOwnerError(ValueError):
    """The change would leave the tenant without an owner."""


def _lock_owners(tenant_id: int) -> list[int]:
    # Locking every owner row serialises two owners demoting or removing each
    # other at once: the second sees the first's change and is refused.
    return list(
        TenantMembership.objects.select_for_update()
        .filter(tenant_id=tenant_id, role=OWNER)
        .order_by("pk")
        .values_list("pk", flat=True)
    )


def _audit(membership: TenantMembership, by, action: str, **data) -> None:
    OperatorAction.objects.create(
        tenant_id=membership.tenant_id, user=by, action=action,
        data={"member": membership.user.get_username(), **data},
    )


def membership_add(*, tenant: Tenant, user, role: str, by,
                   operators_allowed: bool = False) -> TenantMembership:
    """``operators_allowed``: only a superuser (in the admin) puts staff
    accounts into a tenant; a tenant's owner never can."""
    if (user.is_staff or user.is_superuser) and not operators_allowed:
        raise ValueError("operator accounts are not added from the console")
    with transaction.atomic():
        membership = TenantMembership.objects.create(tenant=tenant, user=user, role=role)
        _audit(membership, by, "member_added", role=role)
    logger.info("member added tenant=%s user=%s role=%s", tenant.slug, user.pk, role)
    return membership


def membership_set_role(*, membership: TenantMembership, role: str, by) -> TenantMembership:
    with transaction.atomic():
        owners = _lock_owners(membership.tenant_id)
        current = TenantMembership.objects.select_for_update().get(pk=membership.pk)
        if current.role == role:
            return current
        if current.role == OWNER and owners == [current.pk]:
            raise LastOwnerError("a tenant needs at least one owner")
        previous = current.role
        current.role = role
        current.save(update_fields=["role"])
        _audit(current, by, "member_role_changed", role=role, previous=previous)
    logger.info("member role changed tenant=%s membership=%s role=%s",
                current.tenant_id, current.pk, role)
    return current


def membership_remove(*, membership: TenantMembership, by) -> None:
    with transaction.atomic():
        owners = _lock_owners(membership.tenant_id)
        current = TenantMembership.objects.select_for_update().filter(pk=membership.pk).first()
        if current is None:
            return  # already removed by someone else
        if current.role == OWNER and owners == [current.pk]:
            raise LastOwnerError("a tenant needs at least one owner")
        _audit(current, by, "member_removed", role=current.role)
        current.delete()
    logger.info("member removed tenant=%s membership=%s", membership.tenant_id, membership.pk)


# --- invitations ----------------------------------------------------------------------
#
# An owner invites an e-mail address; the membership exists only once the
# person at that address accepts, signed in as the account with that address
# (or as the account a new person makes through the link). Inviting answers
# the same whatever accounts exist: nothing is looked up until the link is
# opened, and only its holder learns more.

INVITATION_UNUSABLE = (
    "This invitation link cannot be used: it was used already, withdrawn or has expired, "
    "or it is not a link we sent. Ask the tenant's owner for a new invitation."
)


class InvitationRefused(ValueError):
    """The invitation cannot be accepted; the message is for the person holding the link."""


def normalize_email(address: str) -> str:
    return address.strip().lower()


def _token_hash(token: str) -> str:
    # The token is 256 random bits: a plain hash is enough to keep a leaked
    # database from holding usable links.
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def invitation_create(*, tenant: Tenant, email: str, role: str, by) -> tuple[Invitation, str]:
    """Invite an address into a tenant; returns the row and the link's token
    (for the e-mail only: it is stored hashed). A pending invitation of the
    same address to the same tenant is withdrawn: only the newest link works."""
    now = timezone.now()
    email = normalize_email(email)
    token = secrets.token_urlsafe(32)
    with transaction.atomic():
        replaced = Invitation.objects.filter(
            tenant=tenant, email=email, accepted_at__isnull=True, withdrawn_at__isnull=True,
        ).update(withdrawn_at=now)
        invitation = Invitation.objects.create(
            tenant=tenant, email=email, role=role, token_hash=_token_hash(token), invited_by=by,
            created_at=now, expires_at=now + timedelta(days=config().console.invitation_days),
        )
        OperatorAction.objects.create(tenant=tenant, user=by, action="member_invited", data={
            "email": email, "role": role, "invitation": invitation.pk, "replaced": replaced,
        })
    logger.info("member invited tenant=%s invitation=%s user=%s", tenant.slug, invitation.pk, by.pk)
    return invitation, token


def invitation_send(*, invitation: Invitation, accept_url: str) -> None:
    """E-mail the link (``accept_url`` holds the token). Raises what the mail
    backend raises (``OSError``, ``smtplib.SMTPException``)."""
    inviter = invitation.invited_by.get_username() if invitation.invited_by else "An owner"
    expires_at = timezone.localtime(invitation.expires_at)
    expires = f"{date_format(expires_at, 'DATETIME_FORMAT')} {expires_at.tzname()}"
    send_mail(
        subject=f"Invitation to {invitation.tenant.name} on OwlLayer",
        message=(
            f"{inviter} invites you to {invitation.tenant.name} on OwlLayer, as "
            f"{invitation.get_role_display().lower()}.\n\n"
            f"To accept, open this link (it works once, until {expires}):\n\n{accept_url}\n\n"
            "You will sign in with the account that has this e-mail address, or, if you have "
            "none, choose a username and password.\n\n"
            "If you did not expect this invitation, ignore this e-mail.\n"
        ),
        from_email=None,
        recipient_list=[invitation.email],
    )


def invitation_withdraw(*, invitation: Invitation, by, reason: str = "withdrawn") -> bool:
    """Withdraw a pending invitation (its link stops working); False when it
    was no longer pending. ``by`` None: the server withdrew it (``reason``)."""
    with transaction.atomic():
        current = Invitation.objects.select_for_update().filter(pk=invitation.pk).first()
        if current is None or current.accepted_at is not None or current.withdrawn_at is not None:
            return False
        current.withdrawn_at = timezone.now()
        current.save(update_fields=["withdrawn_at"])
        OperatorAction.objects.create(
            tenant_id=current.tenant_id, user=by, action="invitation_withdrawn",
            data={"email": current.email, "role": current.role, "invitation": current.pk,
                  "reason": reason},
        )
    logger.info("invitation withdrawn tenant=%s invitation=%s reason=%s",
                current.tenant_id, current.pk, reason)
    return True


def invitation_for_token(token: str | None) -> Invitation | None:
    """The invitation a link's token names, pending or not; None for anything else."""
    if not token or len(token) > 200:
        return None
    return (Invitation.objects.select_related("tenant", "invited_by")
            .filter(token_hash=_token_hash(token)).first())


def invitation_refusal(invitation: Invitation | None, user=None, *, now: datetime | None = None) -> str | None:
    """Why this invitation cannot be accepted (by ``user``, when given); None if it can.
    Used, withdrawn, expired and unknown links get the same answer."""
    if invitation is None or not invitation.is_pending(now or timezone.now()):
        return INVITATION_UNUSABLE
    if user is None:
        return None
    if user.is_staff or user.is_superuser:
        # Only a superuser puts an operator account into a tenant (in the admin).
        return "Operator accounts cannot join a tenant through an invitation."
    if not user.is_active or normalize_email(user.email or "") != invitation.email:
        return ("This invitation was sent to another e-mail address. Sign out, then open the "
                "link again and sign in as the account with that address.")
    return None


def _locked_invitation(token: str) -> Invitation | None:
    if not token or len(token) > 200:
        return None
    # No join: PostgreSQL locks no row on the nullable side of an outer join.
    return Invitation.objects.select_for_update().filter(token_hash=_token_hash(token)).first()


def _accept(invitation: Invitation, user, now: datetime) -> tuple[TenantMembership, bool]:
    membership, created = TenantMembership.objects.get_or_create(
        tenant=invitation.tenant, user=user, defaults={"role": invitation.role},
    )
    invitation.accepted_at, invitation.accepted_by = now, user
    invitation.save(update_fields=["accepted_at", "accepted_by"])
    # A new member is recorded as any other; one who already was, as an accepted invitation.
    OperatorAction.objects.create(
        tenant_id=invitation.tenant_id, user=user,
        action="member_added" if created else "invitation_accepted",
        data={"member": user.get_username(), "role": membership.role, "invitation": invitation.pk,
              "invited_by": invitation.invited_by.get_username() if invitation.invited_by else None},
    )
    logger.info("invitation accepted tenant=%s invitation=%s user=%s new_member=%s",
                invitation.tenant_id, invitation.pk, user.pk, created)
    return membership, created


def invitation_accept(*, token: str, user) -> tuple[TenantMembership, bool]:
    """Accept as the signed-in ``user``: the membership (and whether it is new).
    The link is used up; raises InvitationRefused with the reason otherwise."""
    now = timezone.now()
    with transaction.atomic():
        invitation = _locked_invitation(token)
        refusal = invitation_refusal(invitation, user, now=now)
        if refusal is not None:
            raise InvitationRefused(refusal)
        assert invitation is not None
        return _accept(invitation, user, now)


def invitation_has_account(invitation: Invitation) -> bool:
    """Whether an account with the invited address exists (told only to the link's holder)."""
    return get_user_model().objects.filter(email__iexact=invitation.email).exists()


def invitation_sign_up(*, token: str, username: str, password: str):
    """A new person makes an account through the link, with the invited
    address, and accepts; returns the user. Refused when sign-up through
    invitations is off or an account with the address exists (it signs in)."""
    now = timezone.now()
    with transaction.atomic():
        invitation = _locked_invitation(token)
        refusal = invitation_refusal(invitation, now=now)
        if refusal is not None:
            raise InvitationRefused(refusal)
        assert invitation is not None
        if not config().console.invitation_sign_up:
            raise InvitationRefused("New accounts are not made here: ask the service's operators "
                                    "for an account, then sign in to accept.")
        if invitation_has_account(invitation):
            raise InvitationRefused("An account with this e-mail address exists: sign in to accept.")
        user = get_user_model().objects.create_user(
            username=username, email=invitation.email, password=password,
        )
        _accept(invitation, user, now)
    return user
