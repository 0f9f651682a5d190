"""A tiny terminal chat over AITP: ``python -m aitp_client --url ws://... --key pk_...``.

Each line read is sent as USER_INPUT; the agent's text is printed as it
streams. The terminal has no tools and no one to approve: tool calls are
answered with an error and approval requests are denied, so a turn never
hangs waiting for them.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
from typing import TextIO

from aitp_client.client import (
    AitpClient,
    AitpClosed,
    AitpProtocolError,
    AitpRefused,
    AitpUpgradeRefused,
)

NO_TOOLS = "no tools in the terminal"
NO_APPROVALS = "no approvals in the terminal"
# After end of input, how long a running turn may take to finish.
DRAIN_TIMEOUT = 120.0


class _Screen:
    """Prints server frames; answers tool calls and approval requests."""

    def __init__(self, client: AitpClient, out: TextIO) -> None:
        self.client = client
        self.out = out
        self.streamed = ""
        self.turn_printed = False
        self.idle = asyncio.Event()
        self.idle.set()
        self.closed: AitpClosed | None = None
        # Set when we close the connection ourselves: nothing to report then.
        self.closing = False

    def write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    async def run(self) -> None:
        while True:
            try:
                await self.show(await self.client.recv(timeout=None))
            except AitpProtocolError as exc:
                # The browser drops such a frame silently; say so here.
                self.write(f"[dropped an invalid frame: {exc}]\n")
                continue
            except AitpClosed as exc:
                if self.closing:
                    return
                self.closed = exc
                self.write(f"[connection closed: {exc.close_code} {exc.close_reason or ''}]\n")
                self.idle.set()
                return

    async def show(self, frame: dict) -> None:
        kind, payload = frame["type"], frame["payload"]
        if kind == "AGENT_RESPONSE":
            self.show_text(payload["chunk"], payload["done"])
        elif kind == "TOOL_CALL":
            call = f"{payload['name']}({json.dumps(payload['args'])})"
            self.write(f"{self.line_break()}[tool call] {call}: {NO_TOOLS}\n")
            await self.client.tool_result(payload["callId"], error=NO_TOOLS)
        elif kind == "APPROVAL_REQUEST":
            message = payload["message"]
            self.write(f"{self.line_break()}[approval request] {message}: denied, {NO_APPROVALS}\n")
            await self.client.approval_response(payload["callId"], False, error=NO_APPROVALS)
        elif kind == "SYSTEM_EVENT":
            self.show_system_event(payload)

    def line_break(self) -> str:
        """A newline when streamed text left the cursor mid-line."""
        return "\n" if self.streamed and not self.streamed.endswith("\n") else ""

    def show_text(self, chunk: str, done: bool) -> None:
        # done:false frames carry deltas; the done:true frame carries the
        # complete text (wire-compat 6): print only what is still missing.
        if not done:
            self.streamed += chunk
            self.write(chunk)
            self.turn_printed = self.turn_printed or bool(chunk)
            return
        if chunk.startswith(self.streamed):
            rest = chunk[len(self.streamed):]
        else:
            rest = ("\n" if self.streamed else "") + chunk
        self.write(rest)
        if self.turn_printed or rest:
            self.write("\n")
        self.streamed = ""
        self.turn_printed = False
        self.idle.set()

    def show_system_event(self, payload: dict) -> None:
        kind = payload["kind"]
        if kind == "tools_effective":
            tools = payload.get("data", {}).get("effectiveTools", [])
            names = [tool.get("name", "?") for tool in tools if isinstance(tool, dict)]
            self.write(f"[tools] {', '.join(names) or 'none'}\n")
        elif kind == "transcript":
            data = payload.get("data", {})
            self.write(f"[{data.get('role', '?')}] {data.get('text', '')}\n")
        else:
            self.write(f"[{kind}] {payload.get('message', '')}\n")
        if kind == "error":
            # A refused input gets an error and no turn; a failed turn gets
            # an error then done:true. Either way the next line may go.
            self.idle.set()


async def chat(client: AitpClient, lines: asyncio.Queue, out: TextIO) -> int:
    """Run the chat until end of input (a None in ``lines``) or a server close."""
    try:
        ack = await client.connect()
    except AitpRefused as exc:
        out.write(f"refused: {exc.message} (close {exc.close_code} {exc.close_reason or ''})\n")
        return 2
    except (AitpClosed, AitpUpgradeRefused, AitpProtocolError, TimeoutError, OSError) as exc:
        out.write(f"cannot connect: {exc}\n")
        return 2
    out.write(f"connected, session {ack['sessionId']}. type a message; ctrl-d quits.\n")
    out.flush()
    # wire-compat 4: a page sends its context right after the ACK.
    await client.context_update("/terminal", "Terminal chat", context={"client": "terminal"})
    screen = _Screen(client, out)
    screen_task = asyncio.create_task(screen.run())
    try:
        while True:
            next_line = asyncio.ensure_future(lines.get())
            await asyncio.wait({next_line, screen_task}, return_when=asyncio.FIRST_COMPLETED)
            if screen_task.done():
                next_line.cancel()
                return 1
            line = next_line.result()
            if line is None:
                break
            if not line.strip():
                continue
            # One turn at a time, as in a page: the server refuses input
            # while the agent is answering.
            if not await _turn_finished(screen, screen_task):
                return 1
            screen.idle.clear()
            await client.user_input(line.strip())
        # End of input: let the running turn finish before closing.
        try:
            async with asyncio.timeout(DRAIN_TIMEOUT):
                await screen.idle.wait()
        except TimeoutError:
            out.write("[turn still running at end of input; closing]\n")
        return 0 if screen.closed is None else 1
    finally:
        screen.closing = True
        await client.close()
        await screen_task


async def _turn_finished(screen: _Screen, screen_task: asyncio.Task) -> bool:
    """Wait for the running turn to end; False when the connection ended instead."""
    idle = asyncio.ensure_future(screen.idle.wait())
    await asyncio.wait({idle, screen_task}, return_when=asyncio.FIRST_COMPLETED)
    idle.cancel()
    return not screen_task.done()


def _read_stdin(loop: asyncio.AbstractEventLoop, lines: asyncio.Queue) -> None:
    # A daemon thread: a blocking readline must not keep the process alive.
    for line in sys.stdin:
        loop.call_soon_threadsafe(lines.put_nowait, line)
    loop.call_soon_threadsafe(lines.put_nowait, None)


async def _main(args: argparse.Namespace) -> int:
    client = AitpClient(args.url, api_key=args.key, origin=args.origin)
    lines: asyncio.Queue = asyncio.Queue()
    threading.Thread(
        target=_read_stdin, args=(asyncio.get_running_loop(), lines), daemon=True
    ).start()
    return await chat(client, lines, sys.stdout)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m aitp_client", description="A terminal chat with an AITP server."
    )
    parser.add_argument("--url", required=True, help="ws://host:port/owllayer")
    parser.add_argument("--key", help="the publishable API key (pk_...)")
    parser.add_argument("--origin", help="the Origin header to send, e.g. http://localhost:8000")
    args = parser.parse_args(argv)
    try:
        return asyncio.run(_main(args))
    except KeyboardInterrupt:
        return 130
