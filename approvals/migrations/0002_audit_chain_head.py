from django.db import migrations


def create_chain_head(apps, schema_editor):
    # The single row every audit appender locks; it must exist before the
    # first append so two first appenders cannot both create it.
    AuditChainHead = apps.get_model("approvals", "AuditChainHead")
    AuditChainHead.objects.get_or_create(pk=1)


class Migration(migrations.Migration):

    dependencies = [("approvals", "0001_initial")]

    operations = [migrations.RunPython(create_chain_head, migrations.RunPython.noop)]
