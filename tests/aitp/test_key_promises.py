"""What a publishable key promises its owner, each pinned by its own test.

- A key with allowed origins is used only from exactly those origins: a
  request without an Origin header, or from an origin that merely starts or
  ends like an allowed one, is refused.
- A key is recognised by its full secret, compared as a hash in constant
  time: the right lookup prefix with a wrong secret is refused.
- The concurrent-session cap admits exactly ``max_sessions`` live sessions;
  the next is refused until one closes. The tenant's own ceiling does the
  same over all its keys, with its own code (``tenant_session_limit``).
- A session counts against the cap while its process refreshes it: a row
  silent for just under three heartbeats still counts, just over no longer
  does (and the sweeper ends it).

The decisions are checked with explicit ``now`` values, so nothing sleeps.
"""
from __future__ import annotations

import secrets
from datetime import timedelta

import pytest
from django.utils import timezone

from aitp import services, store, tenancy
from aitp.models import ApiKey, Session
from aitp.store import admission, keys
from tests.aitp.conftest import ORIGIN, queries_sent
from tests.support.people import make_session

pytestmark = pytest.mark.django_db

LOOKALIKES = [
    pytest.param("https://shop.example.evil.test", id="longer-host"),
    pytest.param("https://shop.example:8443", id="other-port"),
    pytest.param("https://shop.exampl", id="cut-short"),
    pytest.param("http://shop.example", id="other-scheme"),
    pytest.param("https://shop.example/", id="trailing-slash"),
    pytest.param("https://SHOP.EXAMPLE", id="other-case"),
    pytest.param("https://x.shop.example", id="subdomain"),
    pytest.param("null", id="opaque-origin"),
]


def handshake(origin: str = ORIGIN, session_id: str | None = None) -> store.HandshakeInfo:
    return store.HandshakeInfo(
        session_id=session_id or f"ses_{secrets.token_hex(6)}", origin=origin,
        user_agent="pytest", viewport="1440x900", sdk_version="0.4.0",
        protocol_version="1.0.0", channel_name=f"test.{secrets.token_hex(4)}",
    )


def refusal_code(key, origin, now=None) -> str | None:
    refusal = services.api_key_refusal(key, origin=origin, now=now or timezone.now())
    return None if refusal is None else refusal.code


# --- origins -------------------------------------------------------------------------


def test_a_key_with_allowed_origins_accepts_exactly_each_of_them(tenant):
    key, _ = tenancy.key_create(
        tenant=tenant, allowed_origins=[ORIGIN, "https://www.shop.example"]
    )
    assert refusal_code(key, ORIGIN) is None
    assert refusal_code(key, "https://www.shop.example") is None


def test_a_key_with_allowed_origins_refuses_a_request_without_origin(tenant):
    key, _ = tenancy.key_create(tenant=tenant, allowed_origins=[ORIGIN])
    assert refusal_code(key, None) == "origin_not_allowed"
    assert refusal_code(key, "") == "origin_not_allowed"


@pytest.mark.parametrize("lookalike", LOOKALIKES)
def test_a_key_with_allowed_origins_refuses_an_origin_that_only_looks_like_one(tenant, lookalike):
    key, _ = tenancy.key_create(tenant=tenant, allowed_origins=[ORIGIN])
    assert refusal_code(key, lookalike) == "origin_not_allowed"


def test_an_origin_refusal_tells_the_page_why_in_its_own_words(tenant):
    key, _ = tenancy.key_create(tenant=tenant, allowed_origins=[ORIGIN])
    refusal = services.api_key_refusal(key, origin="https://evil.example", now=timezone.now())
    assert refusal == services.Refusal(
        "origin_not_allowed", "This page's origin is not allowed for this API key.",
        "origin not allowed",
    )


def test_a_key_without_allowed_origins_accepts_any_origin_or_none(tenant):
    key, _ = tenancy.key_create(tenant=tenant)
    for origin in (None, "", ORIGIN, "https://anywhere.example"):
        assert refusal_code(key, origin) is None, origin


def test_a_key_with_allowed_origins_opens_no_session_without_origin(tenant):
    _, raw = tenancy.key_create(tenant=tenant, allowed_origins=[ORIGIN])
    session, refusal = store.current().session_open(raw_key=raw, info=handshake(origin=""))
    assert session is None and refusal.code == "origin_not_allowed"
    assert not Session.objects.exists()


