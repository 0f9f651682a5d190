"""What an operator may post from the session page."""
from __future__ import annotations

from urllib.parse import urlsplit

from django import forms

from aitp.services import SESSION_COMMANDS
from operators.handover import MAX_ARGUMENTS_CHARS, MAX_TEXT_CHARS

MAX_MESSAGE_CHARS = 500
MAX_URL_CHARS = 2000


def redirect_target_error(url: str) -> str | None:
    """Why a page may not be sent to ``url``, or None. The page navigates to
    it, so only a path on the page's own site or an http(s) address will do
    (never javascript: or data:)."""
    if any(ch.isspace() or ord(ch) < 32 for ch in url):
        return "the url may not contain spaces or control characters"
    if url.startswith("/") and not url.startswith("//"):
        return None
    parts = urlsplit(url)
    if parts.scheme in ("http", "https") and parts.netloc:
        return None
    return "use a path starting with / or an http(s) url"


class SessionCommandForm(forms.Form):
    command = forms.ChoiceField(choices=[(c, c) for c in SESSION_COMMANDS])
    url = forms.CharField(required=False, max_length=MAX_URL_CHARS, strip=True)
    message = forms.CharField(required=False, max_length=MAX_MESSAGE_CHARS, strip=True)

    def clean(self):
        data = super().clean()
        if data.get("command") == "redirect":
            url = data.get("url") or ""
            if not url:
                self.add_error("url", "a redirect needs a url")
            elif (error := redirect_target_error(url)) is not None:
                self.add_error("url", error)
        else:
            # Only a redirect carries a url; never record one that was not used.
            data["url"] = ""
        return data


class OperatorMessageForm(forms.Form):
    """The words of the operator in charge, to the page user."""

    text = forms.CharField(max_length=MAX_TEXT_CHARS, strip=True, error_messages={
        "required": "write a message first",
        "max_length": "a message has at most %(limit_value)d characters",
    })


class HandBackForm(forms.Form):
    """What the agent is told as it takes the chat back (optional)."""

    note = forms.CharField(required=False, max_length=MAX_TEXT_CHARS, strip=True, error_messages={
        "max_length": "a note has at most %(limit_value)d characters",
    })


class OperatorToolForm(forms.Form):
    """A page tool the operator in charge runs, and its arguments (a JSON
    object; empty for none). ``tools``: the names the page offers for it."""

    tool = forms.ChoiceField(error_messages={"invalid_choice": "the page offers no such tool to run"})
    arguments = forms.JSONField(required=False, max_length=MAX_ARGUMENTS_CHARS, error_messages={
        "invalid": "the arguments are not JSON",
    })

    def __init__(self, *args, tools: list[str], **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["tool"].choices = [(name, name) for name in tools]

    def clean_arguments(self) -> dict:
        arguments = self.cleaned_data.get("arguments")
        if arguments in (None, ""):
            return {}
        if not isinstance(arguments, dict):
            raise forms.ValidationError("the arguments are a JSON object, e.g. {\"id\": \"p1\"}")
        return arguments
