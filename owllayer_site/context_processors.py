"""What every page's template may show besides its own context."""
from __future__ import annotations

from runtime import model_access
from runtime.config import config


def model_access_problem(request) -> dict[str, object]:
    """``model_problem``: the admin's banner while this process finds the
    model refusing its key or unreachable (``runtime.model_access``), for
    staff only; None otherwise. One read of a module value per page."""
    access = model_access.current()
    user = getattr(request, "user", None)
    if not access.failing or not getattr(user, "is_staff", False):
        return {"model_problem": None}
    anthropic = config().llm.name == "anthropic"
    if access.state == model_access.REFUSED:
        text = ("The model API refuses this server's key"
                + (" (ANTHROPIC_API_KEY)" if anthropic else "")
                + ": every turn fails with auth_failed. "
                + ("Set ANTHROPIC_API_KEY to a valid key and restart the server."
                   if anthropic else "Correct the model backend's key and restart the server."))
    else:
        text = ("The model API cannot be reached from this server"
                + (" (ANTHROPIC_BASE_URL, or the network)" if anthropic else "")
                + ": turns fail until it answers.")
    return {"model_problem": {"state": access.state, "text": text, "detail": access.detail,
                              "since": access.since, "found_by": access.found_by}}
