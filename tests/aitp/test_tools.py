"""aitp.tools: tool declarations, schema conversion, argument checks, the tool surface."""

import copy
import hashlib
import itertools
import json

import pytest

from aitp import protocol as p
from aitp.tools import (
    TOOL_NAME_RE,
    Risk,
    ToolError,
    ToolSpec,
    ToolSurface,
    aitp_to_json_schema,
    args_hash,
    canonical_json,
    parse_client_tools,
    parse_tool,
    validate_aitp_schema,
    validate_arguments,
)

ADD_TO_CART = {
    "name": "add_to_cart",
    "description": "Add the currently viewed product to the shopping cart",
    "parameters": {
        "type": "OBJECT",
        "properties": {"quantity": {"type": "NUMBER", "description": "Quantity to add"}},
        "required": ["quantity"],
    },
    "risk": "low",
}

CHECKOUT = {
    "type": "OBJECT",
    "properties": {
        "address": {
            "type": "OBJECT",
            "description": "Where to ship",
            "properties": {"city": {"type": "STRING"}, "zip": {"type": "STRING"}},
            "required": ["city"],
        },
        "items": {
            "type": "ARRAY",
            "items": {
                "type": "OBJECT",
                "properties": {"sku": {"type": "STRING"}, "count": {"type": "INTEGER"}},
                "required": ["sku"],
            },
        },
        "speed": {"type": "STRING", "enum": ["standard", "express"]},
        "gift": {"type": "BOOLEAN"},
    },
    "required": ["address", "items"],
}


def tool(name, origin="client", risk="none", description=None):
    return parse_tool({"name": name, "description": description or f"{name} tool", "risk": risk},
                      origin=origin)


def tool_error(fn, *args, **kwargs) -> ToolError:
    with pytest.raises(ToolError) as info:
        fn(*args, **kwargs)
    return info.value


def nested(depth):
    """An AITP schema with `depth` levels of OBJECT nesting (the root is level 1)."""
    schema = {"type": "STRING"}
    for _ in range(depth - 1):
        schema = {"type": "OBJECT", "properties": {"inner": schema}}
    return schema


# --- risk ---------------------------------------------------------------------------


def test_only_high_and_critical_risks_need_approval():
    assert [r.value for r in Risk] == ["none", "low", "high", "critical"]
    assert {r for r in Risk if r.needs_approval} == {Risk.HIGH, Risk.CRITICAL}


@pytest.mark.parametrize("value,expected", [
    ("none", Risk.NONE), ("low", Risk.LOW), ("high", Risk.HIGH), ("critical", Risk.CRITICAL),
    (None, Risk.NONE),
])
def test_a_declared_risk_is_read_as_given(value, expected):
    assert parse_tool(dict(ADD_TO_CART, risk=value)).risk is expected


def test_an_absent_risk_means_none():
    declaration = {k: v for k, v in ADD_TO_CART.items() if k != "risk"}
    assert parse_tool(declaration).risk is Risk.NONE


@pytest.mark.parametrize("value", ["HIGH", "medium", "", 1, True, ["high"], {"level": "high"}])
def test_an_unknown_risk_is_an_error_never_a_silent_none(value):
    error = tool_error(parse_client_tools, [ADD_TO_CART, ADD_TO_CART | {"name": "b"},
                                            dict(ADD_TO_CART, name="c", risk=value)])
    assert error.message == "activeTools[2].risk: must be one of none, low, high, critical"
    assert error.code == "invalid_tool"


# --- declarations -----------------------------------------------------------------------


def test_a_spec_declaration_parses_into_a_client_tool():
    spec = parse_tool(ADD_TO_CART)
    assert (spec.name, spec.risk, spec.origin) == ("add_to_cart", Risk.LOW, "client")
    assert spec.description == ADD_TO_CART["description"]
    assert spec.parameters == ADD_TO_CART["parameters"]


