"""The widget's files as the server serves them under /widget/<release>/, with
the Subresource Integrity hash of each, and the snippet a tenant pastes.

Each release's files are the bytes its manifest entry recorded
(widget/releases.py): the current release's are read from static/owllayer/
(the browser client is the same file the demo store imports), a past
release's from its frozen copies. A file whose bytes are not the recorded
ones is not served (and said once in the log): a page that pinned a release
by its hash gets that release or nothing.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlencode

from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import escape

from aitp import preview as aitp_preview
from runtime.config import config
from widget import releases

logger = logging.getLogger(__name__)

ENTRY = "owllayer-widget.js"
JS = "text/javascript; charset=utf-8"
TYPES = "application/typescript; charset=utf-8"
# The endpoint the widget assumes when the snippet names none.
DEFAULT_WS_PATH = "/owllayer"


@dataclass(frozen=True)
class Asset:
    body: bytes
    content_type: str
    integrity: str  # "sha384-<base64>", as a script tag's integrity attribute takes it

    @property
    def etag(self) -> str:
        return '"' + self.integrity.removeprefix("sha384-") + '"'


def source(name: str) -> Path:
    return releases.SOURCES / name


def manifest() -> releases.Manifest:
    """The served releases, read and parsed again only when the manifest file changed."""
    body, digest = _read(releases.RELEASES / releases.MANIFEST_NAME)
    if digest not in _parsed:
        _parsed.clear()
        _parsed[digest] = releases.manifest_of(body)
    return _parsed[digest]


# The manifest as last parsed, under the hash of the bytes it was parsed from.
_parsed: dict[str, releases.Manifest] = {}


# path -> (the file's modification time and size when read, its bytes, their hash)
_kept: dict[Path, tuple[tuple[int, int], bytes, str]] = {}
# (path, hash) of files refused for bytes the manifest did not record, said once each
_refused: set[tuple[Path, str]] = set()


def _read(path: Path) -> tuple[bytes, str]:
    """The file's bytes and their hash, read again only when the file changed."""
    status = path.stat()
    stamp = (status.st_mtime_ns, status.st_size)
    kept = _kept.get(path)
    if kept is None or kept[0] != stamp:
        body = path.read_bytes()
        kept = _kept[path] = (stamp, body, releases.integrity_of(body))
    return kept[1], kept[2]


def asset(name: str, release: str | None = None) -> Asset | None:
    """A file of a release (the current one by default) as served, or None
    for a name or release that is not served, or bytes the manifest did not
    record."""
    served = manifest()
    release = release or served.current
    recorded = served.releases.get(release, {}).get(name)
    if recorded is None:
        return None
    current = release == served.current
    path = source(name) if current else releases.RELEASES / release / name
    try:
        body, integrity = _read(path)
    except FileNotFoundError:
        integrity, body = "missing", b""
    if integrity != recorded:
        if (path, integrity) not in _refused:
            _refused.add((path, integrity))
            logger.error("widget %s: not serving %s: its bytes are not the ones release %s recorded; %s",
                         release, path, release,
                         releases.CHANGED if current else "restore the release's frozen copy from git")
        return None
    return Asset(body=body, content_type=TYPES if name.endswith(".d.ts") else JS, integrity=integrity)


def embed_snippet(request: HttpRequest, raw_key: str, *, visitor_token: str = "") -> str:
    """The one tag a tenant pastes: the widget of the current release from
    this server, its integrity hash and the publishable key (and the socket's
    address when it is not where the widget looks by default). A page that
    vouches for its visitor adds the token its backend signed."""
    served = manifest()
    integrity = served.releases[served.current][ENTRY]
    src = request.build_absolute_uri(reverse("widget:asset", args=[served.current, ENTRY]))
    attributes = [f'type="module" src="{escape(src)}"',
                  f'integrity="{integrity}" crossorigin="anonymous"',
                  f'data-api-key="{escape(raw_key)}"']
    ws_path = config().protocol.ws_path
    if ws_path != DEFAULT_WS_PATH:
        attributes.append(f'data-endpoint="{escape(socket_address(request))}"')
    if visitor_token:
        attributes.append(f'data-visitor-token="{escape(visitor_token)}"')
    return "<script " + "\n        ".join(attributes) + "></script>\n"


def socket_address(request: HttpRequest) -> str:
    """This server's AITP WebSocket, as the browser asking reaches it."""
    scheme = "wss" if request.is_secure() else "ws"
    return f"{scheme}://{request.get_host()}{config().protocol.ws_path}"


@dataclass(frozen=True)
class Preview:
    """What a console page needs to start the real widget with a key: the
    current release's module, the key and the socket's address with a
    preview ticket for this page's origin (aitp.preview)."""

    module: str
    api_key: str
    endpoint: str


def preview(request: HttpRequest, raw_key: str, *, key_id: int, user_id: int) -> Preview:
    origin = request.build_absolute_uri("/").rstrip("/")
    ticket = aitp_preview.issue(key_id=key_id, origin=origin, user_id=user_id)
    endpoint = f"{socket_address(request)}?{urlencode({'previewTicket': ticket})}"
    return Preview(module=reverse("widget:asset", args=[manifest().current, ENTRY]), api_key=raw_key,
                   endpoint=endpoint)
