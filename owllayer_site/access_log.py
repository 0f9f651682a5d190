"""daphne's access log, without secrets.

Browsers cannot set headers on a WebSocket, so a page may put its key in the
URL (``/owllayer?apiKey=...``); daphne's own access log writes every path
whole, as the client sent it. This writer replaces the value of every
key-like query parameter with ``[redacted]`` before the line is written, for
HTTP requests and every WebSocket event alike. ``install()`` makes daphne's
command line use it (owllayer_site.serve calls it before starting daphne).

A parameter is judged by its name as an application would read it, however
it was spelled: percent-decoded (repeatedly: ``%2561`` is ``a`` after two
passes), ``+`` read as a space, Unicode-normalised (NFKC) and case-folded,
with everything but letters and digits dropped. So ``api%4Bey``,
``%61piKey``, ``APIKEY``, ``api+key``, ``api%20key`` and ``api_key`` are all
``apikey``. ``&``, ``;`` and a second ``?`` all separate parameters, and a
key-like parameter's value is cut up to the next ``&``: whichever separator
the reader uses, no part of the value is left. Every occurrence of a repeated
parameter is redacted; so is any value that is itself an API key or a
webhook secret, whatever its name.
"""
from __future__ import annotations

import json
import re
import unicodedata
from datetime import UTC, datetime
from urllib.parse import unquote

from daphne.access import AccessLogGenerator

REDACTED = "[redacted]"
# Parameter names (as normalised by ``_normalised``) whose values are secrets.
SECRET_NAMES = frozenset({
    "apikey", "key", "token", "accesstoken", "authtoken", "idtoken", "refreshtoken",
    "secret", "clientsecret", "password", "passwd", "pwd", "auth", "authorization",
    "signature", "sig", "sessionid", "credential", "credentials",
})
# ... and names that end like one of these (x_api_key, client_secret, previewTicket, ...).
SECRET_SUFFIXES = ("apikey", "token", "secret", "password", "ticket")
# Values that are secrets whatever they are called: API keys, webhook secrets.
SECRET_VALUE_PREFIXES = ("pk_live_", "pk_test_", "whsec_")
_SECRET_VALUE_STARTS = tuple(prefix.replace("_", "") for prefix in SECRET_VALUE_PREFIXES)
# Percent-decoding passes: enough for any encoding a client stacks in practice.
DECODE_PASSES = 4

# The query of a request line: from "?" (or an encoded one) to the end of the URI.
_QUERY = re.compile(r"(\?|%3[fF])([^\s\"]*)")
# Within an "&"-separated part, what else a reader may take for a separator.
_PIECE_SEPARATORS = re.compile(r"([;?])")


def _decoded(text: str) -> str:
    for _ in range(DECODE_PASSES):
        decoded = unquote(text.replace("+", " "), errors="replace")
        if decoded == text:
            break
        text = decoded
    return text


def _normalised(name: str) -> str:
    name = unicodedata.normalize("NFKC", _decoded(name)).casefold()
    return "".join(ch for ch in name if ch.isalnum())


def is_secret_name(name: str) -> bool:
    """Whether a query parameter of this name (as sent) carries a secret."""
    normal = _normalised(name)
    return normal in SECRET_NAMES or normal.endswith(SECRET_SUFFIXES)


def _is_secret_value(value: str) -> bool:
    return _normalised(value).startswith(_SECRET_VALUE_STARTS)


def _redact_query(query: str) -> str:
    return "&".join(_redact_part(part) for part in query.split("&"))


def _redact_part(part: str) -> str:
    """One ``&``-separated part, whose ``;``- or ``?``-separated pieces may
    each be a parameter: from the first key-like one on, its value runs to
    the next ``&``."""
    pieces = _PIECE_SEPARATORS.split(part)  # piece, separator, piece, ...
    for index in range(0, len(pieces), 2):
        name, equals, value = pieces[index].partition("=")
        if equals and (is_secret_name(name) or _is_secret_value(value)):
            return "".join(pieces[:index]) + f"{name}={REDACTED}"
        if not equals and "=" in _decoded(name):
            # "apiKey%3Dvalue": no parameter value as sent, but a secret all the same.
            inner_name, _, inner_value = _decoded(name).partition("=")
            if is_secret_name(inner_name) or _is_secret_value(inner_value):
                return "".join(pieces[:index]) + REDACTED
    return part


def redact(text: str) -> str:
    """``text`` (a request line or path) with every key-like query value replaced."""
    return _QUERY.sub(lambda match: match.group(1) + _redact_query(match.group(2)), text)


class RedactingAccessLogGenerator(AccessLogGenerator):
    def __call__(self, protocol, action, details):
        if isinstance(details, dict) and isinstance(details.get("path"), str):
            details = {**details, "path": redact(details["path"])}
        return super().__call__(protocol, action, details)

    def write_entry(self, host, date, request, *args, **kwargs):
        # Whatever daphne adds to a line later, the request part is cleaned too.
        return super().write_entry(host, date, redact(request), *args, **kwargs)


class JsonAccessLogGenerator(RedactingAccessLogGenerator):
    """The same lines, redacted, as one JSON object each
    (``OWLLAYER_LOG_FORMAT=json``): the fields of the site's JSON log lines
    (runtime.logs) and the request's."""

    def write_entry(self, host, date, request, status=None, length=None, *args, **kwargs):
        line = {
            "time": datetime.now(UTC).isoformat(timespec="milliseconds"),
            "level": "INFO",
            "logger": "daphne.access",
            "message": redact(request),
            "client": host,
            "status": status,
            "size": length,
        }
        self.stream.write(json.dumps(line, ensure_ascii=False, default=str) + "\n")


def install(*, json_lines: bool = False) -> None:
    """Make daphne's command line write its access log through the redactor
    (as JSON lines with ``json_lines``)."""
    import daphne.cli

    daphne.cli.AccessLogGenerator = JsonAccessLogGenerator if json_lines else RedactingAccessLogGenerator