def test_a_server_tool_keeps_its_origin():
    assert parse_tool(ADD_TO_CART, origin="server").origin == "server"
    with pytest.raises(ValueError):
        parse_tool(ADD_TO_CART, origin="browser")


def test_declarations_of_a_frame_parsed_for_the_call_keep_their_schema_without_a_copy():
    raw = copy.deepcopy(ADD_TO_CART)
    [spec] = parse_client_tools([raw], owned=True)
    assert spec.parameters is raw["parameters"]


def test_the_parsed_schema_is_detached_from_the_frame():
    raw = copy.deepcopy(ADD_TO_CART)
    spec = parse_tool(raw)
    raw["parameters"]["properties"]["quantity"]["type"] = "STRING"
    assert spec.parameters["properties"]["quantity"]["type"] == "NUMBER"


def test_unknown_declaration_keys_are_ignored():
    assert parse_tool(dict(ADD_TO_CART, icon="cart.svg")).name == "add_to_cart"


@pytest.mark.parametrize("name", ["add_to_cart", "a", "A-9_z", "x" * 64])
def test_tool_names_follow_the_pattern(name):
    assert parse_tool(dict(ADD_TO_CART, name=name)).name == name


@pytest.mark.parametrize("name", ["", "x" * 65, "add to cart", "add.cart", "café", "add\n", None, 7])
def test_a_tool_name_outside_the_pattern_is_refused(name):
    error = tool_error(parse_client_tools, [dict(ADD_TO_CART, name=name)])
    assert error.message.startswith("activeTools[0].name: ")
    assert TOOL_NAME_RE == r"^[a-zA-Z0-9_-]{1,64}$"


@pytest.mark.parametrize("description", [None, "", "   \n", 3])
def test_a_tool_needs_a_description(description):
    error = tool_error(parse_client_tools, [dict(ADD_TO_CART, description=description)])
    assert error.message == "activeTools[0].description: must be a non-empty string"


def test_a_description_may_be_1024_characters_but_not_more():
    assert parse_tool(dict(ADD_TO_CART, description="d" * 1024)).description == "d" * 1024
    error = tool_error(parse_client_tools, [dict(ADD_TO_CART, description="d" * 1025)])
    assert error.message == "activeTools[0].description: must be at most 1024 characters"


def test_a_tool_without_parameters_has_none():
    spec = parse_tool({"name": "open_cart", "description": "Open the cart"})
    assert spec.parameters is None


def test_parameters_must_have_an_object_root():
    error = tool_error(parse_client_tools, [dict(ADD_TO_CART, parameters={"type": "STRING"})])
    assert error.message == "activeTools[0].parameters.type: must be OBJECT"


def test_a_declaration_that_is_not_an_object_is_refused():
    error = tool_error(parse_client_tools, [ADD_TO_CART, "add_to_cart"])
    assert error.message == "activeTools[1]: must be an object"


def test_duplicate_names_in_one_update_are_refused():
    error = tool_error(parse_client_tools, [ADD_TO_CART, dict(ADD_TO_CART, risk="high")])
    assert error.message == "activeTools[1].name: duplicate tool name 'add_to_cart'"


def test_active_tools_must_be_a_list():
    assert tool_error(parse_client_tools, {"add_to_cart": ADD_TO_CART}).message == (
        "activeTools: must be a list")


def test_an_empty_tool_list_is_valid():
    assert parse_client_tools([]) == []


# --- AITP schema validation ----------------------------------------------------------------


def test_lower_case_types_are_accepted():
    validate_aitp_schema({"type": "object", "properties": {"q": {"type": "number"}}}, "p")


