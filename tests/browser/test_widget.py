"""The drop-in widget end to end: a plain page on another origin holds only
the console's snippet and one script of its own that registers its tools
through window.OwlLayer; a real daphne process serves the widget (the
snippet's exact release, or /widget/v1/ for a page that pins none) and the
socket, and the fake Messages API plays the model (docs/widget.md)."""
from __future__ import annotations

import json
import re
import time

import jwt
import pytest
from asgiref.sync import sync_to_async
from playwright.async_api import Page, expect

from aitp.models import ApiKey, Session
from tests.browser.conftest import ack, eventually, frame
from tests.browser.store_support import result_data, tool_results
from tests.browser.widget_support import (  # noqa: F401 (host_site: a fixture)
    agent_messages,
    ask,
    host_site,
    no_serious_violations,
    open_widget,
    publish,
)
from tests.support.fake_anthropic import text_response, tool_use_response
from widget import releases
from widget.services import key_set_appearance

pytestmark = [pytest.mark.browser, pytest.mark.django_db(transaction=True)]

CURRENT = releases.load().current


async def test_the_snippet_alone_gives_a_launcher_streamed_answers_page_tools_approvals_and_a_kept_conversation(
        llm_store, model, host_site, page, shot):
    await sync_to_async(publish)(host_site, llm_store, allowed_origins=[host_site.origin])
    model.enqueue(
        text_response("Hello! **How** can I help?", chunks=4),
        tool_use_response([("look_up_order", {"orderId": "A-17"})]),
        text_response("Your order A-17 has shipped."),
        tool_use_response([("pay", {"amount": 249.99})], text="Paying now."),
        text_response("I did not pay."),
        tool_use_response([("pay", {"amount": 249.99})]),
        text_response("Paid 249.99."),
    )

    await open_widget(page, host_site)
    assert await page.evaluate("window.seen.ready") == 1
    await shot("open")
    await no_serious_violations(page)

    # A streamed answer, drawn as Markdown (bold as <strong>, never as HTML).
    await ask(page, "Hi there")
    await expect(agent_messages(page).last).to_have_text("Hello! How can I help?")
    await expect(agent_messages(page).last.locator("strong")).to_have_text("How")

    # The model calls the page's tool; the handler runs in the page; its result goes back.
    await ask(page, "Where is my order A-17?")
    await expect(agent_messages(page).last).to_have_text("Your order A-17 has shipped.")
    await expect(page.locator("#order")).to_have_text("looked up A-17")
    assert result_data(tool_results(model.requests[2])[0]) == {"orderId": "A-17", "status": "shipped"}
    # The call has a line of its own, before the answer that uses it.
    await expect(page.locator("owllayer-widget .log > *").nth(-2)).to_have_text("Done: Look up order")

    # A critical call waits for the visitor: the dialog says what, with what, and the risk.
    await ask(page, "Pay for my cart")
    dialog = page.get_by_role("dialog", name="Approve this action?")
    await expect(dialog).to_contain_text("Pay for the cart with the saved card")
    await expect(dialog.locator("dt")).to_have_text(["Amount"])
    await expect(dialog.locator("dd")).to_have_text(["249.99"])
    await expect(dialog).to_contain_text("critical")
    await no_serious_violations(page)
    await shot("approval")
    # Deny has the focus; Tab goes round the two buttons; Escape denies.
    deny, approve = dialog.get_by_role("button", name="Deny"), dialog.get_by_role("button", name="Approve")
    await expect(deny).to_be_focused()
    await page.keyboard.press("Tab")
    await expect(approve).to_be_focused()
    await page.keyboard.press("Tab")
    await expect(deny).to_be_focused()
    await page.keyboard.press("Escape")
    # The turn's words before the call and after it, the denial between them (and no line for a call not run).
    await expect(page.locator("owllayer-widget .log > *").nth(-3)).to_have_text("Paying now.")
    await expect(page.locator("owllayer-widget .log > *").nth(-2)).to_have_text("You denied: Pay")
    await expect(agent_messages(page).last).to_have_text("I did not pay.")
    await expect(page.locator("#paid")).to_have_text("not paid")
    assert tool_results(model.requests[4])[0].get("is_error") is True

    await ask(page, "Please pay, I am sure")
    await page.get_by_role("dialog", name="Approve this action?").get_by_role("button", name="Approve").click()
    await expect(agent_messages(page).last).to_have_text("Paid 249.99.")
    await expect(page.locator("#paid")).to_have_text("paid 249.99")

    # A reload keeps the conversation: the same session, its messages drawn again.
    await page.reload()
    log = page.locator("owllayer-widget .log")
    await expect(log).to_contain_text("Where is my order A-17?")
    await expect(log).to_contain_text("Your order A-17 has shipped.")
    await expect(log).to_contain_text("Paid 249.99.")
    await shot("reloaded")
    sessions = [s async for s in Session.objects.filter(api_key__name="widget")]
    assert len(sessions) == 1
    # The socket's Origin is the host page's.
    assert sessions[0].origin == host_site.origin
    roles = [m["role"] for m in await page.evaluate("window.seen.messages")]
    assert roles == []  # after the reload, nothing new was said
    assert await page.evaluate("window.seen.errors") == []


