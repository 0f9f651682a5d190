"""Console writes, each with its audit row: the console's pages and the
Django admin (``console.admin``) both change keys and members through here,
and the admin creates and changes tenants through here.

Keys are changed through ``aitp.services``; ``key_create`` only adds the
audit row that ``api_key_create`` does not write, in the same transaction,
and ``key_update`` also clears an expiry, which ``api_key_update`` cannot.
"""
from __future__ import annotations

import logging
from datetime import datetime

from django.db import transaction

from aitp import services as aitp_services
from aitp.models import ApiKey, OperatorAction
from tenants.models import Tenant, TenantMembership

logger = logging.getLogger(__name__)

OWNER = TenantMembership.Role.OWNER


class LastOwnerError(ValueError):
    """The change would leave the tenant without an owner."""


def key_create(
    *, tenant: Tenant, by, name: str, allowed_origins: list[str], max_sessions: int,
    expires_at: datetime | None = None,
) -> tuple[ApiKey, str]:
    """Create a key and record who did; returns the row and the plaintext (never logged)."""
    with transaction.atomic():
        key, raw_key = aitp_services.api_key_create(
            tenant=tenant, name=name, allowed_origins=allowed_origins,
            max_sessions=max_sessions, expires_at=expires_at,
        )
        OperatorAction.objects.create(
            tenant=tenant, user=by, action="key_created",
            data={
                "prefix": key.prefix, "name": name, "allowed_origins": list(allowed_origins),
                "max_sessions": key.max_sessions,
                "expires_at": expires_at.isoformat() if expires_at else None,
            },
        )
    return key, raw_key


TENANT_FIELDS = ("slug", "name", "system_prompt", "monthly_token_quota")


def tenant_create(*, slug: str, by, name: str = "", system_prompt: str | None = None,
                  monthly_token_quota: int | None = None) -> Tenant:
    """Create a tenant, recording who did (the prompt by name only). It has no
    members yet: the service's operators, who alone create tenants, see every
    tenant without one and add its first owner."""
    with transaction.atomic():
        tenant = aitp_services.tenant_create(slug=slug, name=name)
        given = {
            field: value for field, value in
            (("system_prompt", system_prompt), ("monthly_token_quota", monthly_token_quota))
            if value is not None
        }
        if given:
            for field, value in given.items():
                setattr(tenant, field, value)
            tenant.save(update_fields=list(given))
        OperatorAction.objects.create(tenant=tenant, user=by, action="tenant_created", data={
            "fields": sorted({"slug", "name", *given}), "slug": tenant.slug, "name": tenant.name,
            "monthly_token_quota": tenant.monthly_token_quota,
        })
    logger.info("tenant created tenant=%s user=%s", tenant.slug, by.pk)
    return tenant


def tenant_update(*, tenant: Tenant, by, changes: dict) -> Tenant:
    """Change a tenant's slug, name, system prompt or monthly quota, recording
    who did and what changed (the prompt by name only: it may be long)."""
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
        for field in ("slug", "name", "monthly_token_quota"):
            if field in changes:
                data[field] = changes[field]
        OperatorAction.objects.create(tenant=tenant, user=by, action="tenant_updated", data=data)
    return tenant


KEY_FIELDS = ("name", "allowed_origins", "max_sessions", "expires_at")


def key_update(*, key: ApiKey, by, changes: dict) -> ApiKey:
    """Change a key's name, origins, cap or expiry, recording who did; live
    sessions re-check the key when its origins or expiry changed (so one from
    a removed origin closes at once). ``expires_at=None`` clears the expiry."""
    unknown = set(changes) - set(KEY_FIELDS)
    if unknown:
        raise ValueError(f"not a key field: {', '.join(sorted(unknown))}")
    clear_expiry = "expires_at" in changes and changes["expires_at"] is None
    rest = {field: value for field, value in changes.items() if value is not None}
    with transaction.atomic():
        if clear_expiry and key.expires_at is not None:
            key.expires_at = None
            key.save(update_fields=["expires_at"])
            OperatorAction.objects.create(
                tenant_id=key.tenant_id, user=by, action="key_updated",
                data={"prefix": key.prefix, "expires_at": None},
            )
        if rest:
            aitp_services.api_key_update(key=key, user=by, **rest)
    return key


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