@pytest.mark.parametrize("schema,message", [
    ("OBJECT", "p: must be an object"),
    ({}, "p.type: must be one of STRING, NUMBER, INTEGER, BOOLEAN, OBJECT, ARRAY"),
    ({"type": "DATE"}, "p.type: must be one of"),
    ({"type": "OBJECT", "properties": []}, "p.properties: must be an object"),
    ({"type": "OBJECT", "properties": {"q": "NUMBER"}}, "p.properties.q: must be an object"),
    ({"type": "OBJECT", "properties": {"q": {"type": "TEXT"}}}, "p.properties.q.type: must be"),
    ({"type": "OBJECT", "properties": {"bad key": {"type": "STRING"}}}, "p.properties: key 'bad key'"),
    ({"type": "OBJECT", "properties": {"q": {"type": "NUMBER"}}, "required": "q"},
     "p.required: must be a list of strings"),
    ({"type": "OBJECT", "properties": {"q": {"type": "NUMBER"}}, "required": ["r"]},
     "p.required: 'r' is not a declared property"),
    ({"type": "OBJECT", "required": ["r"]}, "p.required: 'r' is not a declared property"),
    ({"type": "OBJECT", "properties": {"q": {"type": "NUMBER"}}, "required": ["q", "q"]},
     "p.required: must not repeat a name"),
    ({"type": "STRING", "enum": []}, "p.enum: must be a non-empty list"),
    ({"type": "STRING", "enum": "small"}, "p.enum: must be a non-empty list"),
    ({"type": "STRING", "enum": ["S", 2]}, "p.enum[1]: expected string"),
    ({"type": "ARRAY", "items": {"type": "WORD"}}, "p.items.type: must be one of"),
    ({"type": "ARRAY", "items": []}, "p.items: must be an object"),
    ({"type": "STRING", "description": 5}, "p.description: must be a string"),
    ({"type": "STRING", "properties": {}}, "p.properties: only allowed for type OBJECT"),
    ({"type": "STRING", "items": {"type": "STRING"}}, "p.items: only allowed for type ARRAY"),
])
def test_an_invalid_schema_is_refused_naming_the_path(schema, message):
    assert tool_error(validate_aitp_schema, schema, "p").message.startswith(message)


def test_schemas_may_nest_eight_levels_but_not_nine():
    validate_aitp_schema(nested(8), "p")
    error = tool_error(validate_aitp_schema, nested(9), "p")
    assert error.message.endswith("nested deeper than 8 levels")


def test_array_items_count_as_a_nesting_level():
    schema = nested(7)
    validate_aitp_schema({"type": "ARRAY", "items": schema}, "p")
    with pytest.raises(ToolError):
        validate_aitp_schema({"type": "ARRAY", "items": {"type": "ARRAY", "items": schema}}, "p")


def test_a_client_tool_with_a_bad_nested_schema_names_the_tool_index():
    bad = dict(ADD_TO_CART, name="checkout", parameters={
        "type": "OBJECT", "properties": {"items": {"type": "ARRAY", "items": {"type": "SKU"}}}})
    error = tool_error(parse_client_tools, [ADD_TO_CART, bad])
    assert error.message.startswith("activeTools[1].parameters.properties.items.items.type: ")


# --- conversion to JSON Schema ----------------------------------------------------------------


def test_no_parameters_convert_to_an_empty_object_schema():
    assert aitp_to_json_schema(None) == {"type": "object", "properties": {}}


def test_the_spec_example_converts_to_lower_case_json_schema():
    assert aitp_to_json_schema(ADD_TO_CART["parameters"]) == {
        "type": "object",
        "properties": {"quantity": {"type": "number", "description": "Quantity to add"}},
        "required": ["quantity"],
    }


def test_nested_objects_arrays_enums_and_required_are_carried():
    assert aitp_to_json_schema(CHECKOUT) == {
        "type": "object",
        "properties": {
            "address": {
                "type": "object",
                "description": "Where to ship",
                "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                "required": ["city"],
            },
            "items": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {"sku": {"type": "string"}, "count": {"type": "integer"}},
                    "required": ["sku"],
                },
            },
            "speed": {"type": "string", "enum": ["standard", "express"]},
            "gift": {"type": "boolean"},
        },
        "required": ["address", "items"],
    }


