"""A tiny terminal chat over AITP: ``python -m aitp_client --url ws://... --key pk_...``.

Each line read is sent as USER_INPUT; the agent's text is printed as it
streams. The terminal has no tools of its own: a tool call is answered with
an error saying so. An approval request is a question to the person at the
terminal (y/n); the next line read answers it. ``/help`` and ``/quit`` are
handled here and never sent to the agent. A bad ``--url`` or a server that
cannot be reached is one line on stderr, never a traceback, and never shows
the key.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import TextIO
from urllib.parse import urlsplit, urlunsplit

from aitp_client.client import AitpClient
from aitp_client.errors import AitpClosed, AitpProtocolError, AitpRefused, AitpUpgradeRefused

NO_TOOLS = "no tools in the terminal"
NO_ANSWER = "the terminal user gave no answer before the input ended"
# After end of input, how long a running turn may take to finish.
DRAIN_TIMEOUT = 120.0
PROMPT = "you> "
QUIT_COMMANDS = ("/quit", "/exit")
HELP_COMMAND = "/help"
HELP = (
    "Type a message and press enter to send it to the agent.\n"
    "When the agent asks to run an action, answer y (yes) or n (no).\n"
    "/help shows this; /quit (or ctrl-d) ends the chat. Other lines, /tool ones too, go to the agent.\n"
)
YES = ("y", "yes")
NO = ("n", "no")


@dataclass
class _Question:
    """An approval request waiting for the terminal user's y/n."""

    call_id: str
    tool: str
    answered: asyncio.Future = field(default_factory=lambda: asyncio.get_running_loop().create_future())


class _Screen:
    """Prints server frames; answers tool calls and asks about approval requests."""

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
        # Approval requests not answered yet, oldest first; ``asking`` is set
        # while there is one, so the input loop knows a line is an answer.
        self.questions: deque[_Question] = deque()
        self.asking = asyncio.Event()
        self.answers: set[asyncio.Task] = set()
        self.at_prompt = False

    def write(self, text: str) -> None:
        # Something arriving while a prompt waits for a line starts on a line of its own.
        if self.at_prompt and text:
            text = "\n" + text
        self.at_prompt = text.endswith((PROMPT, "[y/n] "))
        self.out.write(text)
        self.out.flush()

    def line_read(self) -> None:
        """The user pressed enter: the cursor is at the start of a line again."""
        self.at_prompt = False

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
            self.write(f"{self.line_break()}[tool call] {call}: not run, {NO_TOOLS}\n")
            await self.client.tool_result(payload["callId"], error=NO_TOOLS)
        elif kind == "APPROVAL_REQUEST":
            self.ask(payload)
        elif kind == "SYSTEM_EVENT":
            self.show_system_event(payload)

    # --- approvals: a question to the terminal user -------------------------

    def ask(self, payload: dict) -> None:
        question = _Question(call_id=payload["callId"], tool=payload["toolName"])
        self.questions.append(question)
        args = json.dumps(payload.get("args", {}), ensure_ascii=False)
        message = payload.get("message") or f"The agent asks to run {question.tool}."
        self.write(
            f"{self.line_break()}[approval] {message}\n"
            f"  {question.tool}({args}), {payload.get('risk', '?')} risk\n"
        )
        task = asyncio.create_task(self._send_answer(question))
        self.answers.add(task)
        task.add_done_callback(self.answers.discard)
        if len(self.questions) == 1:
            self.prompt_question()
        self.asking.set()

    def prompt_question(self) -> None:
        self.write(f"Allow {self.questions[0].tool}? [y/n] ")

    def answer(self, line: str) -> None:
        """The terminal user's line for the oldest open question."""
        reply = line.strip().lower()
        if reply not in YES + NO:
            self.write("Please answer y or n. ")
            self.prompt_question()
            return
        self._settle(reply in YES, None)

    def answer_none(self) -> None:
        """Input ended: every open question is refused, and said to be."""
        while self.questions:
            self._settle(False, NO_ANSWER)

    def _settle(self, approved: bool, error: str | None) -> None:
        question = self.questions.popleft()
        if not question.answered.done():
            question.answered.set_result((approved, error))
        if self.questions:
            self.prompt_question()
        else:
            self.asking.clear()

    async def _send_answer(self, question: _Question) -> None:
        approved, error = await question.answered
        if approved:
            self.write(f"[approval] you allowed {question.tool}\n")
        elif error is None:
            self.write(f"[approval] you declined {question.tool}\n")
        else:
            self.write(f"[approval] {question.tool} refused: {error}\n")
        try:
            await self.client.approval_response(question.call_id, approved, error=error)
        except AitpClosed:
            pass  # the connection ended meanwhile: run() reports it

    def line_break(self) -> str:
        """A newline when streamed text left the cursor mid-line."""
        return "\n" if self.streamed and not self.streamed.endswith("\n") else ""

    def show_text(self, chunk: str, done: bool) -> None:
        # done:false frames carry deltas; the done:true frame carries the
        # complete text (protocol.md §5): print only what is still missing.
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
        self.write(PROMPT)

    def show_system_event(self, payload: dict) -> None:
        kind = payload["kind"]
        if kind == "tools_effective":
            tools = payload.get("data", {}).get("effectiveTools", [])
            names = [tool.get("name", "?") for tool in tools if isinstance(tool, dict)]
            self.write(f"[tools] {', '.join(names) or 'none'}\n")
        elif kind == "approval_required":
            return  # the APPROVAL_REQUEST that follows is the question asked
        elif kind == "transcript":
            data = payload.get("data", {})
            self.write(f"[{data.get('role', '?')}] {data.get('text', '')}\n")
        else:
            self.write(f"[{kind}] {payload.get('message', '')}\n")
        # A refused input gets an error and no turn; a failed turn gets an
        # error then done:true. Either way the next line may go.
        if kind == "error" and not self.idle.is_set():
            self.idle.set()
            self.write(PROMPT)


