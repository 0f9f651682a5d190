"""Login throttling: django-axes with two limits, and the page a lock shows.

django-axes counts failed logins per username and address (the pair, its
``AXES_LOCKOUT_PARAMETERS``) and locks a pair at ``AXES_FAILURE_LIMIT``. Its
limit is one number for every group it counts, so the address alone, which
must take far more failures before it locks (an office behind one address,
or everyone on 127.0.0.1 locally), is counted here: the handler adds that an
address with ``OWLLAYER_LOGIN_ADDRESS_FAILURE_LIMIT`` failures over any
usernames is locked too (password spraying). A success resets only its own
pair, so signing in to one's own account never clears a spray's count.

A lock answers with ``lockout/admin.html`` or ``lockout/console.html`` (the
login page's look), status 429: which lock it is, how long it lasts, and the
``manage.py`` command that lifts it.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from axes.attempts import get_cool_off_threshold
from axes.handlers.database import AxesDatabaseHandler
from axes.helpers import get_client_ip_address, get_client_username, get_cool_off
from axes.models import AccessAttempt
from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import reverse
from django.utils import timezone

from runtime.config import config


def _failures(attempts) -> list[tuple[datetime, int]]:
    """(last failure time, failures) of each recorded attempt row."""
    return list(attempts.values_list("attempt_time", "failures_since_start"))


def _address_attempts(request: HttpRequest):
    """This address's attempt rows inside the cool-off, over every username."""
    return AccessAttempt.objects.filter(
        ip_address=request.axes_ip_address,  # type: ignore[attr-defined]
        attempt_time__gte=get_cool_off_threshold(request),
    )


class LoginThrottlingHandler(AxesDatabaseHandler):
    """django-axes' database handler, plus the address's own, larger limit."""

    def get_failures(self, request, credentials: dict | None = None) -> int:
        """The pair's failures; an address at its own limit counts as a
        locked pair, whichever username it tries next."""
        pair = super().get_failures(request, credentials)
        address = sum(count for _, count in _failures(_address_attempts(request)))
        if address >= config().login.address_failure_limit:
            return max(pair, config().login.failure_limit)
        return pair


@dataclass(frozen=True)
class Lock:
    """What the lockout page says."""

    username: str
    address: str
    whole_address: bool  # the address's limit, not the pair's
    lasts: str  # "15 minutes"
    ends_at: datetime
    command: str  # the manage.py command that lifts exactly this lock


def lock_ends(failures: list[tuple[datetime, int]], limit: int, cool_off: timedelta) -> datetime:
    """When the lock of these attempt rows ends: each row's failures stop
    counting a cool-off after its last one, oldest first, and the lock ends
    when fewer than `limit` are left."""
    left = sum(count for _, count in failures)
    for last_failure, count in sorted(failures):
        left -= count
        if left < limit:
            return last_failure + cool_off
    return timezone.now() + cool_off


def duration(delta: timedelta) -> str:
    """'15 minutes', '1 minute', '30 seconds', '1 hour 30 minutes'."""
    seconds = round(delta.total_seconds())
    if seconds < 60:
        return f"{seconds} second{'' if seconds == 1 else 's'}"
    hours, minutes = divmod(round(seconds / 60), 60)
    parts = [f"{hours} hour{'' if hours == 1 else 's'}"] if hours else []
    if minutes:
        parts.append(f"{minutes} minute{'' if minutes == 1 else 's'}")
    return " ".join(parts)


def current_lock(request: HttpRequest, username: str) -> Lock:
    """The lock this request ran into: the pair's when it is over its limit,
    else the address's."""
    address = getattr(request, "axes_ip_address", None) or get_client_ip_address(request) or ""
    cool_off = get_cool_off(request) or timedelta(0)
    pair = _failures(_address_attempts(request).filter(username=username))
    if sum(count for _, count in pair) >= config().login.failure_limit:
        return Lock(username=username, address=address, whole_address=False, lasts=duration(cool_off),
                    ends_at=lock_ends(pair, config().login.failure_limit, cool_off),
                    command=f"manage.py axes_reset_ip_username {address} {username}")
    everywhere = _failures(_address_attempts(request))
    return Lock(username=username, address=address, whole_address=True, lasts=duration(cool_off),
                ends_at=lock_ends(everywhere, config().login.address_failure_limit, cool_off),
                command=f"manage.py axes_reset_ip {address}")


def lockout_response(request: HttpRequest, *args, **kwargs) -> HttpResponse:
    """``AXES_LOCKOUT_CALLABLE``: the lockout page, in the look of the login
    that was refused. (django-axes passes the credentials in a different
    position from its sync and async middleware; the handler also keeps
    them on the request, which is where they are read.)"""
    credentials = getattr(request, "axes_credentials", None)
    username = get_client_username(request, credentials) or ""
    lock = current_lock(request, username)
    context = {"lock": lock, "failure_limit": config().login.failure_limit,
               "address_failure_limit": config().login.address_failure_limit}
    if request.path.startswith(reverse("admin:index")):
        context.update(admin.site.each_context(request), title="Too many failed sign-ins")
        template = "lockout/admin.html"
    else:
        template = "lockout/console.html"
    return render(request, template, context, status=config().login.lockout_status)
