"""A tenant's own ceilings: live sessions and API keys."""
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("tenants", "0001_initial"),
    ]

    operations = []