def test_a_key_with_allowed_origins_opens_no_session_from_a_prefix_lookalike(tenant):
    _, raw = tenancy.key_create(tenant=tenant, allowed_origins=[ORIGIN])
    session, refusal = store.current().session_open(raw_key=raw, info=handshake(origin=ORIGIN + ".evil.test"))
    assert session is None and refusal.code == "origin_not_allowed"
    assert not Session.objects.exists()


@pytest.mark.django_db(transaction=True)
async def test_a_key_with_allowed_origins_refuses_a_handshake_without_origin(connect, api_key):
    page = await connect(origin=None)
    error = await page.handshake(api_key.raw)
    assert error["payload"]["data"]["code"] == "origin_not_allowed"
    assert (await page.recv())["code"] == 1008


@pytest.mark.django_db(transaction=True)
async def test_a_key_with_allowed_origins_refuses_a_handshake_from_a_prefix_lookalike(connect, api_key):
    page = await connect(origin=ORIGIN + ".evil.test")
    error = await page.handshake(api_key.raw)
    assert error["payload"]["data"]["code"] == "origin_not_allowed"
    assert (await page.recv())["code"] == 1008


# --- the other refusals, in their order --------------------------------------------------


def test_an_unknown_key_is_refused_as_invalid():
    assert refusal_code(None, ORIGIN) == "invalid_api_key"


def test_a_revoked_or_disabled_key_is_refused_even_from_an_allowed_origin(tenant):
    key, _ = tenancy.key_create(tenant=tenant, allowed_origins=[ORIGIN])
    key.status = ApiKey.Status.DISABLED
    assert refusal_code(key, ORIGIN) == "api_key_disabled"
    key.status = ApiKey.Status.REVOKED
    assert refusal_code(key, ORIGIN) == "api_key_revoked"


def test_a_key_is_refused_from_the_moment_it_expires(tenant):
    now = timezone.now()
    key, _ = tenancy.key_create(tenant=tenant, expires_at=now)
    assert refusal_code(key, ORIGIN, now=now) == "api_key_expired"
    assert refusal_code(key, ORIGIN, now=now - timedelta(microseconds=1)) is None


@pytest.mark.parametrize("status", [ApiKey.Status.ACTIVE, ApiKey.Status.DISABLED])
def test_a_revoked_key_is_never_made_usable_again(tenant, status):
    from aitp.models import OperatorAction

    key, _ = tenancy.key_create(tenant=tenant, allowed_origins=[ORIGIN])
    tenancy.key_revoke(key=key)
    recorded = OperatorAction.objects.count()

    with pytest.raises(ValueError, match=r"^a revoked key cannot be re-activated$"):
        tenancy.key_update(key=key, changes={"status": status})
    tenancy.key_revoke(key=key)  # revoked again: nothing to change, nothing recorded

    key.refresh_from_db()
    assert key.status == ApiKey.Status.REVOKED
    assert OperatorAction.objects.count() == recorded


def test_a_key_change_naming_a_field_keys_do_not_have_is_refused_whole(tenant):
    key, _ = tenancy.key_create(tenant=tenant, name="web")

    with pytest.raises(ValueError, match=r"^not a key field: colour, owner$"):
        tenancy.key_update(key=key, changes={"owner": "x", "name": "shop", "colour": "red"})

    key.refresh_from_db()
    assert key.name == "web"


def test_a_keys_origins_are_kept_as_a_list_whatever_sequence_they_came_in(tenant):
    key, _ = tenancy.key_create(tenant=tenant)

    tenancy.key_update(key=key, changes={"allowed_origins": (ORIGIN,)})

    assert key.allowed_origins == [ORIGIN]
    key.refresh_from_db()
    assert key.allowed_origins == [ORIGIN]


def test_a_key_change_records_its_new_expiry_to_the_microsecond(tenant):
    from aitp.models import OperatorAction

    key, _ = tenancy.key_create(tenant=tenant)
    expiry = timezone.now().replace(microsecond=123456) + timedelta(days=30)

    tenancy.key_update(key=key, changes={"expires_at": expiry})

    action = OperatorAction.objects.filter(action="key_updated").get()
    assert action.data == {"prefix": key.prefix, "expires_at": expiry.isoformat()}


# --- the key's secret ------------------------------------------------------------------


