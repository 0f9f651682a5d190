"""The documentation: every setting the server reads from the environment is
in docs/configuration.md, every error code the server can send is in
docs/protocol.md, and every relative link of the README and docs/ leads
somewhere that exists."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
CONFIGURATION_DOC = ROOT / "docs" / "configuration.md"


def environment_variables_read_by_settings() -> set[str]:
    source = (ROOT / "owllayer_site" / "settings.py").read_text()
    names = set(re.findall(r'env_(?:str|bool|int|float|list|choice)\(\s*"([A-Z_]+)"', source))
    names |= set(re.findall(r'os\.environ\.get\(\s*"([A-Z_]+)"', source))
    return names


def variables_in_the_configuration_tables() -> set[str]:
    """The names in the first column of docs/configuration.md's tables."""
    first_cells = re.findall(r"^\| (`[^|]+`) \|", CONFIGURATION_DOC.read_text(), flags=re.MULTILINE)
    return {name for cell in first_cells for name in re.findall(r"`([A-Z_]+)`", cell)}


def test_the_settings_read_the_variables_this_check_expects():
    names = environment_variables_read_by_settings()
    assert {"DATABASE_URL", "REDIS_URL", "DJANGO_SECRET_KEY", "OWLLAYER_WS_PATH"} <= names


def test_the_configuration_reference_has_a_table_row_for_every_environment_variable():
    missing = sorted(environment_variables_read_by_settings() - variables_in_the_configuration_tables())
    assert missing == [], f"add a row for these to docs/configuration.md: {missing}"


def test_the_readme_shows_the_two_commands_and_links_to_the_configuration_reference():
    readme = README.read_text()
    assert "make run" in readme and "make test" in readme
    assert "(docs/configuration.md)" in readme


# --- relative links of the README and docs/ ----------------------------------

LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchor(heading: str) -> str:
    """The anchor a Markdown renderer (GitHub's) gives a heading."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^a-z0-9 -]", "", text).replace(" ", "-")


def _anchors(document: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", document.read_text(), flags=re.DOTALL)
    return {_anchor(h) for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.MULTILINE)}


def _leads_nowhere(document: Path, target: str) -> bool:
    path, _, anchor = target.partition("#")
    resolved = (document.parent / path).resolve() if path else document
    if not resolved.exists():
        return True
    return bool(anchor) and resolved.suffix == ".md" and anchor not in _anchors(resolved)


def _broken_links(document: Path) -> list[str]:
    """Relative links (not http:, https: or mailto:) to a missing file or heading."""
    text = re.sub(r"```.*?```", "", document.read_text(), flags=re.DOTALL)
    return [target for target in LINK.findall(text)
            if not re.match(r"[a-z]+:", target) and _leads_nowhere(document, target)]


def documents() -> list[Path]:
    return [README, *sorted((ROOT / "docs").glob("*.md"))]


def test_the_link_check_sees_a_link_that_leads_nowhere(tmp_path):
    (tmp_path / "here.md").write_text("# Here\n\n[there](there.md) [fine](here.md#here) [gone](#nowhere)\n")
    assert _broken_links(tmp_path / "here.md") == ["there.md", "#nowhere"]


def test_every_relative_link_of_the_readme_and_docs_leads_to_a_file_and_heading_that_exist():
    broken = {doc.relative_to(ROOT).as_posix(): _broken_links(doc) for doc in documents()}
    assert {doc: links for doc, links in broken.items() if links} == {}


def test_the_readme_links_every_document_in_docs():
    readme = README.read_text()
    unlinked = [doc.name for doc in documents()[1:] if f"(docs/{doc.name})" not in readme]
    assert unlinked == []


# --- docs/protocol.md: every error code the server can send ------------------

import ast  # noqa: E402

PROTOCOL_DOC = ROOT / "docs" / "protocol.md"
# The packages whose code sends AITP frames to pages.
SENDING_PACKAGES = ("agent", "aitp", "approvals", "connection", "llm", "operators", "owllayer_site", "speech")
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


def _all_constants(trees) -> dict[str, str]:
    constants: dict[str, str] = {}
    for tree in trees:
        constants.update(_string_constants(tree))
    return constants


def _codes_of(value: ast.expr, constants: dict[str, str]) -> set[str]:
    """The strings an expression can be: a literal, a named constant, either
    branch of a conditional."""
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        return {value.value}
    if isinstance(value, ast.Name) and value.id in constants:
        return {constants[value.id]}
    if isinstance(value, ast.Attribute) and value.attr in constants:
        return {constants[value.attr]}
    if isinstance(value, ast.IfExp):
        return _codes_of(value.body, constants) | _codes_of(value.orelse, constants)
    return set()


def _code_expressions_of_a_call(node: ast.Call) -> list[ast.expr]:
    func = node.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    found = [node.args[0]] if name in CODE_CALLS and node.args else []
    return found + [keyword.value for keyword in node.keywords if keyword.arg == "code"]


def _assigned_names(node: ast.Assign | ast.AnnAssign) -> set[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return {target.id for target in targets if isinstance(target, ast.Name)}


def _code_expressions(node: ast.AST) -> list[ast.expr]:
    """Where in this node an error code can stand."""
    if isinstance(node, ast.Call):
        return _code_expressions_of_a_call(node)
    if not isinstance(node, (ast.Assign, ast.AnnAssign)) or node.value is None:
        return []
    if isinstance(node.value, ast.Dict) and _assigned_names(node) & CODE_TABLES:
        return [key for key in node.value.keys if key is not None]
    if isinstance(node, ast.AnnAssign) and _assigned_names(node) == {"code"}:
        return [node.value]  # an exception's default code
    return []


def error_codes_the_code_can_send() -> set[str]:
    trees = [ast.parse(path.read_text()) for path in _python_files()]
    constants = _all_constants(trees)
    codes = {
        code
        for tree in trees
        for node in ast.walk(tree)
        for expression in _code_expressions(node)
        for code in _codes_of(expression, constants)
    }
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


def test_the_readme_points_to_the_protocol_reference_and_no_document_cites_a_file_outside_the_repository():
    readme = README.read_text()
    assert "docs/protocol.md" in readme
    for document in documents():
        text = document.read_text()
        assert "aitp-spec.md" not in text and "wire-compat.md" not in text, document.name


def test_every_setting_the_protocol_reference_names_is_one_the_settings_read():
    named = set(re.findall(r"`(OWLLAYER_[A-Z_]+)`", PROTOCOL_DOC.read_text()))
    assert named and sorted(named - environment_variables_read_by_settings()) == []
