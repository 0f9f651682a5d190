"""A tenant's own ceilings: live sessions and API keys.

Tenants that exist already get no ceiling (the columns are added empty);
new tenants get the defaults of OWLLAYER_DEFAULT_TENANT_SESSION_CAP and
OWLLAYER_DEFAULT_TENANT_KEY_CAP.
"""
import django.core.validators
from django.db import migrations, models

import tenants.models


def ceiling(verbose_name: str, help_text: str, default=None) -> models.PositiveIntegerField:
    extra = {} if default is None else {"default": default}
    return models.PositiveIntegerField(
        verbose_name, null=True, blank=True, help_text=help_text,
        validators=[django.core.validators.MinValueValidator(1)], **extra,
    )


SESSIONS_HELP = ("Live sessions this tenant may hold at once, over all its keys; one more is "
                 "refused (tenant_session_limit). Empty means no ceiling.")
KEYS_HELP = ("API keys this tenant may hold (active or disabled; revoked keys do not count); "
             "one more is refused. Empty means no ceiling.")


class Migration(migrations.Migration):

    dependencies = [
        ("tenants", "0001_initial"),
    ]

    operations = [
        # Added empty: the tenants there are keep what they could do.
        migrations.AddField("tenant", "max_sessions", ceiling("live session ceiling", SESSIONS_HELP)),
        migrations.AddField("tenant", "max_keys", ceiling("key ceiling", KEYS_HELP)),
        # Then the defaults, for the tenants made from now on.
        migrations.AlterField("tenant", "max_sessions", ceiling(
            "live session ceiling", SESSIONS_HELP, tenants.models.default_session_ceiling)),
        migrations.AlterField("tenant", "max_keys", ceiling(
            "key ceiling", KEYS_HELP, tenants.models.default_key_ceiling)),
    ]
