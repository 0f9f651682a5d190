"""Strict checks of AITP frames against the protocol's JSON Schema.

The browser client (OwlLayerClient 0.4.x) validates every frame it receives
and silently drops a frame that fails (protocol.md §1). A dropped frame
looks like "nothing happened", so this module names every reason a frame
would be dropped instead. The rules are the server's own: the schema
``aitp/messages.schema.json`` is written from its message models
(``python -m aitp.wire_schema``).

``frame_problems()`` returns the list of problems (empty when the frame is
accepted); ``check_frame()`` raises ``InvalidFrame`` with all of them.
Pure Python: no I/O but reading the schema once, no Django, no asyncio.
"""
from __future__ import annotations

import json
from functools import cache
from importlib import resources
from typing import Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from jsonschema.protocols import Validator

SCHEMA_FILE = "messages.schema.json"
# Who sends the frame -> the schema's definition of a frame from that side.
_FRAME_KINDS = {"server": "ServerFrame", "client": "ClientFrame"}


class InvalidFrame(ValueError):
    """The frame would be dropped by the client; ``problems`` says why."""

    def __init__(self, problems: list[str], frame: Any = None) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems
        self.frame = frame


def check_frame(frame: Any, *, sender: str = "server") -> dict[str, Any]:
    """Return ``frame`` when it is acceptable, else raise ``InvalidFrame``."""
    problems = frame_problems(frame, sender=sender)
    if problems:
        raise InvalidFrame(problems, frame)
    return frame


def frame_problems(frame: Any, *, sender: str = "server") -> list[str]:
    """Every reason the receiving side would drop ``frame`` (empty: accepted).

    ``sender`` is "server" for frames the browser client receives, "client"
    for frames a page sends to the server.
    """
    if sender not in _FRAME_KINDS:
        raise ValueError(f"sender must be 'server' or 'client', got {sender!r}")
    errors = _validator(sender).iter_errors(frame)
    return sorted({_problem(error) for error in errors})


def wire_schema() -> dict[str, Any]:
    """The protocol's JSON Schema document, as checked in beside the server's models."""
    document: dict[str, Any] = json.loads(_schema_text())
    return document


@cache
def _schema_text() -> str:
    return resources.files("aitp").joinpath(SCHEMA_FILE).read_text(encoding="utf-8")


@cache
def _validator(sender: str) -> Validator:
    document = {**wire_schema(), "$ref": f"#/$defs/{_FRAME_KINDS[sender]}"}
    return Draft202012Validator(document)


def _problem(error: ValidationError) -> str:
    where = ".".join(f"[{part}]" if isinstance(part, int) else str(part)
                     for part in error.absolute_path).replace(".[", "[")
    return f"{where or 'frame'}: {error.message}"
