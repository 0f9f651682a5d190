"""The admin's static files are served by the application itself (daphne serves none)."""
from __future__ import annotations

import pytest


@pytest.mark.django_db
def test_the_admin_stylesheet_is_served(client):
    answer = client.get("/static/admin/css/base.css")
    assert answer.status_code == 200
    assert b"body" in b"".join(answer.streaming_content if answer.streaming else [answer.content])


@pytest.mark.django_db
def test_the_admin_is_branded_as_owllayer(admin_client):
    page = admin_client.get("/admin/")
    assert page.status_code == 200
    assert b"OwlLayer admin" in page.content
