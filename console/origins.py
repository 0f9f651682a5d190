"""Allowed origins of a key, as a browser writes them in its Origin header.

A session's open (``aitp.store.admission``) compares the Origin header with the key's list by exact string
equality, so an entry is only useful in the form browsers send: lower-case
scheme and host, no default port, no path (RFC 6454 section 6.1). Entries are
normalised to that form here; anything that cannot be an origin is refused.
"""
from __future__ import annotations

from urllib.parse import urlsplit

DEFAULT_PORTS = {"http": 80, "https": 443}
MAX_ORIGINS = 50


class InvalidOrigin(ValueError):
    pass


def normalize_origin(value: str) -> str:
    """``HTTPS://Shop.Example:443/`` -> ``https://shop.example``; raises InvalidOrigin."""
    text = value.strip()
    if not text:
        raise InvalidOrigin("empty origin")
    if any(ch.isspace() for ch in text):
        raise InvalidOrigin("an origin has no spaces")
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        raise InvalidOrigin("not a valid origin") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise InvalidOrigin("scheme must be http or https")
    if not parts.hostname:
        raise InvalidOrigin("missing host")
    if parts.username is not None or parts.password is not None:
        raise InvalidOrigin("an origin has no user name or password")
    # A lone trailing slash is a common paste from the address bar; any other
    # path, query or fragment means this is a page URL, not an origin.
    if parts.path not in ("", "/") or parts.query or parts.fragment or text.endswith(("?", "#")):
        raise InvalidOrigin("an origin has no path, query or fragment")
    host = parts.hostname  # already lower-cased by urlsplit
    if "*" in host:
        raise InvalidOrigin("wildcards are not supported; list each origin")
    if ":" in host:
        host = f"[{host}]"  # IPv6 literal
    else:
        try:
            # Browsers send internationalised host names in their ASCII form.
            host = host.encode("idna").decode("ascii")
        except UnicodeError:
            raise InvalidOrigin("not a valid host name") from None
    origin = f"{scheme}://{host}"
    if port is not None and port != DEFAULT_PORTS[scheme]:
        origin += f":{port}"
    return origin


def parse_origin_lines(text: str) -> tuple[list[str], list[str]]:
    """One origin per line -> (normalised origins without duplicates, errors)."""
    origins: list[str] = []
    errors: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            origin = normalize_origin(line)
        except InvalidOrigin as exc:
            errors.append(f"line {number}: {line.strip()[:100]!r}: {exc}")
            continue
        if origin not in origins:
            origins.append(origin)
    if len(origins) > MAX_ORIGINS:
        errors.append(f"at most {MAX_ORIGINS} origins per key")
    return origins, errors
