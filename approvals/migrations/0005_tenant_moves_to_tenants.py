"""Tenant now belongs to the tenants app; the foreign keys point at the same
table (aitp_tenant), so nothing changes in the database."""
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("approvals", "0004_demo_order_moves_to_demo"),
        ("tenants", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="approval",
                    name="tenant",
                    field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="approvals", to="tenants.tenant"),
                ),
                migrations.AlterField(
                    model_name="auditevent",
                    name="tenant",
                    field=models.ForeignKey(db_constraint=False, on_delete=django.db.models.deletion.DO_NOTHING, related_name="+", to="tenants.tenant"),
                ),
                migrations.AlterField(
                    model_name="servertool",
                    name="tenant",
                    field=models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="server_tools", to="tenants.tenant"),
                ),
            ],
            database_operations=[],
        ),
    ]
