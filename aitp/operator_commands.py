"""What operators ask of a live session, carried out by the connection that
holds it.

An operator's action (``aitp.services.session_command``, or an approval
decided in the admin or the console) reaches the process holding the session
as a channel-layer ``session.command``; the connection's runner hands it here. ``end``
tells the page and closes with 1008, ``reload`` and ``redirect`` become
SYSTEM_EVENTs, ``approval_decided`` makes a waiting turn re-read the row,
``watchers`` turns the watcher feed's frames on or off; ``take_over``,
``operator_says``, ``operator_tool`` and ``hand_back`` put an operator in
charge of the chat, let them write and run the page's tools, and hand it
back (``operators.handover``, carried out by ``connection.turns``). ``superseded``
comes from a newer socket that offered the session's resume token: this one
says goodbye and closes with 4409, and the newer one continues the session.
"""
from __future__ import annotations

from aitp import live
from aitp import protocol as p
from aitp.close_codes import CLOSE_CONTINUED_ELSEWHERE, CLOSE_POLICY
from aitp.session import SessionMachine, State

SUPERSEDED = "superseded"
# From a newer socket on another process: the session goes on where it is
# held, relayed through that socket (connection.relay); nothing to do here.
RELAY = "relay"
# An operator takes the chat over from the agent, writes to the page user,
# hands it back (operators.handover).
TAKE_OVER = "take_over"
OPERATOR_SAYS = "operator_says"
HAND_BACK = "hand_back"
OPERATOR_TOOL = "operator_tool"
CONTINUED_ELSEWHERE = "This conversation goes on in another tab or window."


class OperatorCommands:
    def __init__(self, machine: SessionMachine) -> None:
        self.machine = machine

    async def handle(self, event: dict, *, turns, feed) -> None:
        """Carry out one command with the connection's turn owner
        (``connection.turns.TurnOwner``: its agent is None until the session
        is open) and watcher feed (None until then); the frames it queues are
        the caller's to flush."""
        command, agent = event.get("command"), turns.agent
        if command == "end":
            self.machine.send(p.system_event(
                "disconnect", message=event.get("message") or "An operator ended this session."
            ))
            self.machine.close_now(CLOSE_POLICY, "ended by operator")
        elif command == "reload":
            self.machine.send(p.system_event("reload", message=event.get("message") or None))
        elif command == "redirect" and event.get("url"):
            self.machine.send(p.system_event(
                "redirect", message=event.get("message") or None, data={"url": str(event["url"])}
            ))
        elif command == SUPERSEDED and self.machine.state is State.OPEN:
            self.machine.send(p.system_event("disconnect", message=CONTINUED_ELSEWHERE))
            self.machine.close_now(CLOSE_CONTINUED_ELSEWHERE, "continued on another socket")
        elif command == "approval_decided" and agent is not None:
            await agent.on_approval_decided(int(event["approval_id"]))
        elif command == live.WATCHERS_COMMAND and feed is not None:
            await feed.watchers_changed(event)
        elif command == TAKE_OVER and agent is not None:
            await turns.take_over(str(event["operator"]))
        elif command == OPERATOR_SAYS and agent is not None:
            await turns.operator_says(str(event["operator"]), str(event["text"]))
        elif command == HAND_BACK and agent is not None:
            await turns.hand_back(str(event["operator"]), str(event.get("note") or ""))
        elif command == OPERATOR_TOOL and agent is not None and isinstance(event.get("arguments"), dict):
            turns.operator_tool(str(event["operator"]), str(event["call_id"]), str(event["tool"]),
                                event["arguments"])
