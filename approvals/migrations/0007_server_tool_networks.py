"""Networks a server tool's webhook may reach although not public."""
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("approvals", "0006_audit_keyed_chain"),
    ]

    operations = []
