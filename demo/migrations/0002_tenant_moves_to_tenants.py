"""Tenant now belongs to the tenants app; the order's foreign key points at
the same table (aitp_tenant), so nothing changes in the database."""
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("demo", "0001_initial"),
        ("tenants", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="demoorder",
                    name="tenant",
                    field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="demo_orders", to="tenants.tenant"),
                ),
            ],
            database_operations=[],
        ),
    ]
