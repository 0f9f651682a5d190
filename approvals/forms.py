"""The operator's forms, shared by the approvals admin and the live session page."""
from __future__ import annotations

from django import forms
from django.contrib import messages

from approvals import services

MAX_NOTE_CHARS = 2000


class DecisionForm(forms.Form):
    decision = forms.ChoiceField(choices=[("approve", "Approve"), ("deny", "Deny")])
    note = forms.CharField(required=False, max_length=MAX_NOTE_CHARS, widget=forms.Textarea)


class ReviewForm(forms.Form):
    verdict = forms.ChoiceField(choices=[("ok", "OK"), ("concern", "Concern")])
    note = forms.CharField(required=False, max_length=MAX_NOTE_CHARS, widget=forms.Textarea)


def decide_from_post(request, approval) -> None:
    """An operator's Approve / Deny form, decided through the one service the
    page path uses too; the outcome is told as a message."""
    form = DecisionForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Not recorded: choose approve or deny.")
        return
    approved = form.cleaned_data["decision"] == "approve"
    try:
        approval = services.approval_decide_operator(
            approval_id=approval.pk, user=request.user, approved=approved,
            note=form.cleaned_data["note"], channel="admin",
        )
    except services.ApprovalError as exc:
        messages.error(request, f"Not recorded: {exc.message}.")
    else:
        messages.success(request, decision_sentence(approval, approved=approved))


def decision_sentence(approval, *, approved: bool) -> str:
    """What an operator's decision did, in a sentence."""
    tool = approval.tool_name
    if not approved:
        return f"Denied: {tool} will not run, and the agent is told an operator declined it."
    if approval.status == approval.Status.APPROVED:
        return f"Approved: {tool} runs now."
    if approval.is_pending:
        return f"Your approval of {tool} is recorded; the page user still has to approve it."
    return f"Your approval of {tool} is recorded; the call had already ended ({approval.get_status_display().lower()})."