def test_a_root_without_properties_gets_an_empty_properties_object():
    assert aitp_to_json_schema({"type": "OBJECT"}) == {"type": "object", "properties": {}}


def test_keys_we_do_not_check_are_not_passed_to_the_model():
    schema = {"type": "OBJECT", "title": "T", "properties": {
        "n": {"type": "NUMBER", "minimum": 0, "format": "float"}}}
    assert aitp_to_json_schema(schema) == {"type": "object", "properties": {"n": {"type": "number"}}}


def test_conversion_refuses_an_invalid_schema():
    with pytest.raises(ToolError):
        aitp_to_json_schema({"type": "OBJECT", "properties": {"q": {"type": "TEXT"}}})
    with pytest.raises(ToolError):
        aitp_to_json_schema({"type": "ARRAY"})


def test_conversion_does_not_change_the_declared_schema():
    declared = copy.deepcopy(CHECKOUT)
    aitp_to_json_schema(declared)
    assert declared == CHECKOUT


# --- ToolSpec output -----------------------------------------------------------------------------


def test_a_spec_goes_on_the_wire_without_empty_fields():
    assert tool("open_cart").to_wire() == {"name": "open_cart", "description": "open_cart tool",
                                           "risk": "none"}
    wire = parse_tool(ADD_TO_CART).to_wire()
    assert wire == ADD_TO_CART
    assert json.dumps(wire)  # serializable as is


def test_a_spec_gives_the_model_its_json_schema():
    assert parse_tool(ADD_TO_CART).to_anthropic() == {
        "name": "add_to_cart",
        "description": ADD_TO_CART["description"],
        "input_schema": aitp_to_json_schema(ADD_TO_CART["parameters"]),
    }


def test_changing_a_returned_schema_does_not_change_the_spec():
    spec = parse_tool(ADD_TO_CART)
    spec.input_schema["properties"].clear()
    spec.to_anthropic()["input_schema"]["required"].append("x")
    assert spec.input_schema == aitp_to_json_schema(ADD_TO_CART["parameters"])


# --- argument validation -----------------------------------------------------------------------------


SCHEMA = aitp_to_json_schema(CHECKOUT)
GOOD_ARGS = {"address": {"city": "Lyon"}, "items": [{"sku": "A1", "count": 2}], "speed": "express"}


def test_valid_arguments_produce_no_errors():
    assert validate_arguments(SCHEMA, GOOD_ARGS) == []


def test_extra_properties_are_allowed():
    assert validate_arguments(SCHEMA, dict(GOOD_ARGS, note="ring twice")) == []


@pytest.mark.parametrize("args", [None, [], "quantity=2", 2])
def test_arguments_that_are_not_an_object_are_refused(args):
    assert validate_arguments(SCHEMA, args) == ["arguments must be an object"]


def test_a_missing_required_argument_is_reported():
    assert validate_arguments(aitp_to_json_schema(ADD_TO_CART["parameters"]), {}) == [
        "quantity: is required"]


@pytest.mark.parametrize("value,ok", [
    (2, True), (2.5, True), (0, True), (-1e3, True),
    (True, False), ("2", False), (None, False), ([2], False), (float("nan"), False),
])
def test_number_accepts_ints_and_floats_but_not_booleans_or_strings(value, ok):
    errors = validate_arguments(aitp_to_json_schema(ADD_TO_CART["parameters"]), {"quantity": value})
    assert errors == ([] if ok else ["quantity: expected number"])


@pytest.mark.parametrize("value,ok", [
    (2, True), (2.0, True), (-3, True), (2.5, False), (True, False), ("2", False),
])
def test_integer_accepts_whole_numbers_only(value, ok):
    args = dict(GOOD_ARGS, items=[{"sku": "A1", "count": value}])
    assert validate_arguments(SCHEMA, args) == ([] if ok else ["items[0].count: expected integer"])


def test_boolean_does_not_accept_numbers():
    assert validate_arguments(SCHEMA, dict(GOOD_ARGS, gift=1)) == ["gift: expected boolean"]
    assert validate_arguments(SCHEMA, dict(GOOD_ARGS, gift=False)) == []


