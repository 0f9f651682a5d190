"""Where a session's turn is: idle, the agent answering, waiting for a page
tool, or waiting for an approval. The turn machine's phases map to it (aitp.turn), the row
writer stores it and watchers see it; the session row's state choices
(aitp.models.Session.State) take their values from here. Pure: no Django.
"""
from __future__ import annotations

from enum import StrEnum


class TurnState(StrEnum):
    IDLE = "idle"
    ANSWERING = "answering"
    WAITING_TOOL = "waiting_tool"
    WAITING_APPROVAL = "waiting_approval"
