"""DemoOrder now belongs to the demo app (demo/models.py); its table stays."""
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('approvals', '0003_policy_violation'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[migrations.DeleteModel(name='DemoOrder')],
            database_operations=[],
        ),
    ]
