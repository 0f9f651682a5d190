"""The session store: every write a live session makes, and its open.

One interface, two implementations that keep the same promises (the
contract tests run both, on both databases):

- ``aitp.store.plain.PlainStore``: the ORM, one transaction per unit of
  work, the day's usage counted at once. What to read first.
- ``aitp.store.fast.FastStore``: the same writes as statements built once,
  several sessions' writes in one transaction (one query on PostgreSQL),
  the day's usage written behind. What the server runs.

Every method is synchronous database work: callers on the event loop run
it on the database threads (``runtime.db.db_call``), and the writes of many
connections that meet in time go together through the ``*_many`` methods
(``runtime.group_write``). Each of those returns, per write and in order, None
or the exception that write raised: one session's bad value fails only it.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import date, datetime
from typing import TYPE_CHECKING, Protocol

from aitp.models import ApiKey, Session

if TYPE_CHECKING:
    from aitp.resume import ResumeToken
    from aitp.store.admission import Refusal

# The page history keeps this many entries, the newest.
PAGE_HISTORY_LIMIT = 500


@dataclass(frozen=True)
class HandshakeInfo:
    session_id: str
    origin: str
    user_agent: str
    viewport: str
    sdk_version: str
    protocol_version: str
    channel_name: str
    # The ServerProcess holding the connection ("" when none is registered).
    process: str = ""
    # The hash of the secret of the resume token the client is given ("": none).
    resume_token_hash: str = ""
    # The key a good preview ticket names (``aitp.preview``): its allowed
    # origins are not checked for this page.
    preview_key_id: int | None = None


Outcomes = list[BaseException | None]


@dataclass(frozen=True)
class ResumeOutcome:
    """``session``: continued; ``refusal``: the key or the admission refused
    (as an open would be); neither: not resumable, open a new session;
    ``still_open``: the token is right but its socket has not closed yet."""

    session: Session | None = None
    refusal: Refusal | None = None
    still_open: bool = False


NOT_RESUMABLE = ResumeOutcome()


class SessionStore(Protocol):
    def session_open(self, *, raw_key: str, info: HandshakeInfo) -> tuple[Session | None, Refusal | None]:
        """Check the key, its tenant's quota, the key's concurrent-session cap
        and its tenant's ceiling (``admission.refusal``, under the key's and
        the tenant's row locks, this open's row counted) and open the session
        (its tenant as read under the lock); the day's ``sessions`` counted.
        Two opens racing on two processes never both take the last slot."""

    def session_resume(self, *, raw_key: str, token: ResumeToken, next_hash: str, info: HandshakeInfo,
                       window: float, held: dict | None = None) -> ResumeOutcome:
        """Continue the session ``token`` names on a new socket, its token
        replaced by ``next_hash`` (``aitp.store.resuming``: the rule, for both
        stores); ``held``: the session is still open, held by this process
        since its last socket (that socket's open and close) dropped."""

    def remembered_key_id(self, raw_key: str) -> int | None:
        """The key's id when this process has read it for an open; reads no database."""

    def session_write_live(self, *, session_id: str, snapshot: dict | None = None,
                           state: str | None = None, visits: list[dict] = (),
                           ending: dict | None = None) -> None:
        """What a live connection holds: the page snapshot (url, title,
        context, tools), the turn state, the pages visited since the last
        write (appended to the page history, its oldest dropped past
        PAGE_HISTORY_LIMIT). A closed session is left as it is; ``ending``:
        the fields that end the row, set with the rest."""

    def sessions_write_live(self, writes: list[dict]) -> Outcomes: ...

    def session_close(self, *, session_id: str, code: int | None, reason: str = "",
                      live: dict | None = None) -> None:
        """End the row if it is open (a row closes once and keeps its first
        close); ``live``: the last ``session_write_live`` it is owed."""

    def sessions_close(self, closes: list[dict]) -> Outcomes:
        """Several closes; a close whose last live values the database
        refuses still ends the row, without them."""

    def turn_checkpoint(self, *, session_id: str, tenant_id: int, turn: int, messages: list[dict],
                        calls: list[dict] = (), usage: dict | None = None,
                        finished: list[dict] = (), counted: dict | None = None,
                        figures: dict | None = None) -> None:
        """What a turn produced since its last checkpoint, all or nothing:
        final outcomes of calls (``tool_call_finish`` arguments), messages,
        the ledger rows of calls about to run, usage on the session row, and,
        at the turn's end, its record (``figures``: ``TurnRecord``'s fields
        but the session, the tokens, which are ``usage``'s, and the end, which
        is now). Outcomes, messages, calls and the record are idempotent;
        usage is added once and counted in the tenant's day, less ``counted``
        (already there)."""

    def turn_checkpoints(self, checkpoints: list[dict]) -> Outcomes: ...

    def tool_calls_record(self, *, session_id: str, turn: int, calls: list[dict]) -> None:
        """Ledger rows of calls about to run, 'pending'; a call_id recorded already is left alone."""

    def tool_call_mark(self, *, call_id: str, status: str, sent: bool = False,
                       risk: str | None = None, origin: str | None = None) -> None:
        """A call's progress: its status moves only from a state the call
        table (``aitp.calls``) leads from, never undoing a final status."""

    def tool_call_marks(self, marks: list[dict]) -> Outcomes: ...

    def tool_call_finish(self, *, call_id: str, status: str, result=None, error: str = "",
                         risk: str | None = None, origin: str | None = None,
                         created_at: datetime | None = None, sent_at: datetime | None = None,
                         now: datetime | None = None) -> None:
        """A call's one final outcome; a call already final is left alone."""

    def tool_calls_finish(self, finished: list[dict]) -> None:
        """Several outcomes in one transaction."""

    def usage_flush(self) -> int:
        """Write the day's usage counts still pending (rows written)."""

    def usage_flush_logged(self) -> int:
        """``usage_flush`` that keeps what the database refused, with a log line."""

    def usage_pending(self) -> dict[tuple[int, date], dict[str, int]]: ...


def new_session(key: ApiKey, info: HandshakeInfo, now: datetime) -> Session:
    """The row of a session about to open."""
    return Session(
        id=info.session_id,
        tenant=key.tenant,
        api_key=key,
        channel_name=info.channel_name,
        process=info.process,
        origin=info.origin[:500],
        user_agent=info.user_agent[:500],
        viewport=info.viewport[:40],
        sdk_version=info.sdk_version[:40],
        protocol_version=info.protocol_version[:40],
        resume_token_hash=info.resume_token_hash,
        started_at=now,
        last_seen_at=now,
        last_activity_at=now,
    )


def live_fields(*, now: datetime, snapshot: dict | None, state: str | None,
                ending: dict | None) -> dict:
    """The session row's fields a live write sets, by name."""
    fields: dict = {"last_activity_at": now}
    if snapshot is not None:
        fields.update(
            current_url=snapshot["url"][:2000], title=snapshot["title"][:500],
            context=snapshot["context"], tools=snapshot["tools"],
        )
    if state is not None:
        fields["state"] = state
    if ending is not None:
        fields.update(ending)
    return fields


def end_fields(*, now: datetime, code: int | None, reason: str) -> dict:
    """The fields that end a session row, by name."""
    return {"ended_at": now, "close_code": code, "close_reason": (reason or "")[:200],
            "state": Session.State.ENDED, "last_seen_at": now}


def not_counted(usage: dict, counted: dict | None) -> dict:
    """The usage a turn's day still lacks: ``usage`` less what was ``counted`` already."""
    if not counted:
        return usage
    return {name: amount - counted.get(name, 0) for name, amount in usage.items()}


TOKENS = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens")


def turn_record_fields(figures: dict, usage: dict | None) -> dict:
    """A ``TurnRecord``'s fields but its session and end: the turn's figures,
    and its tokens from its usage."""
    return {**figures, **{name: int((usage or {}).get(name, 0)) for name in TOKENS}}


def each_alone(writes: list[dict], write) -> Outcomes:
    """Each write on its own; per write, None or what it raised."""
    outcomes: Outcomes = []
    for each in writes:
        try:
            write(each)
        except Exception as exc:
            outcomes.append(exc)
        else:
            outcomes.append(None)
    return outcomes
