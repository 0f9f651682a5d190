"""Tenant and TenantMembership move here from the protocol app (aitp). Their
tables (aitp_tenant, aitp_tenantmembership) stay as they are: only Django's
idea of who owns them changes, so no row moves. Their content types are
renamed with them, so permissions given on them and the admin's history stay."""
import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models

MOVED = ("tenant", "tenantmembership")


def rename_content_types(apps, schema_editor, old="aitp", new="tenants"):
    ContentType = apps.get_model("contenttypes", "ContentType")
    db = schema_editor.connection.alias
    for model in MOVED:
        if not ContentType.objects.using(db).filter(app_label=new, model=model).exists():
            ContentType.objects.using(db).filter(app_label=old, model=model).update(app_label=new)


def restore_content_types(apps, schema_editor):
    rename_content_types(apps, schema_editor, old="tenants", new="aitp")


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ("aitp", "0003_tenant_token_quota"),
        ("contenttypes", "0002_remove_content_type_name"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="Tenant",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        ("slug", models.SlugField(max_length=64, unique=True)),
                        ("name", models.CharField(max_length=200)),
                        ("system_prompt", models.TextField(blank=True, default="You are a helpful assistant embedded in this web site. Be concise.", help_text="Sent to the model at the start of every turn, before the page context.")),
                        ("monthly_token_quota", models.PositiveBigIntegerField(blank=True, help_text="Model tokens (input + output) this tenant may use per calendar month; empty or 0 means unlimited. Once used up, new sessions and turns are refused.", null=True)),
                        ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                    ],
                    options={
                        "db_table": "aitp_tenant",
                        "ordering": ["slug"],
                    },
                ),
                migrations.CreateModel(
                    name="TenantMembership",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        ("role", models.CharField(choices=[("owner", "Owner"), ("viewer", "Viewer")], default="viewer", max_length=16)),
                        ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                        ("tenant", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="memberships", to="tenants.tenant")),
                        ("user", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name="tenant_memberships", to=settings.AUTH_USER_MODEL)),
                    ],
                    options={
                        "db_table": "aitp_tenantmembership",
                        "constraints": [models.UniqueConstraint(fields=("tenant", "user"), name="uniq_membership_tenant_user")],
                    },
                ),
            ],
            database_operations=[],
        ),
        migrations.RunPython(rename_content_types, restore_content_types),
    ]
