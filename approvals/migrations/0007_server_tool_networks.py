"""Networks a server tool's webhook may reach although not public."""
from django.db import migrations, models

import approvals.models


class Migration(migrations.Migration):

    dependencies = [
        ("approvals", "0006_audit_keyed_chain"),
    ]

    operations = [
        migrations.AddField(
            model_name="servertool",
            name="webhook_networks",
            field=models.TextField(
                blank=True, default="",
                help_text="Networks this webhook may reach although not public, inside "
                          "OWLLAYER_WEBHOOK_ALLOWED_NETWORKS: one per line, each a network, "
                          "optionally with ports (10.20.0.0/16, 10.20.0.7:8443, "
                          "[fd00:1::/64]:443,8443).",
                validators=[approvals.models.validate_webhook_networks],
            ),
        ),
    ]
