"""No tables of its own: the live pages read aitp's sessions.

``LiveSession`` exists so the admin index and its side bar list a
"Live sessions" entry (Django's admin lists models, not views); its admin
sends the user on to the live pages.
"""
from __future__ import annotations

from aitp.models import Session


class LiveSession(Session):
    class Meta:
        proxy = True
        verbose_name = "live session"
        verbose_name_plural = "live sessions"
        # Access follows staff status and tenancy (see operators.admin), not
        # model permissions: none are created.
        default_permissions = ()
