"""Tenant and TenantMembership now belong to the tenants app (the floor below
this one). The foreign keys point at the same table (aitp_tenant), so
nothing changes in the database; the other apps' keys are moved first."""
import django.db.models.deletion
from django.db import migrations, models


def tenant_fk(related_name):
    return models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name=related_name, to="tenants.tenant")


class Migration(migrations.Migration):

    dependencies = [
        ("aitp", "0003_tenant_token_quota"),
        ("tenants", "0001_initial"),
        ("approvals", "0005_tenant_moves_to_tenants"),
        ("demo", "0002_tenant_moves_to_tenants"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(model_name="apikey", name="tenant", field=tenant_fk("api_keys")),
                migrations.AlterField(model_name="session", name="tenant", field=tenant_fk("sessions")),
                migrations.AlterField(model_name="dailyusage", name="tenant", field=tenant_fk("daily_usage")),
                migrations.AlterField(model_name="operatoraction", name="tenant", field=tenant_fk("operator_actions")),
                migrations.DeleteModel(name="TenantMembership"),
                migrations.DeleteModel(name="Tenant"),
            ],
            database_operations=[],
        ),
    ]