def test_a_key_is_found_by_its_full_secret(tenant):
    key, raw = tenancy.key_create(tenant=tenant)
    assert keys.api_key_lookup(raw) == key


def test_a_wrong_key_with_the_right_prefix_is_refused(tenant):
    _, raw = tenancy.key_create(tenant=tenant)
    prefix = raw[:keys.LOOKUP_PREFIX_LENGTH]
    # Same prefix, same length, one character of the secret changed.
    wrong = raw[:-1] + ("a" if raw[-1] != "a" else "b")
    assert wrong[:keys.LOOKUP_PREFIX_LENGTH] == prefix
    assert keys.api_key_lookup(wrong) is None
    assert keys.api_key_lookup(prefix) is None
    assert keys.api_key_lookup(raw + "x") is None
    session, refusal = store.current().session_open(raw_key=wrong, info=handshake())
    assert session is None and refusal.code == "invalid_api_key"


def test_the_key_hash_is_compared_in_constant_time(tenant, monkeypatch):
    key, raw = tenancy.key_create(tenant=tenant)
    compared = []
    real = keys.hmac.compare_digest

    def spy(a, b):
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(keys.hmac, "compare_digest", spy)
    assert keys.api_key_lookup(raw) == key
    assert keys.api_key_lookup(raw[:-1] + ("a" if raw[-1] != "a" else "b")) is None
    assert len(compared) == 2
    assert all(key.key_hash in pair for pair in compared)


def test_an_unknown_prefix_is_hashed_like_a_wrong_key(tenant, monkeypatch):
    # So the time a refusal takes does not tell whether the prefix exists.
    hashed = []
    real = keys.key_hash
    monkeypatch.setattr(keys, "key_hash", lambda raw: hashed.append(raw) or real(raw))
    unknown = keys.KEY_PREFIX + "z" * 32
    assert keys.api_key_lookup(unknown) is None
    assert hashed == [unknown]


def test_the_stored_hash_is_keyed_by_the_server_secret(tenant, settings):
    key, raw = tenancy.key_create(tenant=tenant)
    assert raw not in key.key_hash
    settings.OWLLAYER_KEY_HASH_SECRET = settings.OWLLAYER_KEY_HASH_SECRET + "-rotated"
    # The same plaintext under another server secret is a different hash.
    assert keys.api_key_lookup(raw) is None


@pytest.mark.parametrize("raw", ["", "pk_live_", "pk_live_1234567", None])
def test_a_key_shorter_than_its_lookup_prefix_finds_nothing(tenant, raw):
    tenancy.key_create(tenant=tenant)
    assert keys.api_key_lookup(raw) is None


def test_an_oversized_key_is_refused_without_a_lookup(tenant, django_assert_num_queries):
    _, raw = tenancy.key_create(tenant=tenant)
    with django_assert_num_queries(0):
        assert keys.api_key_lookup(raw + "x" * 200) is None


def test_a_key_of_the_longest_accepted_length_is_still_looked_up(tenant, django_assert_num_queries):
    _, raw = tenancy.key_create(tenant=tenant)
    with django_assert_num_queries(1):
        assert keys.api_key_lookup(raw + "x" * (200 - len(raw))) is None


def test_a_key_of_exactly_the_lookup_prefix_length_is_looked_up(tenant, django_assert_num_queries):
    _, raw = tenancy.key_create(tenant=tenant)
    with django_assert_num_queries(1):
        assert keys.api_key_lookup(raw[:keys.LOOKUP_PREFIX_LENGTH]) is None


# --- the session cap ----------------------------------------------------------------------


def test_a_key_admits_exactly_max_sessions_and_refuses_the_next(tenant):
    _, raw = tenancy.key_create(tenant=tenant, max_sessions=3)
    opened = [store.current().session_open(raw_key=raw, info=handshake()) for _ in range(3)]
    assert all(session is not None and refusal is None for session, refusal in opened)
    session, refusal = store.current().session_open(raw_key=raw, info=handshake())
    assert session is None
    assert refusal == services.Refusal(
        "session_limit", "Too many concurrent sessions for this API key.", "session limit reached"
    )
    assert Session.objects.count() == 3


