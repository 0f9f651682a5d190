"""A tool declaration goes on the wire from one shared copy per spec
(``ToolSpec.wire``): the tools_effective event and the session row serialize
it as it is, and whoever asks for ``to_wire()`` gets a copy of their own."""
from __future__ import annotations

import copy
import json

from aitp.tools import ToolSurface, json_copy, parse_client_tools, parse_tool
from tests.aitp.conftest import ADD_TO_CART


def test_changing_a_wire_copy_changes_neither_the_spec_nor_the_next_copy():
    spec = parse_tool(ADD_TO_CART)
    wire = spec.to_wire()
    wire["parameters"]["properties"].clear()
    wire["parameters"]["required"].append("x")
    wire["name"] = "changed"

    assert spec.to_wire() == ADD_TO_CART
    assert spec.wire == ADD_TO_CART
    assert spec.parameters == ADD_TO_CART["parameters"]


def test_a_spec_does_not_share_its_schema_with_the_frame_it_came_in():
    declared = copy.deepcopy(ADD_TO_CART)
    spec = parse_tool(declared)
    declared["parameters"]["properties"]["quantity"]["type"] = "STRING"

    assert spec.wire == ADD_TO_CART


def test_the_tools_effective_event_carries_each_declaration_as_sent():
    client = parse_client_tools([ADD_TO_CART, {"name": "zoom", "description": "Zoom in"}])
    data = ToolSurface.build((), client).to_event_data()

    assert json.loads(json.dumps(data)) == {
        "effectiveTools": [ADD_TO_CART, {"name": "zoom", "description": "Zoom in", "risk": "none"}],
        "serverTools": [],
        "clientTools": [ADD_TO_CART, {"name": "zoom", "description": "Zoom in", "risk": "none"}],
        "ignoredClientTools": [],
    }


def test_a_json_copy_equals_the_tree_and_shares_no_container_with_it():
    tree = {"a": [1, 2.5, {"b": None, "c": True}], "d": "text", "e": {"f": []}}
    copied = json_copy(tree)

    assert copied == tree
    copied["a"][2]["b"] = "changed"
    copied["e"]["f"].append(1)
    assert tree == {"a": [1, 2.5, {"b": None, "c": True}], "d": "text", "e": {"f": []}}


def test_a_json_copy_deep_copies_what_is_not_json():
    inner = {"x": 1}
    tree = {"set": {1, 2}, "tuple": (inner,)}
    copied = json_copy(tree)

    assert copied == tree
    assert copied["tuple"][0] is not inner