def test_a_value_outside_the_enum_is_reported():
    assert validate_arguments(SCHEMA, dict(GOOD_ARGS, speed="overnight")) == [
        'speed: must be one of "standard", "express"']


def test_an_enum_does_not_confuse_true_with_one():
    schema = {"type": "object", "properties": {"n": {"type": "integer", "enum": [1, 2]}}}
    assert validate_arguments(schema, {"n": 1}) == []
    assert validate_arguments(schema, {"n": True}) == ["n: expected integer"]
    flags = {"type": "object", "properties": {"b": {"type": "boolean", "enum": [True]}}}
    assert validate_arguments(flags, {"b": False}) == ["b: must be one of true"]


def test_errors_in_nested_objects_and_array_items_name_their_path():
    args = {"address": {"zip": 69001}, "items": [{"sku": "A1"}, {"count": 1}, "A3"]}
    assert validate_arguments(SCHEMA, args) == [
        "address.city: is required",
        "address.zip: expected string",
        "items[1].sku: is required",
        "items[2]: expected object",
    ]


def test_a_wrongly_typed_container_is_reported_once():
    assert validate_arguments(SCHEMA, {"address": "Lyon", "items": {"sku": "A1"}}) == [
        "address: expected object", "items: expected array"]


def test_arguments_for_a_tool_without_parameters_only_need_to_be_an_object():
    schema = tool("open_cart").input_schema
    assert validate_arguments(schema, {}) == []
    assert validate_arguments(schema, {"anything": [1, 2]}) == []


# --- the tool surface ---------------------------------------------------------------------------------


def surface():
    server = [tool("search", "server"), tool("add_to_cart", "server", "high")]
    client = [tool("zoom"), tool("add_to_cart", description="client copy"), tool("back")]
    return ToolSurface.build(server, client)


def test_a_client_tool_named_like_a_server_tool_is_shadowed():
    s = surface()
    assert [t.name for t in s.effective] == ["search", "add_to_cart", "zoom", "back"]
    assert [t.name for t in s.ignored] == ["add_to_cart"]
    assert s.ignored[0].description == "client copy"
    assert s.get("add_to_cart").origin == "server"


def test_get_finds_effective_tools_only():
    s = surface()
    assert s.get("zoom").origin == "client"
    assert s.get("missing") is None


def test_the_tools_effective_event_lists_every_group():
    data = surface().to_event_data()
    names = {key: [t["name"] for t in value] for key, value in data.items()}
    assert names == {
        "effectiveTools": ["search", "add_to_cart", "zoom", "back"],
        "serverTools": ["search", "add_to_cart"],
        "clientTools": ["zoom", "add_to_cart", "back"],
        "ignoredClientTools": ["add_to_cart"],
    }
    assert data["effectiveTools"][1] == {"name": "add_to_cart", "description": "add_to_cart tool",
                                         "risk": "high"}
    assert data["ignoredClientTools"][0]["description"] == "client copy"


SURFACES = {
    "server and client, one shadowed": surface,
    "server and client, none shadowed": lambda: ToolSurface.build(
        [tool("search", "server")], [parse_tool(ADD_TO_CART), tool("zoom", description="zoom ünï 😀")]),
    "server only": lambda: ToolSurface.build([tool("search", "server")], []),
    "client only": lambda: ToolSurface.build([], [parse_tool(ADD_TO_CART), tool("back")]),
    "none": lambda: ToolSurface.build([], []),
}


@pytest.mark.parametrize("build", SURFACES.values(), ids=SURFACES.keys())
def test_the_client_tools_json_is_the_events_client_tools_written_once_per_surface(build):
    s = build()
    assert json.loads(s.client_tools_json) == s.to_event_data()["clientTools"]
    assert s.client_tools_json == p.compact_json([t.wire for t in s.client_tools])
    assert s.client_tools_json is s.client_tools_json


