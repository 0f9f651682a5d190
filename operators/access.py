"""A watcher's access changed: its watch sockets look again at once.

What a watch socket may carry is decided when it reads (``operators.selectors``:
active staff, the tenants of the user's memberships, every tenant for a
superuser). A socket already open learns of a change here: a membership
added, re-roled or removed, an account's staff, superuser or active flag
changed, an account deleted. These are written by the console's services,
the admin's tenant pages and Django's own user admin and commands, so the
notice is sent from the model signals, after the commit, whoever wrote: it
decides nothing, it only says "read again" (``watch.access``) to the user's
sockets on every process. A write that sends no signal (a queryset
``update()``), or a notice lost with Redis away, is caught by each socket's
own re-check every OWLLAYER_HEARTBEAT_INTERVAL.
"""
from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models.signals import post_delete, post_save

from aitp import notify
from tenants.models import TenantMembership

# The account fields that decide what a watcher sees.
WATCH_FIELDS = frozenset({"is_active", "is_staff", "is_superuser"})


def user_watch_group(user_id: int) -> str:
    return f"operators.watcher.{user_id}"


def access_changed(user_id: int) -> None:
    """Tell the user's watch sockets, once the change is committed."""
    transaction.on_commit(lambda: notify.send(user_watch_group(user_id), "watch.access"))


def _membership_saved(sender, instance: TenantMembership, **kwargs) -> None:
    access_changed(instance.user_id)


def _account_saved(sender, instance, update_fields=None, **kwargs) -> None:
    # A sign-in writes last_login, a password change the password: neither
    # changes what the account may watch.
    if update_fields is not None and not WATCH_FIELDS & set(update_fields):
        return
    access_changed(instance.pk)


def _account_deleted(sender, instance, **kwargs) -> None:
    access_changed(instance.pk)


def connect_receivers() -> None:
    user_model = get_user_model()
    post_save.connect(_membership_saved, sender=TenantMembership, dispatch_uid="operators.membership_saved")
    post_delete.connect(_membership_saved, sender=TenantMembership,
                        dispatch_uid="operators.membership_deleted")
    post_save.connect(_account_saved, sender=user_model, dispatch_uid="operators.account_saved")
    post_delete.connect(_account_deleted, sender=user_model, dispatch_uid="operators.account_deleted")