async def test_under_a_strict_csp_and_hostile_host_css_the_widget_still_looks_right_and_works(
        llm_store, model, host_site, page, shot):
    server = llm_store.server
    host_site.csp = (f"default-src 'self'; script-src 'self' {server.http_url}; "
                     f"connect-src {server.http_url} ws://127.0.0.1:{server.port}; style-src 'self'")
    await sync_to_async(publish)(host_site, llm_store, allowed_origins=[host_site.origin], hostile=True)
    model.enqueue(
        tool_use_response([("look_up_order", {"orderId": "B-2"})]),
        text_response("Order B-2 has shipped."),
    )

    await open_widget(page, host_site)
    launcher_box = await page.locator("owllayer-widget .launcher").bounding_box()
    assert launcher_box is not None
    assert (launcher_box["width"], launcher_box["height"]) == (56, 56)
    panel = page.locator("owllayer-widget .panel")
    font_size = await panel.evaluate("(node) => getComputedStyle(node).fontSize")
    assert font_size == "15px"
    await ask(page, "Where is B-2?")
    await expect(agent_messages(page).last).to_have_text("Order B-2 has shipped.")
    await expect(page.locator("#order")).to_have_text("looked up B-2", use_inner_text=False)
    await shot("strict-csp-hostile-css")
    assert await page.evaluate("window.seen.violations") == []

    # Under 600px the panel takes the whole screen.
    await page.set_viewport_size({"width": 390, "height": 800})
    await eventually(lambda: panel.bounding_box(), what="the panel's box")
    box = await panel.bounding_box()
    assert box is not None
    assert (box["x"], box["y"], box["width"], box["height"]) == (0, 0, 390, 800)
    await shot("narrow")


async def test_a_page_from_an_origin_the_key_does_not_allow_gets_no_session_and_says_so(
        llm_store, model, host_site, page):
    # This page pins no release: /widget/v1/ leads it to the current one.
    await sync_to_async(publish)(host_site, llm_store, allowed_origins=["https://shop.example"], pinned=False)
    fetched: list[str] = []
    page.on("request", lambda request: fetched.append(request.url))

    await page.goto(host_site.origin + "/")
    await page.get_by_role("button", name="Open chat").click()
    await expect(page.locator("owllayer-widget [role=alert]")).to_have_text(
        "The assistant is not set up for this site.")
    await eventually(lambda: page.evaluate("window.seen.errors.length > 0"), what="the error event")
    errors = await page.evaluate("window.seen.errors")
    assert errors[0] == {"message": "The assistant is not set up for this site.", "code": "origin_not_allowed"}
    # A listener added after the refusal hears it at once.
    late = await page.evaluate(
        "(() => { let heard = null; OwlLayer.on('error', (e) => { heard = e; }); return heard; })()")
    assert late == errors[0]
    assert not await Session.objects.filter(api_key__name="widget").aexists()
    # The widget came by way of /widget/v1/, its imports from the release it led to.
    widget_root = f"{llm_store.server.http_url}/widget/"
    raw_key = (await ApiKey.objects.aget(name="widget")).publishable
    assert [url.removeprefix(widget_root) for url in fetched if url.startswith(widget_root)] == [
        "v1/owllayer-widget.js", f"{CURRENT}/owllayer-widget.js",
        f"{CURRENT}/owllayer-client.js", f"{CURRENT}/owllayer-markdown.js", f"appearance?key={raw_key}"]
    assert json.dumps(await page.evaluate("Object.keys(window).filter((k) => /owl/i.test(k))")) == '["OwlLayer"]'


# A key set up in the console for French visitors (docs/widget.md, appearance).
FRENCH_LOOK = {
    "name": "Chouette", "greeting": "Bonjour ! Que puis-je faire pour vous ?", "accent": "#ffcc00",
    "position": "left", "language": "fr", "prompts": ["Où est ma commande ?", "Payer mon panier"],
}


def set_appearance(raw_key: str, look: dict) -> None:
    key_set_appearance(key=ApiKey.objects.get(publishable=raw_key), look=look)


