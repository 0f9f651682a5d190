"""DemoOrder moves here from the approvals app. The table approvals created
(approvals_demoorder) is kept as it is: only Django's idea of who owns it
changes, so existing orders stay."""
import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('aitp', '0001_initial'),
        ('approvals', '0004_demo_order_moves_to_demo'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='DemoOrder',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('number', models.CharField(max_length=32)),
                        ('status', models.CharField(choices=[('pending', 'Pending'), ('paid', 'Paid'), ('shipped', 'Shipped'), ('delivered', 'Delivered'), ('cancelled', 'Cancelled')], default='pending', max_length=16)),
                        ('items', models.JSONField(blank=True, default=list)),
                        ('total', models.DecimalField(decimal_places=2, default=0, max_digits=10)),
                        ('updated_at', models.DateTimeField(auto_now=True)),
                        ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='demo_orders', to='aitp.tenant')),
                    ],
                    options={
                        'db_table': 'approvals_demoorder',
                        'ordering': ['tenant', 'number'],
                        'constraints': [models.UniqueConstraint(fields=('tenant', 'number'), name='uniq_demoorder_tenant_number')],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
