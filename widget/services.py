"""Writing a key's widget appearance (docs/widget.md, appearance).

The one way the console changes it: checked by widget.appearance, then
written and recorded by the key service as any other change of a key
(``aitp.tenancy.key_update``: an OperatorAction ``key_updated`` naming who did
it and the whole new appearance).
"""
from __future__ import annotations

from aitp import tenancy
from aitp.models import ApiKey
from widget import appearance


def key_set_appearance(*, key: ApiKey, look: dict, by=None) -> bool:
    """Keep ``look`` as the key's appearance; False when it is the one the
    widget already gets (saving the defaults on a key without any is no
    change). AppearanceError (a ValueError) names each field that is wrong;
    ValueError for a revoked key, which is never changed."""
    cleaned = appearance.clean(look)
    if key.status == ApiKey.Status.REVOKED:
        raise ValueError("a revoked key cannot be changed")
    if cleaned == appearance.public(key.widget_appearance):
        return False
    tenancy.key_update(key=key, changes={"widget_appearance": cleaned}, by=by)
    return True
