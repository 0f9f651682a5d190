"""The JSON Schema of every AITP frame, written from ``aitp.messages``' models.

The file it writes (``aitp/messages.schema.json``, checked in) is what the
Python client validates frames with and what the browser client's tests
load. ``python -m aitp.wire_schema`` writes it again; ``--check`` fails
when the checked-in file is not what the models give. Pure: no Django.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from aitp.messages import CLIENT_TYPES, PAYLOAD_MODELS, PROTOCOL_VERSION, SERVER_TYPES, MessageType
from aitp.tools import MAX_DESCRIPTION_CHARS, TOOL_NAME_RE, Risk

SCHEMA_PATH = Path(__file__).with_name("messages.schema.json")
DIALECT = "https://json-schema.org/draft/2020-12/schema"


class _AsSent(GenerateJsonSchema):
    """A payload model's schema as a frame carries it: an optional field is
    left out, never null (``serialize`` leaves out None; the deployed client
    drops a frame with a null where a value would be, protocol.md §1)."""

    def nullable_schema(self, schema: core_schema.NullableSchema) -> JsonSchemaValue:
        return self.generate_inner(schema["schema"])

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        return self.generate_inner(schema["schema"])

    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


def _tool_declaration() -> dict[str, Any]:
    """One tool declaration as a page sends it (``aitp.tools.parse_tool``'s rules)."""
    return {
        "type": "object",
        "required": ["name", "description"],
        "properties": {
            "name": {"type": "string", "pattern": TOOL_NAME_RE},
            "description": {"type": "string", "minLength": 1, "maxLength": MAX_DESCRIPTION_CHARS},
            "parameters": {"type": "object"},
            "risk": {"enum": [risk.value for risk in Risk]},
        },
    }


def _payload(model: type[Any]) -> dict[str, Any]:
    schema: dict[str, Any] = model.model_json_schema(schema_generator=_AsSent)
    if model.__name__ == "ContextUpdate":
        schema["properties"]["activeTools"]["items"] = {"$ref": "#/$defs/ToolDeclaration"}
    return schema


def _frame() -> dict[str, Any]:
    """Any frame: the envelope, and the payload the frame's type says."""
    return {
        "type": "object",
        "required": ["id", "type", "timestamp", "payload"],
        "properties": {
            "id": {"type": "string", "minLength": 1},
            "type": {"enum": [t.value for t in MessageType]},
            "timestamp": {"type": "number", "description": "epoch milliseconds"},
            "payload": {"type": "object"},
            "meta": {"type": "object"},
        },
        "allOf": [
            {"if": {"required": ["type"], "properties": {"type": {"const": t.value}}},
             "then": {"properties": {"payload": {"$ref": f"#/$defs/{model.__name__}"}}}}
            for t, model in PAYLOAD_MODELS.items()
        ],
    }


def _sent_by(types: frozenset[MessageType], title: str) -> dict[str, Any]:
    """A frame of one direction (protocol.md §2: who sends each type)."""
    names = [t.value for t in MessageType if t in types]
    return {"title": title, "$ref": "#/$defs/Frame", "properties": {"type": {"enum": names}}}


def wire_schema() -> dict[str, Any]:
    """The schema document: any frame at its root; ``#/$defs/ServerFrame`` and
    ``#/$defs/ClientFrame`` for a frame of one direction (``validator``)."""
    defs: dict[str, Any] = {"Frame": _frame()}
    defs["ServerFrame"] = _sent_by(SERVER_TYPES, "A frame a server sends")
    defs["ClientFrame"] = _sent_by(CLIENT_TYPES, "A frame a page sends")
    defs.update((model.__name__, _payload(model)) for model in PAYLOAD_MODELS.values())
    defs["ToolDeclaration"] = _tool_declaration()
    return {
        "$schema": DIALECT,
        "$comment": "Written by `python -m aitp.wire_schema` from aitp/messages.py; do not edit.",
        "title": f"An AITP {PROTOCOL_VERSION} frame",
        "$ref": "#/$defs/Frame",
        "$defs": defs,
    }


def frame_schema(document: dict[str, Any], kind: str = "Frame") -> dict[str, Any]:
    """The document with ``#/$defs/<kind>`` (Frame, ServerFrame or
    ClientFrame) at its root: what a validator of that kind of frame takes."""
    return {**document, "$ref": f"#/$defs/{kind}"}


def schema_text() -> str:
    return json.dumps(wire_schema(), indent=2, ensure_ascii=False) + "\n"


def load(path: Path = SCHEMA_PATH) -> dict[str, Any]:
    """The checked-in schema document."""
    loaded: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return loaded


def main(argv: list[str]) -> int:
    text = schema_text()
    if "--check" in argv:
        if SCHEMA_PATH.read_text(encoding="utf-8") != text:
            print(f"{SCHEMA_PATH} is not what the models give: run python -m aitp.wire_schema",
                  file=sys.stderr)
            return 1
        return 0
    SCHEMA_PATH.write_text(text, encoding="utf-8")
    print(f"wrote {SCHEMA_PATH}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
