"""The audit chain's keyed hashes and anchored checkpoints."""
from django.db import migrations, models


def start_keyed_chain_after_existing_events(apps, schema_editor):
    # Events already stored keep their plain SHA-256 hashes (nothing is
    # re-hashed): the keyed chain starts with the next event, which links to
    # the last plain one. On a new database that is event #1.
    AuditChainHead = apps.get_model("approvals", "AuditChainHead")
    for head in AuditChainHead.objects.all():
        head.keyed_from = head.last_seq + 1
        head.save(update_fields=["keyed_from"])


class Migration(migrations.Migration):

    dependencies = [
        ("approvals", "0005_tenant_moves_to_tenants"),
    ]

    operations = [
        migrations.AddField(
            model_name="auditchainhead",
            name="keyed_from",
            field=models.PositiveBigIntegerField(default=1),
        ),
        migrations.AddField(
            model_name="auditevent",
            name="key_id",
            field=models.CharField(blank=True, default="", max_length=16),
        ),
        migrations.RunPython(start_keyed_chain_after_existing_events, migrations.RunPython.noop),
    ]
