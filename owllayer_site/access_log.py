"""daphne's access log, without secrets.

Browsers cannot set headers on a WebSocket, so a page may put its key in the
URL (``/owllayer?apiKey=...``); daphne's own access log writes every path
whole. This writer replaces the value of every secret-looking query
parameter with ``[redacted]`` before the line is written, for HTTP requests
and every WebSocket event alike. ``install()`` makes daphne's command line
use it (owllayer_site.serve calls it before starting daphne).
"""
from __future__ import annotations

import re

from daphne.access import AccessLogGenerator

REDACTED = "[redacted]"
# Query parameters whose values are secrets; matched case-insensitively.
SECRET_PARAMETERS = ("apiKey", "api_key", "key", "token", "access_token", "secret", "password")

_SECRET_VALUE = re.compile(
    r"([?&;](?:" + "|".join(re.escape(name) for name in SECRET_PARAMETERS) + r")=)[^&;#\s\"]*",
    re.IGNORECASE,
)


def redact(text: str) -> str:
    """``text`` with the values of secret query parameters replaced."""
    return _SECRET_VALUE.sub(r"\1" + REDACTED, text)


class RedactingAccessLogGenerator(AccessLogGenerator):
    def __call__(self, protocol, action, details):
        if isinstance(details, dict) and isinstance(details.get("path"), str):
            details = {**details, "path": redact(details["path"])}
        return super().__call__(protocol, action, details)

    def write_entry(self, host, date, request, *args, **kwargs):
        # Whatever daphne adds to a line later, the request part is cleaned too.
        return super().write_entry(host, date, redact(request), *args, **kwargs)


def install() -> None:
    """Make daphne's command line write its access log through the redactor."""
    import daphne.cli

    daphne.cli.AccessLogGenerator = RedactingAccessLogGenerator