@pytest.mark.parametrize("build", SURFACES.values(), ids=SURFACES.keys())
def test_a_tools_effective_frame_carries_the_surfaces_event_data(build):
    s = build()
    event = p.system_event("tools_effective", data=s.to_event_data())
    assert json.loads(p.serialize(event))["payload"]["data"] == s.to_event_data()


def test_a_tools_effective_frame_with_a_lone_surrogate_is_written_escaped():
    lone = ToolSpec(name="odd", description="half \ud83d", parameters=None, risk=Risk.NONE,
                    origin="server")
    s = ToolSurface.build([lone], [])
    text = p.serialize(p.system_event("tools_effective", data=s.to_event_data()))
    text.encode("utf-8")
    assert "\\ud83d" in text


def test_model_tools_are_server_then_client_each_sorted_with_one_cache_breakpoint():
    tools = surface().anthropic_tools()
    assert [t["name"] for t in tools] == ["add_to_cart", "search", "back", "zoom"]
    assert tools[0]["description"] == "add_to_cart tool"
    assert [("cache_control" in t) for t in tools] == [False, False, False, True]
    assert tools[-1]["cache_control"] == {"type": "ephemeral"}


def test_model_tools_do_not_depend_on_declaration_order():
    server = [tool("search", "server"), tool("lookup", "server")]
    client = [parse_tool(ADD_TO_CART), tool("zoom"), tool("back")]
    outputs = {
        canonical_json(ToolSurface.build(s, c).anthropic_tools())
        for s in itertools.permutations(server) for c in itertools.permutations(client)
    }
    assert len(outputs) == 1


def test_model_tools_are_fresh_each_time():
    s = surface()
    first = s.anthropic_tools()
    first[0]["input_schema"]["properties"]["x"] = {"type": "string"}
    assert s.anthropic_tools()[0]["input_schema"] == {"type": "object", "properties": {}}
    assert "cache_control" not in s.anthropic_tools()[0]


def test_an_empty_surface_offers_no_tools():
    empty = ToolSurface.build([], [])
    assert empty.anthropic_tools() == []
    assert empty.to_event_data() == {"effectiveTools": [], "serverTools": [], "clientTools": [],
                                     "ignoredClientTools": []}


def test_a_surface_refuses_duplicate_names_within_a_group():
    with pytest.raises(ToolError):
        ToolSurface.build([tool("a", "server"), tool("a", "server")], [])
    with pytest.raises(ToolError):
        ToolSurface.build([], [tool("a"), tool("a")])


def test_a_surface_keeps_its_tools_as_tuples():
    s = ToolSurface.build(iter([tool("a", "server")]), [tool("b")])
    assert isinstance(s.server_tools, tuple) and isinstance(s.client_tools, tuple)
    assert isinstance(s.effective, tuple) and isinstance(s.ignored, tuple)


# --- hashing ----------------------------------------------------------------------------------------------


def test_canonical_json_sorts_keys_and_keeps_unicode():
    assert canonical_json({"b": 1, "a": {"é": [1, 2]}}) == '{"a":{"é":[1,2]},"b":1}'


def test_args_hash_ignores_key_order_but_not_values():
    one = args_hash("add_to_cart", {"quantity": 2, "color": "red"})
    assert one == args_hash("add_to_cart", {"color": "red", "quantity": 2})
    assert one != args_hash("add_to_cart", {"quantity": 3, "color": "red"})
    assert one != args_hash("remove_from_cart", {"quantity": 2, "color": "red"})


def test_args_hash_is_the_sha256_of_the_canonical_call():
    expected = hashlib.sha256(b'{"args":{"q":2},"name":"t"}').hexdigest()
    assert args_hash("t", {"q": 2}) == expected


def test_a_tool_spec_is_immutable():
    spec = parse_tool(ADD_TO_CART)
    with pytest.raises(AttributeError):
        spec.risk = Risk.NONE
    assert isinstance(spec, ToolSpec)
