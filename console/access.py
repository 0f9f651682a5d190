"""Who may see which tenant, and how a tenant page is rendered.

Every tenant page goes through ``tenant_view``: the tenant comes from the
signed-in user's own memberships, never from the URL alone, so another
tenant's slug is a 404 whatever the user guesses. Every object a view loads
is then filtered by that tenant as well.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import wraps

from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from tenants.models import Tenant, TenantMembership

SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


@dataclass(frozen=True)
class Access:
    tenant: Tenant
    membership: TenantMembership

    @property
    def is_owner(self) -> bool:
        return self.membership.role == TenantMembership.Role.OWNER


def tenant_view(*, owner_only: bool = False):
    """Resolve ``slug`` to the user's membership; viewers get 403 on any write.

    ``owner_only`` refuses viewers on GET too, for pages that only lead to a
    change (the new-key form, the revoke confirmation).
    """

    def decorate(view):
        @wraps(view)
        def wrapper(request: HttpRequest, slug: str, *args, **kwargs) -> HttpResponse:
            membership = (
                TenantMembership.objects.select_related("tenant")
                .filter(user=request.user, tenant__slug=slug)
                .first()
            )
            if membership is None:
                raise Http404("no such tenant")
            access = Access(tenant=membership.tenant, membership=membership)
            if (owner_only or request.method not in SAFE_METHODS) and not access.is_owner:
                raise PermissionDenied("owners only")
            return view(request, access, *args, **kwargs)

        return login_required(wrapper)

    return decorate


def render_page(
    request: HttpRequest, access: Access, template: str, *, title: str, section: str, **context
) -> HttpResponse:
    """Render a tenant page with what the base template needs."""
    other_tenants = (
        TenantMembership.objects.filter(user=request.user).exclude(tenant=access.tenant).exists()
    )
    return render(
        request,
        template,
        {
            "tenant": access.tenant,
            "membership": access.membership,
            "is_owner": access.is_owner,
            "other_tenants": other_tenants,
            "section": section,
            "page_title": title,
            **context,
        },
    )
