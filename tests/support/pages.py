"""Pages on the AITP consumer that wait for each frame they expect as long as
a loaded machine may take to send it.

``tests.aitp.conftest.Page`` waits 5 s for a frame. The frame arriving is the
event a test waits on; the bound only stops a hang, and a short one fails a
test whose answer is on its way (the handshake's answer after a slow key
read, an error after a notice crossed threads), cancelling the consumer too.
"""
from __future__ import annotations

from tests.aitp.conftest import CONSUMER_PATIENCE, ORIGIN, Page


class PatientPage(Page):
    async def recv(self, timeout: float = CONSUMER_PATIENCE) -> dict:
        return await super().recv(timeout)

    async def recv_until(self, type_: str, timeout: float = CONSUMER_PATIENCE, **payload_match) -> dict:
        return await super().recv_until(type_, timeout, **payload_match)


def patient(connect):
    """Wrap the ``connect`` fixture: the pages it opens are patient."""

    async def _connect(query: str = "", origin: str | None = ORIGIN) -> PatientPage:
        return PatientPage((await connect(query, origin)).ws)

    return _connect