@pytest.mark.django_db(transaction=True)
async def test_a_page_past_its_tenants_ceiling_over_two_keys_is_refused_with_its_code_and_1008(
        connect, tenant):
    from tests.aitp.conftest import in_db

    def arrange():
        type(tenant).objects.filter(pk=tenant.pk).update(max_sessions=2)
        return [tenancy.key_create(tenant=tenant, allowed_origins=[ORIGIN], max_sessions=5)[1]
                for _ in range(2)]

    first_key, second_key = await in_db(arrange)()
    pages = []
    for raw in (first_key, second_key):
        page = await connect()
        assert (await page.handshake(raw))["type"] == "HANDSHAKE_ACK"
        pages.append(page)

    refused = await connect()
    error = await refused.handshake(first_key)

    assert error["type"] == "SYSTEM_EVENT" and error["payload"]["kind"] == "error"
    assert error["payload"]["data"] == {"code": "tenant_session_limit"}
    assert error["payload"]["message"] == "Too many concurrent sessions for this tenant."
    close = await refused.recv()
    assert (close["type"], close["code"]) == ("__close__", 1008)
    await pages[0].close()  # a slot of the tenant is free again, for either key
    again = await connect()
    assert (await again.handshake(second_key))["type"] == "HANDSHAKE_ACK"
    for page in (pages[1], again):
        await page.close()
    assert await Session.objects.filter(tenant=tenant).acount() == 3


def test_a_closed_session_frees_its_slot_for_the_next(tenant):
    _, raw = tenancy.key_create(tenant=tenant, max_sessions=1)
    first, _ = store.current().session_open(raw_key=raw, info=handshake())
    assert store.current().session_open(raw_key=raw, info=handshake())[1].code == "session_limit"
    store.current().session_close(session_id=first.id, code=1000)
    second, refusal = store.current().session_open(raw_key=raw, info=handshake())
    assert refusal is None and second is not None


def test_the_cap_counts_only_the_keys_own_sessions(tenant):
    _, raw = tenancy.key_create(tenant=tenant, max_sessions=1)
    _, other_raw = tenancy.key_create(tenant=tenant, max_sessions=1)
    assert store.current().session_open(raw_key=other_raw, info=handshake())[1] is None
    assert store.current().session_open(raw_key=raw, info=handshake())[1] is None


def test_an_opened_session_records_its_handshake_and_the_keys_use(tenant):
    key, raw = tenancy.key_create(tenant=tenant, allowed_origins=[ORIGIN])
    info = handshake(session_id="ses_recorded")
    session, refusal = store.current().session_open(raw_key=raw, info=info)
    assert refusal is None
    stored = Session.objects.get(id="ses_recorded")
    assert (stored.api_key_id, stored.tenant_id, stored.origin) == (key.pk, tenant.pk, ORIGIN)
    assert (stored.user_agent, stored.viewport, stored.sdk_version, stored.protocol_version) == (
        "pytest", "1440x900", "0.4.0", "1.0.0")
    assert stored.channel_name == info.channel_name and stored.ended_at is None
    assert stored.started_at == stored.last_seen_at
    key.refresh_from_db()
    assert key.last_used_at == stored.started_at


def test_a_key_refused_under_the_lock_opens_no_session(tenant, monkeypatch):
    # The key can change while a handshake is on its way (revoked
    # meanwhile): the row read under the lock decides.
    key, raw = tenancy.key_create(tenant=tenant)
    real = keys.api_key_lookup

    def read_before_it_was_revoked(raw_key, *, for_update=False):
        loaded = real(raw_key, for_update=for_update)
        if not for_update:
            loaded.status = ApiKey.Status.ACTIVE
        return loaded

    tenancy.key_revoke(key=key)
    monkeypatch.setattr(keys, "api_key_lookup", read_before_it_was_revoked)
    session, refusal = store.current().session_open(raw_key=raw, info=handshake())
    assert session is None and refusal.code == "api_key_revoked"
    assert not Session.objects.exists()


def test_an_origin_removed_while_a_handshake_is_on_its_way_opens_no_session(tenant, monkeypatch):
    key, raw = tenancy.key_create(tenant=tenant, allowed_origins=[ORIGIN])
    real = keys.api_key_lookup

    def read_before_the_origin_was_removed(raw_key, *, for_update=False):
        loaded = real(raw_key, for_update=for_update)
        if not for_update:
            loaded.allowed_origins = [ORIGIN]
        return loaded

    tenancy.key_update(key=key, changes={"allowed_origins": ["https://other.example"]})
    monkeypatch.setattr(keys, "api_key_lookup", read_before_the_origin_was_removed)
    session, refusal = store.current().session_open(raw_key=raw, info=handshake())
    assert session is None and refusal.code == "origin_not_allowed"
    assert not Session.objects.exists()


