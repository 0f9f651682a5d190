"""What the server adds to the time to first token.

The product's side: a page sends USER_INPUT and reads its first text delta
(AGENT_RESPONSE done:false), the product streaming from the fake Messages
API. The baseline: the same request sent straight to that fake API, read to
its first ``content_block_delta``. Both at once for ``sessions`` callers, in
the same run; the difference is what the server adds (the quota check, the
turn's start, the model client, the frame to the page).
"""
from __future__ import annotations

import asyncio

import httpx

from bench import measure
from bench.lines import (
    STREAM_PROMPT,
    Sample,
    Side,
    each_peer,
    is_text_delta,
    is_turn_done_frame,
    open_pages,
    send_until_accepted,
)
from bench.measure import BenchError, Observations

DIRECT_TIMEOUT = 60.0


async def product_first_text(side: Side, api_key: str, log: Observations, *, sessions: int,
                             per_session: int) -> Sample:
    """``sessions`` pages at once, ``per_session`` turns each: USER_INPUT to
    the first text delta read, per turn."""
    peers = await open_pages(side.target, api_key, log, sessions, "first text")
    latencies: list[float] = []

    async def one_turn(peer) -> float:
        started = measure.clock()
        first: list[float] = []

        def on_frame(frame: dict, received_at: float) -> None:
            if not first and is_text_delta(frame):
                first.append(received_at - started)

        await send_until_accepted(peer, {"modality": "text", "content": STREAM_PROMPT},
                                  is_turn_done_frame, log, on_frame)
        if not first:
            raise BenchError(f"{side.target.name}: a streamed answer without a text delta")
        return first[0]

    async def work(peer, number: int) -> None:
        for _ in range(per_session):
            latencies.append(await one_turn(peer))

    try:
        seconds = await each_peer(peers, work)
    finally:
        for peer in peers:
            await peer.close()
    return Sample(count=len(latencies), seconds=seconds, latencies=latencies)


def request_body(model: str) -> dict:
    return {"model": model, "max_tokens": 1024, "stream": True,
            "messages": [{"role": "user", "content": [{"type": "text", "text": STREAM_PROMPT}]}]}


async def direct_first_text(base_url: str, *, sessions: int, per_session: int,
                            model: str) -> Sample:
    """``sessions`` callers at once, ``per_session`` streaming requests each,
    straight to the Messages API at ``base_url``: request to first text delta."""
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=sessions, max_keepalive_connections=sessions)
    headers = {"x-api-key": "dummy", "anthropic-version": "2023-06-01"}

    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=DIRECT_TIMEOUT,
                                 headers=headers) as http:
        async def one() -> float:
            started = measure.clock()
            first = None
            async with http.stream("POST", "/v1/messages", json=request_body(model)) as answer:
                if answer.status_code != 200:
                    raise BenchError(f"the fake Messages API answered {answer.status_code}")
                async for line in answer.aiter_lines():
                    if first is None and line.startswith("event: content_block_delta"):
                        first = measure.clock() - started
            if first is None:
                raise BenchError("the fake Messages API streamed no text delta")
            return first

        async def caller() -> None:
            await one()  # its connection made, as the product's model client has its own
            for _ in range(per_session):
                latencies.append(await one())

        started = measure.clock()
        async with asyncio.TaskGroup() as group:
            for _ in range(sessions):
                group.create_task(caller())
        seconds = measure.clock() - started
    return Sample(count=len(latencies), seconds=seconds, latencies=latencies)
