"""How a key's widget looks and speaks (docs/widget.md, appearance).

A key's appearance is kept on its row (``ApiKey.widget_appearance``) as the
dict ``clean`` returns, and answered to the widget by
``GET /widget/appearance?key=...`` as ``public`` gives it. This module is the
one place that says what an appearance may hold:

- ``name``: the assistant's name in the panel's header, at most 40 characters
  (empty: the widget's own word, "Assistant");
- ``greeting``: the agent's first bubble, shown by the widget and never sent
  to the server, at most 300 characters (empty: none);
- ``accent``: the launcher's and header's colour, ``#rrggbb`` (empty: the
  widget's own colours, which follow the visitor's light or dark setting);
- ``position``: ``right`` or ``left``, the corner of the launcher;
- ``language``: ``en`` or ``fr``, of every sentence the widget says itself;
- ``prompts``: up to 4 suggested prompts, at most 80 characters each.

Django-free: the console's form, the key service and the endpoint all call it.
"""
from __future__ import annotations

import re
from collections.abc import Mapping

MAX_NAME = 40
MAX_GREETING = 300
MAX_PROMPT = 80
MAX_PROMPTS = 4
POSITIONS = ("right", "left")
LANGUAGES = {"en": "English", "fr": "Français"}
ACCENT = re.compile(r"^#[0-9a-fA-F]{6}$")
# Control characters (a line break aside, which a greeting may hold).
CONTROL = re.compile(r"[\x00-\x09\x0b-\x1f\x7f]")

DEFAULTS: dict[str, object] = {
    "name": "", "greeting": "", "accent": "", "position": "right", "language": "en", "prompts": [],
}
FIELDS = tuple(DEFAULTS)


class AppearanceError(ValueError):
    """An appearance that cannot be saved: field -> what is wrong, in words."""

    def __init__(self, errors: dict[str, str]):
        super().__init__("; ".join(f"{field}: {message}" for field, message in errors.items()))
        self.errors = errors


def _text(value: object, field: str, longest: int, errors: dict[str, str], *, lines: bool = False) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        errors[field] = "must be text."
        return ""
    text = value.replace("\r\n", "\n").strip()
    if len(text) > longest:
        errors[field] = f"at most {longest} characters (this one has {len(text)})."
    elif CONTROL.search(text) or ("\n" in text and not lines):
        errors[field] = "must be one line of plain text." if not lines else "must be plain text."
    return text


def _choice(value: object, field: str, allowed: tuple[str, ...], errors: dict[str, str]) -> str:
    if value in (None, ""):
        return str(DEFAULTS[field])
    if value not in allowed:
        errors[field] = "must be " + " or ".join(allowed) + "."
        return str(DEFAULTS[field])
    return str(value)


def _accent(value: object, errors: dict[str, str]) -> str:
    if value in (None, ""):
        return ""
    if not isinstance(value, str) or not ACCENT.match(value.strip()):
        errors["accent"] = "must be a colour written #rrggbb, like #1f5fd1."
        return ""
    return value.strip().lower()


def _prompts(value: object, errors: dict[str, str]) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        value = value.splitlines()
    if not isinstance(value, (list, tuple)):
        errors["prompts"] = "must be a list of short texts."
        return []
    prompts: list[str] = []
    for number, item in enumerate(value, start=1):
        text = _text(item, "prompts", MAX_PROMPT, errors)
        if "prompts" in errors:
            errors["prompts"] = f"prompt {number}: {errors['prompts']}"
            return []
        if text and text not in prompts:
            prompts.append(text)
    if len(prompts) > MAX_PROMPTS:
        errors["prompts"] = f"at most {MAX_PROMPTS} prompts (there are {len(prompts)})."
        return []
    return prompts


def clean(data: Mapping[str, object]) -> dict[str, object]:
    """The appearance to keep, every field present; AppearanceError naming
    each field that is wrong (or not a field of an appearance)."""
    errors: dict[str, str] = {}
    unknown = sorted(set(data) - set(FIELDS))
    if unknown:
        errors["__all__"] = "not a field of the appearance: " + ", ".join(unknown)
    cleaned: dict[str, object] = {
        "name": _text(data.get("name"), "name", MAX_NAME, errors),
        "greeting": _text(data.get("greeting"), "greeting", MAX_GREETING, errors, lines=True),
        "accent": _accent(data.get("accent"), errors),
        "position": _choice(data.get("position"), "position", POSITIONS, errors),
        "language": _choice(data.get("language"), "language", tuple(LANGUAGES), errors),
        "prompts": _prompts(data.get("prompts"), errors),
    }
    if errors:
        raise AppearanceError(errors)
    return cleaned


def public(stored: Mapping[str, object] | None) -> dict[str, object]:
    """What the widget is told: the stored appearance, the defaults for what
    is unset, nothing else. A stored value no longer valid gives its default."""
    result = clean({})
    for field in FIELDS:
        if stored and field in stored:
            try:
                result[field] = clean({field: stored[field]})[field]
            except AppearanceError:
                pass
    return result