# --- a key read once serves the next opens for a moment ---------------------------------


def test_an_open_soon_after_another_of_the_same_key_does_not_read_the_key_again(
        tenant, monkeypatch):
    _, raw = tenancy.key_create(tenant=tenant)
    monkeypatch.setattr(keys, "KEY_READ_FRESH_FOR", 3600)
    store.current().session_open(raw_key=raw, info=handshake())
    with queries_sent() as soon_after:
        session, refusal = store.current().session_open(raw_key=raw, info=handshake())
    assert refusal is None and session is not None
    monkeypatch.setattr(keys, "KEY_READ_FRESH_FOR", 0)  # every open reads the key
    with queries_sent() as reading_again:
        store.current().session_open(raw_key=raw, info=handshake())
    assert len(reading_again) == len(soon_after) + 1


def test_a_key_revoked_elsewhere_just_after_an_open_refuses_the_next_open_at_once(tenant, monkeypatch):
    monkeypatch.setattr(keys, "KEY_READ_FRESH_FOR", 3600)
    # Another process revokes it: this one's recent read of the key is stale.
    key, raw = tenancy.key_create(tenant=tenant)
    assert store.current().session_open(raw_key=raw, info=handshake())[1] is None
    ApiKey.objects.filter(pk=key.pk).update(status=ApiKey.Status.REVOKED)
    session, refusal = store.current().session_open(raw_key=raw, info=handshake())
    assert session is None and refusal.code == "api_key_revoked"
    assert Session.objects.count() == 1


def test_a_session_opened_just_after_its_tenant_changed_its_prompt_gets_the_new_one(tenant, monkeypatch):
    monkeypatch.setattr(keys, "KEY_READ_FRESH_FOR", 3600)
    _, raw = tenancy.key_create(tenant=tenant)
    store.current().session_open(raw_key=raw, info=handshake())
    type(tenant).objects.filter(pk=tenant.pk).update(system_prompt="Answer in French.")
    session, _ = store.current().session_open(raw_key=raw, info=handshake())
    assert session.tenant.system_prompt == "Answer in French."


def test_a_wrong_secret_with_a_recently_read_prefix_is_still_refused(tenant, monkeypatch):
    monkeypatch.setattr(keys, "KEY_READ_FRESH_FOR", 3600)
    key, raw = tenancy.key_create(tenant=tenant)
    store.current().session_open(raw_key=raw, info=handshake())
    wrong = raw[:keys.LOOKUP_PREFIX_LENGTH] + "x" * (len(raw) - keys.LOOKUP_PREFIX_LENGTH)
    session, refusal = store.current().session_open(raw_key=wrong, info=handshake())
    assert session is None and refusal.code == "invalid_api_key"


# --- liveness: when a silent session stops counting ------------------------------------


HEARTBEAT = 10.0


@pytest.fixture
def heartbeat(settings):
    settings.OWLLAYER_HEARTBEAT_INTERVAL = HEARTBEAT
    return HEARTBEAT


def silent_session(tenant, now, seconds: float) -> Session:
    return make_session(tenant, last_seen_at=now - timedelta(seconds=seconds), started_at=now)


def live_ids(now) -> set[str]:
    return set(Session.objects.filter(**admission.live_sessions_filter(now)).values_list("id", flat=True))


def test_a_session_silent_for_just_under_three_heartbeats_still_counts(tenant, heartbeat):
    now = timezone.now()
    row = silent_session(tenant, now, 3 * heartbeat - 0.001)
    assert live_ids(now) == {row.id}
    assert services.sessions_close_stale(now=now) == 0


def test_a_session_silent_for_exactly_three_heartbeats_still_counts(tenant, heartbeat):
    now = timezone.now()
    row = silent_session(tenant, now, 3 * heartbeat)
    assert live_ids(now) == {row.id}
    assert services.sessions_close_stale(now=now) == 0


def test_a_session_silent_for_just_over_three_heartbeats_stops_counting(tenant, heartbeat):
    now = timezone.now()
    silent_session(tenant, now, 3 * heartbeat + 0.001)
    assert live_ids(now) == set()


