"""The widget's files as served under /widget/<release>/: headers any site can
load them with, an integrity hash that matches the bytes, the console's
snippet naming the exact release and carrying its hash, /widget/v1/ leading
to the newest 1.x release, and the size a page pays for the widget
(docs/widget.md)."""
from __future__ import annotations

import base64
import gzip
import hashlib
import re

import pytest
from django.urls import reverse

from widget import assets, releases

pytestmark = pytest.mark.django_db

# The widget plus the modules it imports, gzipped (the voice worklet loads
# only when a page opens the microphone, which the widget does not).
MAX_GZIPPED_BYTES = 40 * 1024
IMPORTED = ["owllayer-widget.js", "owllayer-client.js", "owllayer-markdown.js"]
CURRENT = releases.load().current


def url(name: str, release: str = CURRENT) -> str:
    return reverse("widget:asset", args=[release, name])


def test_the_widget_is_served_for_any_origin_as_javascript_kept_a_year(client):
    response = client.get(url("owllayer-widget.js"), HTTP_ORIGIN="https://shop.example")

    assert url("owllayer-widget.js") == f"/widget/{CURRENT}/owllayer-widget.js"
    assert response.status_code == 200
    assert response["Content-Type"] == "text/javascript; charset=utf-8"
    assert response["Access-Control-Allow-Origin"] == "*"
    assert response["Cross-Origin-Resource-Policy"] == "cross-origin"
    assert response["Cache-Control"] == "public, max-age=31536000, immutable"
    assert response.content == (assets.source("owllayer-widget.js")).read_bytes()


def test_the_modules_it_imports_and_its_types_are_served_beside_it(client):
    for name in ("owllayer-client.js", "owllayer-markdown.js", "owllayer-voice-worklet.js"):
        response = client.get(url(name))
        assert response.status_code == 200, name
        assert response["Content-Type"] == "text/javascript; charset=utf-8"
        assert response["Access-Control-Allow-Origin"] == "*"
    types = client.get(url("owllayer-widget.d.ts"))
    assert types.status_code == 200
    assert types["Content-Type"] == "application/typescript; charset=utf-8"
    assert b"registerTool(tool: ToolDefinition, handler: ToolHandler)" in types.content
    widget = assets.source("owllayer-widget.js").read_text()
    assert re.findall(r'^import .* from "\./([\w.-]+)";$', widget, flags=re.MULTILINE) == IMPORTED[1:]


def test_only_the_widgets_files_of_a_served_release_are_served_there(client):
    assert client.get(url("admin.css")).status_code == 404
    assert client.get(url("owllayer-widget.js", release="0.9.0")).status_code == 404
    assert client.get(f"/widget/{CURRENT}/../settings.py").status_code == 404
    assert client.get("/widget/latest/owllayer-widget.js").status_code == 404
    assert client.post(url("owllayer-widget.js")).status_code == 405


def test_the_integrity_hash_is_the_sha384_of_the_served_bytes_and_an_unchanged_file_answers_304(client):
    response = client.get(url("owllayer-widget.js"))
    digest = base64.b64encode(hashlib.sha384(response.content).digest()).decode()

    assert assets.asset("owllayer-widget.js").integrity == f"sha384-{digest}"
    assert releases.load().releases[CURRENT]["owllayer-widget.js"] == f"sha384-{digest}"
    assert response["ETag"] == f'"{digest}"'
    again = client.get(url("owllayer-widget.js"), HTTP_IF_NONE_MATCH=response["ETag"])
    assert again.status_code == 304
    assert again["Access-Control-Allow-Origin"] == "*"


def test_the_sources_are_the_current_releases_recorded_bytes():
    changed = releases.changed_files(releases.load())
    assert changed == [], f"{releases.CHANGED} (changed: {', '.join(changed)})"


def test_v1_leads_a_page_that_pins_no_release_to_the_newest_1x_release_for_five_minutes(client):
    response = client.get("/widget/v1/owllayer-widget.js", HTTP_ORIGIN="https://shop.example")

    assert response.status_code == 302
    assert response["Location"] == url("owllayer-widget.js")
    assert response["Cache-Control"] == "public, max-age=300"
    assert response["Access-Control-Allow-Origin"] == "*"
    assert client.get("/widget/v1/owllayer-client.js")["Location"] == url("owllayer-client.js")
    assert client.get("/widget/v1/admin.css").status_code == 404
    assert client.get("/widget/v2/owllayer-widget.js").status_code == 404


def test_the_widget_and_the_modules_it_imports_stay_under_40_kb_gzipped():
    total = sum(len(gzip.compress(assets.source(name).read_bytes(), compresslevel=9)) for name in IMPORTED)
    assert total <= MAX_GZIPPED_BYTES, f"{total} bytes gzipped"


def test_the_snippet_names_the_exact_release_its_integrity_and_the_key(rf):
    request = rf.get("/", HTTP_HOST="testserver")
    snippet = assets.embed_snippet(request, "pk_live_abc")

    integrity = releases.load().releases[CURRENT]["owllayer-widget.js"]
    assert snippet == (
        f'<script type="module" src="http://testserver/widget/{CURRENT}/owllayer-widget.js"\n'
        f'        integrity="{integrity}" crossorigin="anonymous"\n'
        '        data-api-key="pk_live_abc"></script>\n'
    )
