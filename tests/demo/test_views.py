"""The demo store's Django views: which key a page gets, what each page tells
the agent, and the cart API the page's tools call. (No browser.)"""
from __future__ import annotations

import json
import re

import pytest
from django.test import Client

import demo.views

pytestmark = pytest.mark.django_db


@pytest.fixture
def no_demo_key_file(tmp_path, monkeypatch):
    monkeypatch.setattr(demo.views, "DEMO_KEY_FILE", tmp_path / ".demo-key")
    return tmp_path / ".demo-key"


def json_script(response, element_id: str) -> dict:
    match = re.search(
        rf'<script id="{element_id}" type="application/json">(.*?)</script>',
        response.content.decode(),
    )
    assert match, f"the page carries no {element_id}"
    return json.loads(match.group(1))


def page_config(response) -> dict:
    return json_script(response, "owl-demo-config")


def page_data(response) -> dict:
    return json_script(response, "owl-page")


def cart_post(client: Client, action: str, body: object, **extra):
    return client.post(f"/demo/api/cart/{action}", json.dumps(body),
                       content_type="application/json", **extra)


def test_the_root_redirects_to_the_store_and_keeps_the_key(client):
    response = client.get("/?apiKey=pk_live_abc")
    assert response.status_code == 302
    assert response["Location"] == "/demo/?apiKey=pk_live_abc"


def test_a_key_in_the_url_goes_to_the_page_before_the_demo_key_file(client, no_demo_key_file):
    no_demo_key_file.write_text("pk_live_from_file\n")
    config = page_config(client.get("/demo/?apiKey=pk_live_from_url"))
    assert config["apiKey"] == "pk_live_from_url"


def test_a_key_from_the_url_is_kept_for_the_visitors_next_pages(client, no_demo_key_file):
    no_demo_key_file.write_text("pk_live_from_file\n")
    client.get("/demo/?apiKey=pk_live_from_url")
    assert page_config(client.get("/demo/cart/"))["apiKey"] == "pk_live_from_url"


def test_without_a_url_key_the_page_uses_the_demo_key_file(client, no_demo_key_file):
    no_demo_key_file.write_text("pk_live_from_file\n")
    response = client.get("/demo/cart/")
    assert page_config(response)["apiKey"] == "pk_live_from_file"
    assert b"<title>Your cart - Owl Store</title>" in response.content


def test_the_page_knows_when_its_key_is_the_demo_key_make_run_can_replace(client, no_demo_key_file):
    no_demo_key_file.write_text("pk_live_from_file\n")
    assert page_config(client.get("/demo/"))["demoKey"] is True
    assert page_config(client.get("/demo/?apiKey=pk_live_from_url"))["demoKey"] is False
    assert page_config(Client().get("/demo/?apiKey=pk_live_from_file"))["demoKey"] is True


def test_without_any_key_the_page_is_not_told_it_has_the_demo_key(client, no_demo_key_file):
    assert page_config(client.get("/demo/"))["demoKey"] is False


def test_without_any_key_the_page_says_how_to_run_the_server(client, no_demo_key_file):
    response = client.get("/demo/")
    assert response.status_code == 200
    assert page_config(response)["apiKey"] == ""
    assert b'id="owl-no-key"' in response.content
    assert b"make run" in response.content
    assert b"owllayer-widget.js" not in response.content


def widget_tags(response) -> list[str]:
    return re.findall(r'<script type="module" src="[^"]*/owllayer-widget\.js".*?></script>', response.content.decode(),
                      re.DOTALL)


def test_every_page_carries_the_widget_snippet_a_tenant_pastes_with_the_pages_key(client, no_demo_key_file):
    from widget.assets import manifest

    served = manifest()
    for path in ("/demo/?apiKey=pk_live_from_url", "/demo/products/travel-speaker/", "/demo/cart/"):
        [tag] = widget_tags(client.get(path))
        assert f'src="http://testserver/widget/{served.current}/owllayer-widget.js"' in tag, path
        assert f'integrity="{served.releases[served.current]["owllayer-widget.js"]}"' in tag
        assert 'data-api-key="pk_live_from_url"' in tag
        # The store's own script comes after it, so window.OwlLayer is ready there.
        page = client.get(path).content.decode()
        assert page.index("owllayer-widget.js") < page.index("demo/store.js")


def test_a_page_with_a_working_key_vouches_for_its_visitor_in_the_snippet(client):
    from aitp import tenancy

    tenant = tenancy.tenant_create(slug="shop", name="Shop")
    _, raw_key = tenancy.key_create(tenant=tenant, name="web", allowed_origins=["http://testserver"])
    [tag] = widget_tags(client.get("/demo/", {"apiKey": raw_key}))
    assert re.search(r'data-visitor-token="[\w.-]+"', tag)


def test_a_hostile_key_in_the_url_is_escaped_in_the_snippet(client, no_demo_key_file):
    response = client.get("/demo/", {"apiKey": '"><script>alert(1)</script>'})
    [tag] = widget_tags(response)
    assert 'data-api-key="&quot;&gt;&lt;script&gt;alert(1)&lt;/script&gt;"' in tag