def test_the_sweeper_ends_a_session_silent_for_just_over_three_heartbeats(tenant, heartbeat):
    now = timezone.now()
    row = silent_session(tenant, now, 3 * heartbeat + 0.001)
    fresh = silent_session(tenant, now, 0)
    assert services.sessions_close_stale(now=now) == 1
    row.refresh_from_db()
    fresh.refresh_from_db()
    assert (row.ended_at, row.close_code, row.state) == (now, 1006, Session.State.ENDED)
    assert row.close_reason == "server process lost"
    assert fresh.ended_at is None


def test_an_ended_session_never_counts_however_recent(tenant, heartbeat):
    now = timezone.now()
    row = silent_session(tenant, now, 0)
    Session.objects.filter(pk=row.pk).update(ended_at=now)
    assert live_ids(now) == set()


def test_the_window_follows_the_heartbeat_setting(tenant, settings):
    now = timezone.now()
    row = silent_session(tenant, now, 100)
    settings.OWLLAYER_HEARTBEAT_INTERVAL = 34.0  # window 102 s
    assert live_ids(now) == {row.id}
    settings.OWLLAYER_HEARTBEAT_INTERVAL = 33.0  # window 99 s
    assert live_ids(now) == set()


def test_a_silent_session_no_longer_holds_a_slot(tenant, heartbeat):
    key, raw = tenancy.key_create(tenant=tenant, max_sessions=1)
    # Far past the window, whatever the clock did between these lines.
    Session.objects.create(
        id="ses_silent", tenant=tenant, api_key=key,
        last_seen_at=timezone.now() - timedelta(seconds=10 * heartbeat),
    )
    session, refusal = store.current().session_open(raw_key=raw, info=handshake())
    assert refusal is None and session is not None


def test_a_recently_seen_session_still_holds_its_slot(tenant, heartbeat):
    key, raw = tenancy.key_create(tenant=tenant, max_sessions=1)
    # Well inside the window (two heartbeats of margin).
    Session.objects.create(
        id="ses_quiet", tenant=tenant, api_key=key,
        last_seen_at=timezone.now() - timedelta(seconds=heartbeat),
    )
    session, refusal = store.current().session_open(raw_key=raw, info=handshake())
    assert session is None and refusal.code == "session_limit"


def test_a_heartbeat_refreshes_only_an_open_session(tenant, heartbeat):
    now = timezone.now()
    old = now - timedelta(seconds=5 * heartbeat)
    open_row = silent_session(tenant, now, 5 * heartbeat)
    ended = silent_session(tenant, now, 5 * heartbeat)
    Session.objects.filter(pk=ended.pk).update(ended_at=old)
    services.session_heartbeat(session_id=open_row.id)
    services.session_heartbeat(session_id=ended.id)
    open_row.refresh_from_db()
    ended.refresh_from_db()
    assert open_row.last_seen_at > old
    assert ended.last_seen_at == old


def test_a_closed_session_records_how_it_ended(tenant):
    _, raw = tenancy.key_create(tenant=tenant)
    session, _ = store.current().session_open(raw_key=raw, info=handshake())
    store.current().session_close(session_id=session.id, code=4001, reason="r" * 300)
    session.refresh_from_db()
    assert session.close_code == 4001 and session.close_reason == "r" * 200
    assert session.state == Session.State.ENDED and session.ended_at == session.last_seen_at
    # Closing again changes nothing.
    first_end = session.ended_at
    store.current().session_close(session_id=session.id, code=1000)
    session.refresh_from_db()
    assert (session.close_code, session.ended_at) == (4001, first_end)



def test_the_sweeper_never_rewrites_how_an_ended_session_ended(tenant, heartbeat):
    now = timezone.now()
    row = silent_session(tenant, now, 10 * heartbeat)
    ended_at = now - timedelta(seconds=9 * heartbeat)
    Session.objects.filter(pk=row.pk).update(
        ended_at=ended_at, close_code=1000, close_reason="page left", state=Session.State.ENDED)
    assert services.sessions_close_stale(now=now) == 0
    row.refresh_from_db()
    assert (row.ended_at, row.close_code, row.close_reason) == (ended_at, 1000, "page left")


