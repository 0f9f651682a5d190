"""Tool declarations, AITP schema <-> JSON Schema, and the session's tool surface.

Pure: no Django, no Channels, no asyncio; the Python client (aitp_client)
imports it too. Clients declare tools in CONTEXT_UPDATE.activeTools with
upper-case AITP schemas (protocol.md §4); the model needs lower-case JSON
Schema, and the arguments it produces are checked against that schema (by
jsonschema) before a TOOL_CALL leaves the server.
"""

from __future__ import annotations

import copy
import enum
import hashlib
import json
import math
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from operator import attrgetter
from typing import Any, cast

from jsonschema import Draft202012Validator, TypeChecker, validators
from jsonschema.protocols import Validator

from aitp.protocol import compact_json

TOOL_NAME_RE = r"^[a-zA-Z0-9_-]{1,64}$"
_TOOL_NAME = re.compile(TOOL_NAME_RE)
# The model API refuses property keys outside this pattern and fails the
# whole request, so a bad key is caught when the tool is declared instead.
_PROPERTY_NAME = re.compile(r"^[a-zA-Z0-9_.-]{1,64}$")

MAX_DESCRIPTION_CHARS = 1024
MAX_SCHEMA_DEPTH = 8
AITP_TYPES = ("STRING", "NUMBER", "INTEGER", "BOOLEAN", "OBJECT", "ARRAY")
ORIGINS = ("client", "server")


class Risk(str, enum.Enum):
    NONE = "none"
    LOW = "low"
    HIGH = "high"
    CRITICAL = "critical"

    @property
    def needs_approval(self) -> bool:
        return self in (Risk.HIGH, Risk.CRITICAL)

    @property
    def rank(self) -> int:
        return _RISK_ORDER.index(self)

    @classmethod
    def highest(cls, *risks: str) -> Risk:
        """The highest of several levels (plain strings or members)."""
        return max((cls(str(getattr(r, "value", r))) for r in risks), key=lambda r: r.rank)


_RISK_ORDER = (Risk.NONE, Risk.LOW, Risk.HIGH, Risk.CRITICAL)
# The same four levels as database choices (value, label).
RISK_CHOICES = [(r.value, r.value.capitalize()) for r in Risk]
_RISK_VALUES = ", ".join(r.value for r in Risk)


class ToolError(Exception):
    """A tool declaration or schema is invalid; message names the offending path."""

    code: str = "invalid_tool"

    def __init__(self, message: str, *, code: str | None = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    parameters: dict[str, Any] | None  # the AITP schema as declared (upper-case types)
    risk: Risk = Risk.NONE
    origin: str = "client"  # "client" | "server"

    @cached_property
    def _json_schema(self) -> dict[str, Any]:
        return aitp_to_json_schema(self.parameters)

    @cached_property
    def _validator(self) -> Validator:
        return _ArgumentsValidator(_in_check_order(self._json_schema))

    def argument_problems(self, args: Any) -> list[str]:
        """``validate_arguments`` against this tool's schema (its validator built once)."""
        return _problems(self._validator, args)

    @property
    def input_schema(self) -> dict[str, Any]:
        """JSON Schema for the model; always {"type": "object", ...}. A fresh copy."""
        return copy.deepcopy(self._json_schema)

    @property
    def wire(self) -> dict[str, Any]:
        """The declaration as it goes on the wire, its parameters shared (a few
        keys built each time: kept per spec, they cost every idle session
        memory): serialize it, never change it (``to_wire()`` gives a copy)."""
        wire: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "risk": Risk(self.risk).value,
        }
        if self.parameters is not None:
            wire["parameters"] = self.parameters
        return wire

    def to_wire(self) -> dict[str, Any]:
        """The declaration as it goes on the wire. A fresh copy."""
        return cast(dict[str, Any], json_copy(self.wire))

    def to_anthropic(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description,
                "input_schema": self.input_schema}