async def test_a_key_with_a_french_appearance_shows_its_name_greeting_colour_corner_and_prompts_in_french(
        llm_store, model, host_site, page, shot):
    raw_key = await sync_to_async(publish)(host_site, llm_store, allowed_origins=[host_site.origin])
    await sync_to_async(set_appearance)(raw_key, FRENCH_LOOK)
    model.enqueue(
        tool_use_response([("pay", {"amount": 249.99})], text="Je paie votre panier."),
        text_response("C'est payé."),
    )

    await page.goto(host_site.origin + "/")
    widget = page.locator("owllayer-widget")
    launcher = page.get_by_role("button", name="Ouvrir la discussion")
    await expect(launcher).to_be_visible()
    # Bottom left, in the key's colour, its icon near-black (yellow is too light for white).
    box = await launcher.bounding_box()
    assert box is not None and box["x"] < 640
    colours = await launcher.evaluate("(b) => [getComputedStyle(b).backgroundColor, getComputedStyle(b).color]")
    assert colours == ["rgb(255, 204, 0)", "rgb(17, 17, 17)"]
    await launcher.click()

    await expect(widget.locator("header h2")).to_have_text("Chouette")
    await expect(widget.locator(".status")).to_have_text("En ligne")
    header = await widget.locator("header").evaluate("(h) => getComputedStyle(h).backgroundColor")
    assert header == "rgb(255, 204, 0)"
    await expect(widget.locator(".msg.greeting")).to_have_text("Bonjour ! Que puis-je faire pour vous ?")
    await expect(widget.locator(".prompt")).to_have_text(["Où est ma commande ?", "Payer mon panier"])
    await expect(widget.locator("textarea")).to_have_attribute("placeholder", "Posez une question\u2026")
    await expect(widget.get_by_role("button", name="Envoyer")).to_be_visible()
    panel = await widget.locator(".panel").bounding_box()
    assert panel is not None and panel["x"] < 640
    await no_serious_violations(page)
    await shot("french-open")

    # A prompt sends its text; the prompts go; the model's call waits for a French dialog.
    await widget.get_by_role("button", name="Payer mon panier").click()
    await expect(widget.locator(".msg.user")).to_have_text(["Payer mon panier"])
    await expect(widget.locator(".prompts")).to_be_hidden()
    dialog = page.get_by_role("dialog", name=re.compile(r"^Approuver cette action\s\?$"))
    await expect(dialog).to_contain_text("Pay for the cart with the saved card")
    await expect(dialog).to_contain_text("critique")
    await expect(dialog.locator("p").nth(1)).to_have_text(re.compile(r"^Autoriser pay\s\?$"))
    await expect(dialog.get_by_role("button")).to_have_text(["Refuser", "Approuver"])
    await shot("french-approval")
    await dialog.get_by_role("button", name="Approuver").click()

    # The words before the call, the call, the words after it: in that order.
    await expect(widget.locator(".log > :not(.greeting)")).to_have_text([
        "Payer mon panier", "Je paie votre panier.", re.compile(r"^Vous avez approuvé\s: Pay$"),
        re.compile(r"^Fait\s: Pay$"), "C'est payé."])
    await expect(page.locator("#paid")).to_have_text("paid 249.99")
    # The prompt went to the model as the visitor's words; the greeting never did.
    first_turn = json.dumps(model.requests[0]["messages"])
    assert "Payer mon panier" in first_turn
    assert "Que puis-je" not in json.dumps(model.requests)
    assert await page.evaluate("window.seen.errors") == []


@pytest.mark.parametrize("ending, words", [
    ("closed", "Cette conversation est terminée. Rechargez la page pour en commencer une autre."),
    ("error", "L\u2019assistant ne peut pas recevoir de messages pour le moment."),
])
async def test_a_french_widget_says_in_french_why_its_message_box_takes_no_more_words(
        ending, words, store, host_site, page):
    script = ScriptedSocket()
    raw_key = await sync_to_async(publish)(host_site, store, allowed_origins=[host_site.origin])
    await sync_to_async(set_appearance)(raw_key, FRENCH_LOOK)
    await page.route_web_socket(re.compile(r"/owllayer\?"), script.route)
    await page.goto(host_site.origin + "/")
    await page.get_by_role("button", name="Ouvrir la discussion").click()
    widget = page.locator("owllayer-widget")
    await expect(widget.locator(".status")).to_have_text("En ligne")

    if ending == "closed":  # an operator ended the session
        script.sockets[0].send(frame("SYSTEM_EVENT", {"kind": "disconnect", "message": "Ended."}))
        await script.sockets[0].close(code=1000, reason="ended")
    else:  # the key was refused for good
        await script.sockets[0].close(code=1008, reason="no entry")

    message_box = widget.locator("textarea")
    await expect(message_box).to_be_disabled()
    await expect(message_box).to_have_attribute("placeholder", words)
    await expect(widget.locator("form .ended")).to_have_text(words)
    await expect(widget.locator("form .ended")).to_be_visible()
    assert await page.evaluate("window.OwlLayer.send('Encore une question')") is False


