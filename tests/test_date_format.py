"""One way to write a moment across the admin and the custom pages: "3 Dec
2026, 14:05" (settings.DATETIME_FORMAT), never Django's English default
("Dec. 3, 2026, 2:05 p.m."), ISO dates or a month in full.

Each kind of page is rendered with a row whose moment is MOMENT, and must
show it that way and show no date any other way."""
from __future__ import annotations

import re

import pytest
from django.contrib.admin.utils import quote
from django.core import mail
from django.test import Client
from django.urls import reverse

from tests.support.admin_rows import MOMENT, VISITOR_ID, admin_rows

pytestmark = pytest.mark.django_db

WRITTEN = "3 Dec 2026, 14:05"
# An invitation still waiting expires after MOMENT, whenever the tests run.
LATER, WRITTEN_LATER = MOMENT.replace(year=2126), "3 Dec 2126, 14:05"
MONTHS = "Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec"
# A date written any way but the site's own.
OTHER_WAYS = re.compile(
    r"\b\d{4}-\d\d-\d\d\b"                                    # 2026-12-03
    r"|\b\d{1,2}/\d{1,2}/\d{2,4}\b"                           # 12/03/2026
    r"|\b[ap]\.m\."                                          # 2:05 p.m.
    rf"|\b(?:{MONTHS})\.? \d{{1,2}}(?:,| \d{{4}})"            # Dec. 3, 2026 / Dec 3 2026
    r"|\b(?:January|February|March|April|June|July|August|September|October|November|December)\b",
)


def shown_text(html: str) -> str:
    """What a reader sees: no scripts (their JSON carries ISO times for the
    page's code) and no attributes (a <time>'s datetime is ISO for machines)."""
    html = re.sub(r"<script\b.*?</script>", "", html, flags=re.S)
    html = re.sub(r"<(?:style|svg)\b.*?</(?:style|svg)>", "", html, flags=re.S)
    return re.sub(r"<[^>]*>", " ", html)


def signed_in(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def rows():
    from aitp import tenancy
    from aitp.models import ApiKey, OperatorAction
    from approvals.models import Approval
    from demo.models import DemoOrder
    from tenants.models import Invitation

    made = admin_rows()
    # Every moment these pages show, at MOMENT.
    Approval.objects.update(created_at=MOMENT, deadline=MOMENT, decided_at=MOMENT, reviewed_at=MOMENT)
    ApiKey.objects.update(created_at=MOMENT, expires_at=MOMENT, last_used_at=MOMENT)
    DemoOrder.objects.update(updated_at=MOMENT)
    OperatorAction.objects.update(created_at=MOMENT)
    tenant = made.tenants[0]
    owner = tenant.memberships.get().user
    tenancy.invitation_create(tenant=tenant, email="ivy@shop.example", role="viewer", by=owner)
    Invitation.objects.update(created_at=MOMENT, expires_at=LATER)
    made.owner = owner
    return made


def admin_pages(rows) -> dict[str, str]:
    session, approval = rows.sessions[0], rows.approvals[1]
    return {
        "an admin change list": reverse("admin:aitp_session_changelist"),
        "an admin record page": reverse("admin:aitp_session_change", args=[quote(session.pk)]),
        "the keys in the admin": reverse("admin:aitp_apikey_changelist"),
        "the demo store's orders": reverse("admin:demo_demoorder_changelist"),
        "the approvals in the admin": reverse("admin:approvals_approval_changelist"),
        "an approval's review page": reverse("admin:approvals_reviewedapproval_change", args=[approval.pk]),
        "a live session's page": reverse("operators:live_session", args=[session.pk]),
    }


def console_pages(rows) -> dict[str, str]:
    from console.views import visitor_url

    slug, session = rows.tenants[0].slug, rows.sessions[0]
    return {
        "the console's usage": reverse("console:usage", args=[slug]),
        "the console's keys": reverse("console:keys", args=[slug]),
        "the console's members": reverse("console:members", args=[slug]),
        "the console's session record": reverse("console:session", args=[slug, session.pk]),
        "the console's visitor": visitor_url(slug, VISITOR_ID),
    }


PAGES = ["an admin change list", "an admin record page", "the keys in the admin", "the demo store's orders",
         "the approvals in the admin", "an approval's review page", "a live session's page",
         "the console's usage", "the console's keys", "the console's members", "the console's session record",
         "the console's visitor"]


@pytest.mark.parametrize("page", PAGES)
def test_every_kind_of_page_writes_a_moment_one_way(rows, page):
    admin, console = admin_pages(rows), console_pages(rows)
    client = signed_in(rows.root if page in admin else rows.owner)

    answer = client.get(admin.get(page) or console[page])

    assert answer.status_code == 200
    text = shown_text(answer.content.decode())
    assert WRITTEN in text
    assert not OTHER_WAYS.search(text), OTHER_WAYS.search(text).group(0)
    assert re.search(r"\bUTC\b", text), "the page names the time zone"


def test_a_moment_on_hover_is_written_the_same_way_with_its_zone(rows):
    html = signed_in(rows.root).get(reverse("operators:live_session", args=[rows.sessions[0].pk])).content.decode()

    titles = re.findall(r'<time datetime="[^"]+" title="([^"]+)"', html)
    assert f"{WRITTEN} UTC" in titles  # the session's start
    assert all(re.fullmatch(rf"\d{{1,2}} (?:{MONTHS}) \d{{4}}, \d\d:\d\d UTC", title) for title in titles), titles


def test_the_invitation_email_writes_its_expiry_the_same_way(rows, settings):
    from aitp import tenancy
    from tenants.models import Invitation

    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    tenancy.invitation_send(invitation=Invitation.objects.get(), accept_url="https://owl.example/x")

    (message,) = mail.outbox
    assert f"until {WRITTEN_LATER} UTC)" in message.body
    assert not OTHER_WAYS.search(message.body)
