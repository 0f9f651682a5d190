"""The audit chain's keyed hashes and anchored checkpoints."""
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("approvals", "0005_tenant_moves_to_tenants"),
    ]

    operations = []