class ScriptedSocket:
    """Answers the widget's sockets in place of the server (Playwright's
    WebSocket routing): the ACK, and whatever a test sends; keeps what came."""

    def __init__(self) -> None:
        self.sockets: list = []
        self.received: list[dict] = []

    def route(self, ws) -> None:
        self.sockets.append(ws)

        def answer(message) -> None:
            body = json.loads(message)
            self.received.append(body)
            if body["type"] == "HANDSHAKE_INIT":
                ws.send(ack())
        ws.on_message(answer)

    def sent(self, type_: str) -> list[dict]:
        return [m for m in self.received if m["type"] == type_]


async def open_scripted_widget(page: Page, store, site) -> ScriptedSocket:
    script = ScriptedSocket()
    await sync_to_async(publish)(site, store, allowed_origins=[site.origin])
    await page.route_web_socket(re.compile(r"/owllayer\?"), script.route)
    await open_widget(page, site)
    return script


async def test_an_approval_whose_connection_drops_goes_away_unanswered_and_its_tool_never_runs(
        store, host_site, page):
    script = await open_scripted_widget(page, store, host_site)
    script.sockets[0].send(frame("TOOL_CALL", {"callId": "tc_pay", "name": "pay", "args": {"amount": 5}}))
    dialog = page.get_by_role("dialog", name="Approve this action?")
    await expect(dialog).to_be_visible()

    await script.sockets[0].close(code=1001, reason="going away")

    await expect(dialog).to_have_count(0)
    await eventually(lambda: len(script.sockets) == 2, what="the next socket")
    await expect(page.locator("owllayer-widget .status")).to_have_text("Online")
    assert script.sent("APPROVAL_RESPONSE") == [] and script.sent("TOOL_RESULT") == []
    await expect(page.locator("#paid")).to_have_text("not paid")
    await expect(page.locator("owllayer-widget .note")).to_have_count(0)  # neither approved nor denied


async def test_a_tool_the_page_takes_away_is_no_longer_offered_and_a_late_call_of_it_fails(store, host_site, page):
    script = await open_scripted_widget(page, store, host_site)
    await eventually(lambda: script.sent("CONTEXT_UPDATE"), what="the first context update")
    offered = [tool["name"] for tool in script.sent("CONTEXT_UPDATE")[-1]["payload"]["activeTools"]]
    assert offered == ["look_up_order", "pay"]

    await page.evaluate("OwlLayer.unregisterTool('pay')")

    await eventually(lambda: [t["name"] for t in script.sent("CONTEXT_UPDATE")[-1]["payload"]["activeTools"]]
                     == ["look_up_order"], what="the context update without pay")
    script.sockets[0].send(frame("TOOL_CALL", {"callId": "tc_late", "name": "pay", "args": {"amount": 5}}))
    await eventually(lambda: script.sent("TOOL_RESULT"), what="the late call's result")
    assert script.sent("TOOL_RESULT")[0]["payload"]["error"] == "unknown tool: pay"
    await expect(page.get_by_role("dialog", name="Approve this action?")).to_have_count(0)
    await expect(page.locator("#paid")).to_have_text("not paid")


async def register_pay_with_details(page: Page, details_js: str) -> None:
    """Offer "pay_order", whose approvalDetails(args) is `details_js`."""
    await page.evaluate("""(source) => OwlLayer.registerTool({
      name: "pay_order", description: "Charge the saved card", risk: "critical",
      parameters: { type: "OBJECT", properties: { amount: { type: "NUMBER" } }, required: ["amount"] },
      approvalDetails: new Function("args", source),
    }, () => ({ paid: true }))""", details_js)


