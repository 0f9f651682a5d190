"""Invitations to a tenant, accepted by the person invited."""
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("tenants", "0002_tenant_ceilings"),
    ]

    operations = []
