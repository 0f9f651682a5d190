"""The demo store's Django views: which key the page gets, and its assets.
(No browser: these run everywhere.)"""
from __future__ import annotations

import json
import re

import pytest

import demo.views


@pytest.fixture
def no_demo_key_file(tmp_path, monkeypatch):
    monkeypatch.setattr(demo.views, "DEMO_KEY_FILE", tmp_path / ".demo-key")
    return tmp_path / ".demo-key"


def page_config(response) -> dict:
    match = re.search(
        r'<script id="owl-demo-config" type="application/json">(.*?)</script>',
        response.content.decode(),
    )
    assert match, "the page carries no config"
    return json.loads(match.group(1))


def test_the_root_redirects_to_the_store_and_keeps_the_key(client):
    response = client.get("/?apiKey=pk_live_abc")
    assert response.status_code == 302
    assert response["Location"] == "/demo/?apiKey=pk_live_abc"


def test_a_key_in_the_url_goes_to_the_page_before_the_demo_key_file(client, no_demo_key_file):
    no_demo_key_file.write_text("pk_live_from_file\n")
    response = client.get("/demo/?apiKey=pk_live_from_url")
    assert response.status_code == 200
    config = page_config(response)
    assert config["apiKey"] == "pk_live_from_url"
    assert config["wsPath"] == "/owllayer"
    assert config["route"] == "product"


def test_without_a_url_key_the_page_uses_the_demo_key_file(client, no_demo_key_file):
    no_demo_key_file.write_text("pk_live_from_file\n")
    response = client.get("/demo/cart/")
    config = page_config(response)
    assert config["apiKey"] == "pk_live_from_file"
    assert config["route"] == "cart"
    assert b"<title>Your cart - Owl Store</title>" in response.content


def test_without_any_key_the_page_says_how_to_run_the_server(client, no_demo_key_file):
    response = client.get("/demo/")
    assert response.status_code == 200
    assert page_config(response)["apiKey"] == ""
    assert b'id="owl-no-key"' in response.content
    assert b"make run" in response.content


def test_a_hostile_key_in_the_url_cannot_break_out_of_the_config_script(client, no_demo_key_file):
    response = client.get("/demo/", {"apiKey": "</script><script>alert(1)</script>"})
    assert b"<script>alert(1)" not in response.content
    assert page_config(response)["apiKey"] == "</script><script>alert(1)</script>"


def test_the_client_script_is_served_without_static_file_handling(client):
    response = client.get("/demo/assets/owllayer-client.js")
    assert response.status_code == 200
    body = b"".join(response.streaming_content)
    assert b'var SDK_VERSION = "0.4.0"' in body


def test_only_the_pages_own_assets_are_served(client):
    assert client.get("/demo/assets/demo.css").status_code == 200
    assert client.get("/demo/assets/views.py").status_code == 404
    assert client.get("/demo/assets/../views.py").status_code == 404
    assert client.get("/demo/assets/%2e%2e%2fviews.py").status_code == 404