def _redact(text: str, secret: str | None) -> str:
    """Never print the key, whatever a library put it into (a URL's query)."""
    return text.replace(secret, "pk_…") if secret else text


async def chat(client: AitpClient, lines: asyncio.Queue, out: TextIO) -> int:
    """Run the chat until end of input (a None in ``lines``), /quit or a server close."""
    ack = await _connect(client, out)
    if ack is None:
        return 2
    out.write(f"connected, session {ack['sessionId']}. type a message; /help for help, /quit or ctrl-d quits.\n")
    out.flush()
    # protocol.md §4: a page sends its context right after the ACK.
    await client.context_update("/terminal", "Terminal chat", context={"client": "terminal"})
    screen = _Screen(client, out)
    screen_task = asyncio.create_task(screen.run())
    try:
        screen.write(PROMPT)
        code = await _read_lines(client, screen, screen_task, lines)
        return code if code is not None else await _drain(screen, screen_task, out)
    finally:
        screen.closing = True
        await client.close()
        await screen_task
        for task in list(screen.answers):
            task.cancel()


async def _connect(client: AitpClient, out: TextIO) -> dict | None:
    """The HANDSHAKE_ACK's payload, or None once the reason it failed is printed."""
    try:
        return await client.connect()
    except AitpRefused as exc:
        out.write(f"refused: {exc.message} (close {exc.close_code} {exc.close_reason or ''})\n")
    except (AitpClosed, AitpUpgradeRefused, AitpProtocolError, TimeoutError, OSError) as exc:
        out.write(f"cannot connect: {_redact(str(exc), client.api_key)}\n")
    except Exception as exc:
        out.write(f"cannot connect: {_redact(str(exc) or type(exc).__name__, client.api_key)}\n")
    return None