@pytest.mark.parametrize("status,expires,refusal", [
    (ApiKey.Status.REVOKED, None, services.Refusal(
        "api_key_revoked", "This API key has been revoked.", "api key revoked")),
    (ApiKey.Status.DISABLED, None, services.Refusal(
        "api_key_disabled", "This API key is disabled.", "api key disabled")),
    (ApiKey.Status.ACTIVE, timedelta(seconds=-1), services.Refusal(
        "api_key_expired", "This API key has expired.", "api key expired")),
])
def test_each_refusal_tells_the_page_why_in_its_own_words(tenant, status, expires, refusal):
    now = timezone.now()
    key, _ = tenancy.key_create(tenant=tenant)
    key.status = status
    key.expires_at = None if expires is None else now + expires
    assert services.api_key_refusal(key, origin=ORIGIN, now=now) == refusal


def test_an_unknown_key_is_refused_in_its_own_words():
    assert services.api_key_refusal(None, origin=ORIGIN, now=timezone.now()) == services.Refusal(
        "invalid_api_key", "The API key is not valid.", "invalid api key")


def test_a_key_that_expires_later_opens_a_session(tenant):
    _, raw = tenancy.key_create(tenant=tenant, expires_at=timezone.now() + timedelta(days=1))
    session, refusal = store.current().session_open(raw_key=raw, info=handshake())
    assert refusal is None and session is not None


def test_an_opened_session_keeps_long_handshake_fields_to_their_column_size(tenant):
    _, raw = tenancy.key_create(tenant=tenant)
    info = store.HandshakeInfo(
        session_id="ses_long", origin="o" * 600, user_agent="u" * 600, viewport="v" * 60,
        sdk_version="s" * 60, protocol_version="p" * 60, channel_name="test.long",
        process="proc-long")
    session, refusal = store.current().session_open(raw_key=raw, info=info)
    assert refusal is None
    stored = Session.objects.get(id="ses_long")
    assert (stored.origin, stored.user_agent) == ("o" * 500, "u" * 500)
    assert (stored.viewport, stored.sdk_version, stored.protocol_version) == (
        "v" * 40, "s" * 40, "p" * 40)
    assert stored.process == "proc-long"
    assert stored.last_activity_at == stored.started_at


def test_each_opened_session_is_counted_once_in_the_days_usage(tenant):
    from aitp.models import DailyUsage

    _, raw = tenancy.key_create(tenant=tenant)
    for _ in range(2):
        assert store.current().session_open(raw_key=raw, info=handshake())[1] is None
    assert store.current().session_open(raw_key="pk_live_" + "z" * 32, info=handshake())[0] is None
    [usage] = DailyUsage.objects.filter(tenant=tenant)
    assert usage.sessions == 2 and usage.date == timezone.localdate()


def test_a_key_one_character_over_the_longest_is_refused_without_a_lookup(
        tenant, django_assert_num_queries):
    _, raw = tenancy.key_create(tenant=tenant)
    with django_assert_num_queries(0):
        assert keys.api_key_lookup(raw + "x" * (201 - len(raw))) is None


def test_a_tenant_whose_token_quota_is_used_up_opens_no_session(tenant):
    from aitp.models import DailyUsage

    tenant.monthly_token_quota = 100
    tenant.save(update_fields=["monthly_token_quota"])
    DailyUsage.objects.create(tenant=tenant, date=timezone.localdate(), input_tokens=100)
    _, raw = tenancy.key_create(tenant=tenant)
    session, refusal = store.current().session_open(raw_key=raw, info=handshake())
    assert session is None and not Session.objects.exists()
    assert refusal == services.Refusal(
        "usage_limit_exceeded", "API key usage limit exceeded.", "usage limit exceeded")


def test_a_keys_last_use_is_rewritten_only_once_it_is_older_than_a_minute(tenant):
    key, raw = tenancy.key_create(tenant=tenant)
    recent = timezone.now() - timedelta(seconds=50)
    ApiKey.objects.filter(pk=key.pk).update(last_used_at=recent)
    store.current().session_open(raw_key=raw, info=handshake())
    key.refresh_from_db()
    assert key.last_used_at == recent

    ApiKey.objects.filter(pk=key.pk).update(last_used_at=recent - timedelta(seconds=20))
    opened, _ = store.current().session_open(raw_key=raw, info=handshake())
    key.refresh_from_db()
    assert key.last_used_at == Session.objects.get(id=opened.id).started_at
