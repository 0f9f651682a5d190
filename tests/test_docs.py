"""The README documents every setting the server reads from the environment."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def environment_variables_read_by_settings() -> set[str]:
    source = (ROOT / "owllayer_site" / "settings.py").read_text()
    names = set(re.findall(r'env_(?:str|bool|int|float|list|choice)\(\s*"([A-Z_]+)"', source))
    names |= set(re.findall(r'os\.environ\.get\(\s*"([A-Z_]+)"', source))
    return names


def test_the_settings_read_the_variables_this_check_expects():
    names = environment_variables_read_by_settings()
    assert {"DATABASE_URL", "REDIS_URL", "DJANGO_SECRET_KEY", "OWLLAYER_WS_PATH"} <= names


def test_the_readme_documents_every_environment_variable():
    readme = (ROOT / "README.md").read_text()
    missing = sorted(name for name in environment_variables_read_by_settings() if f"`{name}`" not in readme)
    assert missing == []


def test_the_readme_shows_the_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert "make run" in readme and "make test" in readme


# --- docs/protocol.md: every error code the server can send ------------------

import ast  # noqa: E402

PROTOCOL_DOC = ROOT / "docs" / "protocol.md"
# The packages whose code sends AITP frames to pages.
SENDING_PACKAGES = ("aitp", "approvals", "operators", "owllayer_site")
# Calls whose first argument (or code=) is an error code.
CODE_CALLS = {
    "error_event", "error", "refuse", "_invalid", "ProtocolError", "ToolError",
    "ApprovalError", "LlmError", "SpeechError", "Refusal",
}
# Tables of codes: the keys are the codes (LlmError, SpeechError and ApprovalError
# accept no other).
CODE_TABLES = {"ERROR_MESSAGES", "MESSAGES"}
CODE_SHAPE = re.compile(r"^[a-z]+(_[a-z]+)*$")


def _python_files():
    for package in SENDING_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" not in path.parts:
                yield path


def _string_constants(tree: ast.Module) -> dict[str, str]:
    found = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Constant):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                if isinstance(target, ast.Name) and isinstance(node.value.value, str):
                    found[target.id] = node.value.value
    return found


def error_codes_the_code_can_send() -> set[str]:
    trees = {path: ast.parse(path.read_text()) for path in _python_files()}
    constants: dict[str, str] = {}
    for tree in trees.values():
        constants.update(_string_constants(tree))
    codes: set[str] = set()

    def take(value: ast.expr) -> None:
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            codes.add(value.value)
        elif isinstance(value, ast.Name) and value.id in constants:
            codes.add(constants[value.id])
        elif isinstance(value, ast.Attribute) and value.attr in constants:
            codes.add(constants[value.attr])
        elif isinstance(value, ast.IfExp):
            take(value.body)
            take(value.orelse)

    for tree in trees.values():
        for node in ast.walk(tree):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
                if name in CODE_CALLS and node.args:
                    take(node.args[0])
                for keyword in node.keywords:
                    if keyword.arg == "code":
                        take(keyword.value)
            elif (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
                  and node.target.id == "code" and node.value is not None):
                take(node.value)  # an exception's default code
            if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                if any(isinstance(t, ast.Name) and t.id in CODE_TABLES for t in targets):
                    for key in node.value.keys:
                        if key is not None:
                            take(key)
    # Log lines and messages are sentences; codes are snake_case words.
    return {code for code in codes if CODE_SHAPE.match(code)}


def documented_error_codes() -> set[str]:
    return set(re.findall(r"^\| `([a-z_]+)` \|", PROTOCOL_DOC.read_text(), flags=re.MULTILINE))


def test_the_error_code_scan_finds_the_codes_of_every_layer():
    codes = error_codes_the_code_can_send()
    assert {
        "invalid_json", "handshake_required", "origin_not_allowed", "rate_limited",
        "too_many_frames", "usage_limit_exceeded", "invalid_tool", "approval_mismatch",
        "overloaded", "tool_timeout", "unknown_endpoint", "temporarily_unavailable",
        "speech_failed",
    } <= codes


def test_every_error_code_the_server_can_send_is_documented_in_the_protocol_reference():
    undocumented = sorted(error_codes_the_code_can_send() - documented_error_codes())
    assert undocumented == [], f"add these to the error code table of docs/protocol.md: {undocumented}"


def test_the_readme_points_to_the_protocol_reference_and_cites_no_file_outside_the_repository():
    readme = (ROOT / "README.md").read_text()
    assert "docs/protocol.md" in readme
    assert "aitp-spec.md" not in readme and "wire-compat.md" not in readme


def test_every_setting_the_protocol_reference_names_is_one_the_settings_read():
    named = set(re.findall(r"`(OWLLAYER_[A-Z_]+)`", PROTOCOL_DOC.read_text()))
    assert named and sorted(named - environment_variables_read_by_settings()) == []