async def _read_lines(client: AitpClient, screen: _Screen, screen_task: asyncio.Task,
                      lines: asyncio.Queue) -> int | None:
    """Each line read, sent or answered, until end of input (None) or the
    code to exit with."""
    while True:
        next_line = asyncio.ensure_future(lines.get())
        await asyncio.wait({next_line, screen_task}, return_when=asyncio.FIRST_COMPLETED)
        if screen_task.done():
            next_line.cancel()
            return 1
        line = next_line.result()
        screen.line_read()
        if line is None:
            screen.answer_none()
            return None
        code = await _one_line(client, screen, screen_task, line)
        if code is not None:
            return code


async def _one_line(client: AitpClient, screen: _Screen, screen_task: asyncio.Task,
                    line: str) -> int | None:
    """One line: an answer, a command, or a message; the code to exit with, if any."""
    if screen.questions:
        screen.answer(line)
        return None
    text = line.strip()
    if text.lower() in QUIT_COMMANDS:
        return 0 if screen.closed is None else 1
    if text.lower() == HELP_COMMAND:
        screen.write(HELP + PROMPT)
        return None
    if not text:
        return None
    # One turn at a time, as in a page: the server refuses input while the
    # agent is answering. A line read meanwhile answers the question the
    # turn may ask, or goes once the turn is done.
    waited = await _turn_finished_or_question(screen, screen_task)
    if waited is None:
        return 1
    if waited == "question":
        screen.answer(line)
        return None
    screen.idle.clear()
    await client.user_input(text)
    return None


async def _drain(screen: _Screen, screen_task: asyncio.Task, out: TextIO) -> int:
    """End of input: let the running turn finish before closing; a question
    it asks now can have no answer."""
    try:
        async with asyncio.timeout(DRAIN_TIMEOUT):
            while await _turn_finished_or_question(screen, screen_task) == "question":
                screen.answer_none()
    except TimeoutError:
        out.write("[turn still running at end of input; closing]\n")
    return 0 if screen.closed is None else 1


async def _turn_finished_or_question(screen: _Screen, screen_task: asyncio.Task) -> str | None:
    """Wait until the running turn ends ("idle") or asks the user something
    ("question"); None when the connection ended instead."""
    idle = asyncio.ensure_future(screen.idle.wait())
    asking = asyncio.ensure_future(screen.asking.wait())
    await asyncio.wait({idle, asking, screen_task}, return_when=asyncio.FIRST_COMPLETED)
    idle.cancel()
    asking.cancel()
    if screen_task.done():
        return None
    return "question" if screen.questions else "idle"


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


def url_error(url: str) -> str | None:
    """Why ``url`` is not a socket address this client can open, or None."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return "--url is not a valid address"
    if parts.scheme in ("ws", "wss") and parts.netloc:
        return None
    if parts.scheme in ("http", "https") and parts.netloc:
        socket_scheme = "wss" if parts.scheme == "https" else "ws"
        path = parts.path if parts.path not in ("", "/") else "/owllayer"
        suggestion = urlunsplit((socket_scheme, parts.netloc, path, "", ""))
        return f"--url is a web page address; give the server's socket, e.g. {suggestion}"
    return "--url must be a ws:// or wss:// address, e.g. ws://127.0.0.1:8000/owllayer"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m aitp_client", description="A terminal chat with an AITP server.",
        epilog="In the chat: /help lists what you can type, /quit ends it.",
    )
    parser.add_argument("--url", required=True, help="the server's socket, e.g. ws://127.0.0.1:8000/owllayer")
    parser.add_argument("--key", help="the publishable API key (pk_...)")
    parser.add_argument("--origin", help="the Origin header to send, e.g. http://localhost:8000")
    args = parser.parse_args(argv)
    if (error := url_error(args.url)) is not None:
        print(f"{parser.prog}: error: {_redact(error, args.key)}", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_main(args))
    except KeyboardInterrupt:
        return 130