async def test_a_tool_with_its_own_approval_details_is_shown_with_them_instead_of_its_arguments(
        store, host_site, page):
    script = await open_scripted_widget(page, store, host_site)
    await register_pay_with_details(page, """
      return { summary: "Pay for your cart.", warning: "This is not your cart total ($10.00).",
               rows: [["Amount", "$" + args.amount.toFixed(2)], ["2 × Mug", "$10.00"], ["<b>x</b>", 3]] };""")

    script.sockets[0].send(frame("TOOL_CALL", {"callId": "tc_own", "name": "pay_order", "args": {"amount": 12}}))

    dialog = page.get_by_role("dialog", name="Approve this action?")
    await expect(dialog.locator("#owl-approval-what")).to_have_text("Pay for your cart.")
    await expect(dialog.locator("dt")).to_have_text(["Amount", "2 × Mug", "<b>x</b>"])  # text, never HTML
    await expect(dialog.locator("dd")).to_have_text(["$12.00", "$10.00", "3"])
    await expect(dialog.get_by_role("alert")).to_have_text("This is not your cart total ($10.00).")
    await expect(dialog).to_contain_text("critical")
    await no_serious_violations(page)
    await dialog.get_by_role("button", name="Deny").click()
    await eventually(lambda: script.sent("APPROVAL_RESPONSE"), what="the answer")
    assert script.sent("APPROVAL_RESPONSE")[0]["payload"]["approved"] is False


async def test_a_tool_whose_approval_details_fail_is_asked_about_with_its_arguments(store, host_site, page):
    script = await open_scripted_widget(page, store, host_site)
    await register_pay_with_details(page, "throw new Error('the cart is gone');")

    script.sockets[0].send(frame("TOOL_CALL", {"callId": "tc_fail", "name": "pay_order", "args": {"amount": 12}}))

    dialog = page.get_by_role("dialog", name="Approve this action?")
    await expect(dialog.locator("#owl-approval-what")).to_have_text("Charge the saved card")
    await expect(dialog.locator("dt")).to_have_text(["Amount"])
    await expect(dialog.locator("dd")).to_have_text(["12"])
    await expect(dialog.locator(".warning")).to_have_count(0)
    await dialog.get_by_role("button", name="Approve").click()
    await eventually(lambda: script.sent("APPROVAL_RESPONSE"), what="the approval with the tool's result")
    assert script.sent("APPROVAL_RESPONSE")[0]["payload"]["result"] == {"paid": True}


async def test_the_widgets_diagnostics_say_what_its_connection_saw_and_dropped(store, host_site, page):
    script = await open_scripted_widget(page, store, host_site)
    ready = await page.evaluate("new Promise((resolve) => OwlLayer.on('ready', resolve))")
    seen = await page.evaluate("OwlLayer.diagnostics()")
    assert seen["sessionId"] == ready["sessionId"] and seen["state"] == "connected"
    assert seen["dropped"] == 0 and seen["connects"] == 1

    script.sockets[0].send("{not json")

    await eventually(lambda: page.evaluate("OwlLayer.diagnostics().dropped"), what="the frame counted as dropped")
    assert (await page.evaluate("OwlLayer.diagnostics().droppedReasons"))[0]["text"] == "{not json"
    await expect(page.locator("owllayer-widget .error")).to_be_hidden()


def visitor_token(tenant_id: int, visitor: str) -> str:
    """What the tenant's backend signs for its visitor (docs/protocol.md §3c)."""
    from tenants.models import Tenant

    secret = Tenant.objects.get(pk=tenant_id).visitor_secret
    return jwt.encode({"sub": visitor, "exp": int(time.time()) + 600}, secret, algorithm="HS256")


async def test_a_visitor_the_page_vouches_for_sees_their_last_conversation_in_a_new_tab(
        llm_store, model, host_site, page):
    token = await sync_to_async(visitor_token)(llm_store.key.tenant_id, "visitor-ada")
    await sync_to_async(publish)(host_site, llm_store, allowed_origins=[host_site.origin], visitor_token=token)
    model.enqueue(text_response("Nice to meet you, Ada."), text_response("You are Ada."))
    await open_widget(page, host_site)
    await ask(page, "My name is Ada.")
    await expect(agent_messages(page).last).to_have_text("Nice to meet you, Ada.")
    await page.close()

    # A new tab: a new session, the same visitor.
    later = await page.context.new_page()
    await open_widget(later, host_site)

    log = later.locator("owllayer-widget .log > *")
    await expect(log).to_have_count(3)
    await expect(log.nth(0)).to_have_text(re.compile(
        r"^Your last conversation, .+\. The assistant remembers what you asked then\.$"))
    await expect(log.nth(1)).to_have_text("My name is Ada.")
    await expect(log.nth(2)).to_have_text("Nice to meet you, Ada.")
    await ask(later, "What is my name?")
    await expect(agent_messages(later).last).to_have_text("You are Ada.")
    assert '"My name is Ada."' in model.requests[-1]["system"][0]["text"]
    sessions = [s async for s in Session.objects.filter(api_key__name="widget").order_by("started_at")]
    assert len(sessions) == 2 and sessions[0].visitor_id == sessions[1].visitor_id != ""