def test_a_hostile_key_in_the_url_cannot_break_out_of_the_config_script(client, no_demo_key_file):
    response = client.get("/demo/", {"apiKey": "</script><script>alert(1)</script>"})
    assert b"<script>alert(1)" not in response.content
    assert page_config(response)["apiKey"] == "</script><script>alert(1)</script>"


def test_the_catalogue_lists_every_product_and_offers_navigation_tools(client):
    data = page_data(client.get("/demo/"))
    assert data["kind"] == "catalog"
    assert data["tools"] == ["open_product", "open_cart"]
    assert [p["productId"] for p in data["context"]["products"]] == [
        "pro-headphones", "travel-speaker", "charging-dock"]
    assert data["context"]["products"][0]["price"] == 149.99


def test_a_product_page_describes_its_product_and_offers_add_to_cart(client):
    response = client.get("/demo/products/travel-speaker/")
    assert b"<title>Travel Speaker - Owl Store</title>" in response.content
    data = page_data(response)
    assert data["tools"] == ["add_to_cart", "open_product", "open_cart"]
    assert data["context"]["productId"] == "travel-speaker"
    assert data["context"]["price"] == 89.0
    assert data["context"]["inCart"] == 0


def test_an_unknown_product_page_is_a_404(client):
    assert client.get("/demo/products/banana/").status_code == 404


def test_the_cart_page_shows_lines_coupon_and_total_and_offers_payment(client):
    cart_post(client, "add", {"productId": "pro-headphones", "quantity": 2})
    cart_post(client, "coupon", {"code": "OWL10"})

    response = client.get("/demo/cart/")

    data = page_data(response)
    assert data["tools"] == ["set_quantity", "apply_coupon", "process_payment", "open_product"]
    assert data["context"]["total"] == 269.98
    assert data["context"]["coupon"]["code"] == "OWL10"
    assert b'id="cart-total">$269.98<' in response.content
    assert b'id="cart-count" class="badge">2<' in response.content


def test_the_cart_api_answers_with_the_new_cart(client):
    response = cart_post(client, "add", {"productId": "travel-speaker", "quantity": 3})
    assert response.status_code == 200
    body = response.json()
    assert body["added"] is True
    assert body["cart"]["total"] == 267.0


def test_the_cart_api_refuses_bad_requests_with_a_sentence(client):
    cases = [
        ("add", {"productId": "banana", "quantity": 1}, "no product"),
        ("add", {"productId": "pro-headphones", "quantity": 0}, "quantity"),
        ("coupon", {"code": "FREE"}, "no coupon"),
        ("pay", {"amount": 1}, "nothing to pay"),
        ("add", [1, 2], "JSON object"),
    ]
    for action, body, fragment in cases:
        response = cart_post(client, action, body)
        assert response.status_code == 400, (action, body)
        assert fragment in response.json()["error"], (action, body)
    assert client.post("/demo/api/cart/add", b"{nope", content_type="application/json").json() == {
        "error": "The request is not valid JSON."}
    assert client.post("/demo/api/cart/add", b"x" * 5000, content_type="application/json").status_code == 400
    assert cart_post(client, "steal", {}).status_code == 404
    assert client.get("/demo/api/cart/add").status_code == 405


def test_paying_the_total_empties_the_cart_and_the_cart_page_confirms_the_order(client):
    cart_post(client, "add", {"productId": "pro-headphones", "quantity": 2})

    paid = cart_post(client, "pay", {"amount": 299.98}).json()

    assert paid["paid"] is True and paid["amount"] == 299.98
    response = client.get("/demo/cart/")
    assert page_data(response)["context"]["lastOrder"]["orderId"] == paid["orderId"]
    assert page_data(response)["context"]["items"] == []
    assert f"Order {paid['orderId']} is paid ($299.98)".encode() in response.content


def test_paying_a_wrong_amount_charges_nothing(client):
    cart_post(client, "add", {"productId": "pro-headphones", "quantity": 2})
    response = cart_post(client, "pay", {"amount": 149.99})
    assert response.status_code == 400
    assert "does not match the cart total $299.98" in response.json()["error"]
    assert page_data(client.get("/demo/cart/"))["context"]["total"] == 299.98


def test_the_cart_api_needs_the_pages_csrf_token():
    browser = Client(enforce_csrf_checks=True)
    page = browser.get("/demo/")
    token = re.search(rb'name="csrfmiddlewaretoken" value="([^"]+)"', page.content).group(1).decode()
    body = {"productId": "pro-headphones", "quantity": 1}

    assert cart_post(browser, "add", body).status_code == 403
    assert cart_post(browser, "add", body, HTTP_X_CSRFTOKEN=token).status_code == 200


def test_the_pages_script_and_the_browser_client_are_served_as_static_files(client):
    for path, fragment in [("/static/demo/store.js", b"window.OwlLayer.registerTool"),
                           ("/static/owllayer/owllayer-client.js", b"export class OwlLayerClient")]:
        response = client.get(path)
        assert response.status_code == 200, path
        assert response["Content-Type"].startswith("text/javascript")
        assert fragment in b"".join(response.streaming_content), path