def json_copy(value: Any) -> Any:
    """A deep copy of a JSON tree (dicts, lists, text, numbers, booleans,
    null), several times cheaper than ``copy.deepcopy``; anything else in it
    is deep-copied as ``copy.deepcopy`` would."""
    if isinstance(value, dict):
        return {key: json_copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [json_copy(item) for item in value]
    if value is None or isinstance(value, (str, int, float)):
        return value  # immutable (bool is an int)
    return copy.deepcopy(value)


# --- declarations -------------------------------------------------------------


def parse_tool(raw: Any, *, origin: str = "client", path: str = "tool",
               owned: bool = False) -> ToolSpec:
    """One tool declaration {name, description, parameters?, risk?}; raises
    ToolError. ``owned``: nothing but the caller holds the declaration (a
    frame just parsed), so its schema is kept as it is, not copied."""
    if origin not in ORIGINS:
        raise ValueError(f"origin must be one of {', '.join(ORIGINS)}")
    if not isinstance(raw, dict):
        raise ToolError(f"{path}: must be an object")

    name = raw.get("name")
    if not isinstance(name, str) or not _TOOL_NAME.fullmatch(name):
        raise ToolError(f"{path}.name: must be 1-64 letters, digits, '_' or '-'")

    description = raw.get("description")
    if not isinstance(description, str) or not description.strip():
        raise ToolError(f"{path}.description: must be a non-empty string")
    if len(description) > MAX_DESCRIPTION_CHARS:
        raise ToolError(f"{path}.description: must be at most {MAX_DESCRIPTION_CHARS} characters")

    parameters = raw.get("parameters")
    if parameters is not None:
        validate_aitp_schema(parameters, f"{path}.parameters")
        if parameters["type"].upper() != "OBJECT":
            raise ToolError(f"{path}.parameters.type: must be OBJECT")
        if not owned:
            # Detach from where it came from: the spec is frozen, its schema should be too.
            parameters = json_copy(parameters)

    # protocol.md §4: absent means none; any other value is an error, never a silent none.
    risk_raw = raw.get("risk")
    if risk_raw is None:
        risk = Risk.NONE
    elif isinstance(risk_raw, str) and risk_raw in Risk._value2member_map_:
        risk = Risk(risk_raw)
    else:
        raise ToolError(f"{path}.risk: must be one of {_RISK_VALUES}")

    return ToolSpec(name=name, description=description, parameters=parameters,
                    risk=risk, origin=origin)


def parse_client_tools(raw: list[Any], *, owned: bool = False) -> list[ToolSpec]:
    """CONTEXT_UPDATE.activeTools -> specs; raises ToolError naming the tool
    index. ``owned``: as ``parse_tool``'s."""
    if not isinstance(raw, list):
        raise ToolError("activeTools: must be a list")
    specs: list[ToolSpec] = []
    seen: set[str] = set()
    for index, item in enumerate(raw):
        spec = parse_tool(item, origin="client", path=f"activeTools[{index}]", owned=owned)
        if spec.name in seen:
            raise ToolError(f"activeTools[{index}].name: duplicate tool name '{spec.name}'")
        seen.add(spec.name)
        specs.append(spec)
    return specs


# --- AITP schema --------------------------------------------------------------


def validate_aitp_schema(schema: Any, path: str) -> None:
    """Check an AITP parameter schema; raises ToolError naming the path."""
    _validate_schema(schema, path, depth=1)


def _validate_schema(schema: Any, path: str, depth: int) -> None:
    if depth > MAX_SCHEMA_DEPTH:
        raise ToolError(f"{path}: nested deeper than {MAX_SCHEMA_DEPTH} levels")
    if not isinstance(schema, dict):
        raise ToolError(f"{path}: must be an object")

    kind = schema.get("type")
    if not isinstance(kind, str) or kind.upper() not in AITP_TYPES:
        raise ToolError(f"{path}.type: must be one of {', '.join(AITP_TYPES)}")
    kind = kind.upper()

    description = schema.get("description")
    if description is not None and not isinstance(description, str):
        raise ToolError(f"{path}.description: must be a string")
    for keyword, check in _KEYWORD_CHECKS:
        if schema.get(keyword) is not None:
            check(schema, kind, path, depth)


def _only_for(kind: str, allowed: str, path: str) -> None:
    if kind != allowed:
        raise ToolError(f"{path}: only allowed for type {allowed}")


def _check_properties(schema: dict[str, Any], kind: str, path: str, depth: int) -> None:
    properties = schema["properties"]
    _only_for(kind, "OBJECT", f"{path}.properties")
    if not isinstance(properties, dict):
        raise ToolError(f"{path}.properties: must be an object")
    for key, child in properties.items():
        if not isinstance(key, str) or not _PROPERTY_NAME.fullmatch(key):
            raise ToolError(f"{path}.properties: key '{str(key)[:64]}' must be 1-64 "
                            "letters, digits, '_', '.' or '-'")
        _validate_schema(child, f"{path}.properties.{key}", depth + 1)


def _check_required(schema: dict[str, Any], kind: str, path: str, depth: int) -> None:
    required = schema["required"]
    _only_for(kind, "OBJECT", f"{path}.required")
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise ToolError(f"{path}.required: must be a list of strings")
    for key in required:
        if key not in (schema.get("properties") or {}):
            raise ToolError(f"{path}.required: '{key[:64]}' is not a declared property")
    if len(set(required)) != len(required):
        raise ToolError(f"{path}.required: must not repeat a name")


def _check_items(schema: dict[str, Any], kind: str, path: str, depth: int) -> None:
    _only_for(kind, "ARRAY", f"{path}.items")
    _validate_schema(schema["items"], f"{path}.items", depth + 1)


def _check_enum(schema: dict[str, Any], kind: str, path: str, depth: int) -> None:
    enum_values = schema["enum"]
    if not isinstance(enum_values, list) or not enum_values:
        raise ToolError(f"{path}.enum: must be a non-empty list")
    for index, value in enumerate(enum_values):
        if not _matches_type(kind.lower(), value):
            raise ToolError(f"{path}.enum[{index}]: expected {kind.lower()}")


# Properties first: the required names must be among them.
_KEYWORD_CHECKS: tuple[tuple[str, Callable[[dict[str, Any], str, str, int], None]], ...] = (
    ("properties", _check_properties),
    ("required", _check_required),
    ("items", _check_items),
    ("enum", _check_enum),
)


def aitp_to_json_schema(schema: dict[str, Any] | None) -> dict[str, Any]:
    """AITP schema -> JSON Schema for the model (lower-case types).

    Carries type, description, properties, required, items and enum; other
    keys are dropped so the model sees only what validate_arguments checks.
    """
    if schema is None:
        return {"type": "object", "properties": {}}
    validate_aitp_schema(schema, "parameters")
    converted = _convert(schema)
    if converted["type"] != "object":
        raise ToolError("parameters.type: must be OBJECT")
    converted.setdefault("properties", {})
    return converted


def _convert(schema: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"type": schema["type"].lower()}
    if isinstance(schema.get("description"), str):
        out["description"] = schema["description"]
    if schema.get("properties") is not None:
        out["properties"] = {k: _convert(v) for k, v in schema["properties"].items()}
    if schema.get("required"):
        out["required"] = list(schema["required"])
    if schema.get("items") is not None:
        out["items"] = _convert(schema["items"])
    if schema.get("enum") is not None:
        out["enum"] = copy.deepcopy(schema["enum"])
    return out


# --- arguments ------------------------------------------------------------------
# Checked by jsonschema against the converted schema. The server checks the
# model's arguments with it before a TOOL_CALL leaves; the Python client
# (aitp_client) checks the TOOL_CALLs it receives with the same function.


def _finite_number(_checker: TypeChecker, value: Any) -> bool:
    return _matches_type("number", value)


# JSON Schema's own types, except that a number must be finite (NaN and
# infinity have no JSON form) and a boolean is never a number or an integer.
_ArgumentsValidator: type[Validator] = validators.extend(  # type: ignore[no-untyped-call]
    Draft202012Validator,
    type_checker=Draft202012Validator.TYPE_CHECKER.redefine("number", _finite_number),
)

# The order the keywords are checked in, and so the order of the messages:
# the value's type, then its enum, then missing keys, then each property in
# turn (depth first), then array items.
_KEYWORD_ORDER = ("type", "enum", "required", "properties", "items")


def _in_check_order(schema: Any) -> Any:
    if not isinstance(schema, dict):
        return schema
    ordered: dict[str, Any] = {}
    for keyword in _KEYWORD_ORDER:
        if keyword not in schema:
            continue
        value = schema[keyword]
        if keyword == "properties" and isinstance(value, dict):
            value = {key: _in_check_order(child) for key, child in value.items()}
        elif keyword == "items":
            value = _in_check_order(value)
        ordered[keyword] = value
    return ordered


def validate_arguments(schema: dict[str, Any], args: Any) -> list[str]:
    """Check model-produced arguments against a JSON Schema from aitp_to_json_schema.

    Returns human messages ("quantity: expected number"); empty means valid.
    Extra properties are allowed. A value of the wrong type is reported once,
    whatever else its schema says.
    """
    return _problems(_ArgumentsValidator(_in_check_order(schema)), args)


def _problems(validator: Validator, args: Any) -> list[str]:
    if not isinstance(args, dict):
        return ["arguments must be an object"]
    errors = list(validator.iter_errors(args))
    mistyped = {tuple(e.absolute_path) for e in errors if e.validator == "type"}
    messages: list[str] = []
    missing_seen: dict[tuple[Any, ...], int] = {}
    for error in errors:
        where = tuple(error.absolute_path)
        expected, instance = cast(Any, error.validator_value), cast(Any, error.instance)
        if error.validator != "type" and where in mistyped:
            continue
        if error.validator == "type":
            messages.append(f"{_path(where)}: expected {expected}")
        elif error.validator == "enum":
            allowed = ", ".join(json.dumps(e, ensure_ascii=False) for e in expected)
            messages.append(f"{_path(where)}: must be one of {allowed}")
        elif error.validator == "required":
            # One error per missing key, in the order the schema lists them.
            missing = [key for key in expected if key not in instance]
            index = missing_seen.get(where, 0)
            missing_seen[where] = index + 1
            messages.append(f"{_path((*where, missing[index]))}: is required")
        else:  # a keyword aitp_to_json_schema never writes
            messages.append(f"{_path(where)}: {error.message}")
    return messages


def _path(parts: Iterable[Any]) -> str:
    text = ""
    for part in parts:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _matches_type(kind: str, value: Any) -> bool:
    # bool is an int in Python but never a number or an integer in JSON.
    if kind == "string":
        return isinstance(value, str)
    if kind == "boolean":
        return isinstance(value, bool)
    if kind == "number":
        return (isinstance(value, (int, float)) and not isinstance(value, bool)
                and (not isinstance(value, float) or math.isfinite(value)))
    if kind == "integer":
        if isinstance(value, bool):
            return False
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    if kind == "object":
        return isinstance(value, dict)
    if kind == "array":
        return isinstance(value, list)
    return False


# --- the tool surface -------------------------------------------------------------


@dataclass(frozen=True)
class ToolSurface:
    """The tools one session offers the model: server tools win name clashes."""

    server_tools: tuple[ToolSpec, ...]
    client_tools: tuple[ToolSpec, ...]

    @classmethod
    def build(cls, server_tools: Iterable[ToolSpec], client_tools: Iterable[ToolSpec]) -> ToolSurface:
        server = tuple(server_tools)
        client = tuple(client_tools)
        for label, group in (("server", server), ("client", client)):
            seen: set[str] = set()
            for tool in group:
                if tool.name in seen:
                    raise ToolError(f"duplicate {label} tool name '{tool.name}'")
                seen.add(tool.name)
        return cls(server_tools=server, client_tools=client)

    @cached_property
    def _server_names(self) -> frozenset[str]:
        return frozenset(t.name for t in self.server_tools)

    @cached_property
    def effective(self) -> tuple[ToolSpec, ...]:
        return self.server_tools + tuple(
            t for t in self.client_tools if t.name not in self._server_names)

    @cached_property
    def ignored(self) -> tuple[ToolSpec, ...]:
        return tuple(t for t in self.client_tools if t.name in self._server_names)

    @cached_property
    def _by_name(self) -> dict[str, ToolSpec]:
        return {t.name: t for t in self.effective}

    def get(self, name: str) -> ToolSpec | None:
        return self._by_name.get(name)

    def to_event_data(self) -> dict[str, Any]:
        """data of SYSTEM_EVENT tools_effective (protocol.md §4). The lists are
        new; the declarations in them are the specs' shared ``wire``: serialize
        it, never change it."""
        return {
            "effectiveTools": [t.wire for t in self.effective],
            "serverTools": [t.wire for t in self.server_tools],
            "clientTools": [t.wire for t in self.client_tools],
            "ignoredClientTools": [t.wire for t in self.ignored],
        }

    @cached_property
    def client_tools_json(self) -> str:
        """The page's declarations (``wire`` of each client tool) as JSON text,
        written once for this surface: the session's row keeps them."""
        return compact_json([t.wire for t in self.client_tools])

    def anthropic_tools(self) -> list[dict[str, Any]]:
        """Tools for the model in a canonical order.

        The prompt cache keys on the exact tool list, so the same surface
        must always produce the same bytes: server tools by name, then
        client tools by name, with the cache breakpoint on the last one.
        """
        server = sorted(self.server_tools, key=attrgetter("name"))
        client = sorted(self.effective[len(self.server_tools):], key=attrgetter("name"))
        tools = [t.to_anthropic() for t in server + client]
        if tools:
            tools[-1]["cache_control"] = {"type": "ephemeral"}
        return tools


# --- hashing ----------------------------------------------------------------------


def canonical_json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def args_hash(name: str, args: dict[str, Any]) -> str:
    """sha256 hex of the canonical call; equal for equal calls whatever the key order."""
    text = canonical_json({"name": name, "args": args})
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
