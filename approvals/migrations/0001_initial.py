
import approvals.models
import django.core.validators
import django.db.models.deletion
import django.utils.timezone
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('aitp', '0001_initial'),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name='AuditChainHead',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('last_seq', models.PositiveBigIntegerField(default=0)),
                ('last_hash', models.CharField(default='0000000000000000000000000000000000000000000000000000000000000000', max_length=64)),
            ],
            options={
                'default_permissions': (),
            },
        ),
        migrations.CreateModel(
            name='Approval',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('tool_name', models.CharField(max_length=64)),
                ('arguments', models.JSONField(default=dict)),
                ('args_hash', models.CharField(max_length=64)),
                ('risk', models.CharField(choices=[('none', 'None'), ('low', 'Low'), ('high', 'High'), ('critical', 'Critical')], max_length=16)),
                ('origin', models.CharField(choices=[('client', 'Interface (page)'), ('server', 'Server')], max_length=16)),
                ('policy', models.CharField(choices=[('user', 'The page user'), ('operator', 'An operator'), ('user_and_operator', 'The page user and an operator')], default='user', max_length=24)),
                ('message', models.TextField(blank=True, default='')),
                ('status', models.CharField(choices=[('pending', 'Pending'), ('approved', 'Approved'), ('denied', 'Denied'), ('expired', 'Expired'), ('cancelled', 'Cancelled'), ('disconnected', 'Client disconnected')], default='pending', max_length=16)),
                ('needs_user', models.BooleanField(default=True)),
                ('needs_operator', models.BooleanField(default=False)),
                ('user_decision', models.CharField(blank=True, choices=[('approved', 'Approved'), ('denied', 'Denied')], max_length=16, null=True)),
                ('user_decided_at', models.DateTimeField(blank=True, null=True)),
                ('operator_decision', models.CharField(blank=True, choices=[('approved', 'Approved'), ('denied', 'Denied')], max_length=16, null=True)),
                ('operator_note', models.TextField(blank=True, default='')),
                ('operator_decided_at', models.DateTimeField(blank=True, null=True)),
                ('deadline', models.DateTimeField()),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('decided_at', models.DateTimeField(blank=True, null=True)),
                ('review_status', models.CharField(choices=[('unreviewed', 'Unreviewed'), ('reviewed', 'Reviewed')], default='unreviewed', max_length=16)),
                ('review_verdict', models.CharField(blank=True, choices=[('', '-'), ('ok', 'OK'), ('concern', 'Concern')], default='', max_length=16)),
                ('review_note', models.TextField(blank=True, default='')),
                ('reviewed_at', models.DateTimeField(blank=True, null=True)),
                ('operator', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='approval_decisions', to=settings.AUTH_USER_MODEL)),
                ('reviewed_by', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL, related_name='approval_reviews', to=settings.AUTH_USER_MODEL)),
                ('session', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='approvals', to='aitp.session')),
                ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='approvals', to='aitp.tenant')),
                ('tool_call', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='approval', to='aitp.toolcall')),
            ],
            options={
                'ordering': ['-created_at'],
            },
        ),
        migrations.CreateModel(
            name='PendingApproval',
            fields=[
            ],
            options={
                'verbose_name': 'pending approval',
                'verbose_name_plural': 'pending approvals (operator)',
                'proxy': True,
                'indexes': [],
                'constraints': [],
            },
            bases=('approvals.approval',),
        ),
        migrations.CreateModel(
            name='ReviewedApproval',
            fields=[
            ],
            options={
                'verbose_name': 'approval to review',
                'verbose_name_plural': 'review queue',
                'proxy': True,
                'indexes': [],
                'constraints': [],
            },
            bases=('approvals.approval',),
        ),
        migrations.CreateModel(
            name='AuditEvent',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('seq', models.PositiveBigIntegerField(unique=True)),
                ('session_id', models.CharField(blank=True, default='', max_length=40)),
                ('call_id', models.CharField(blank=True, default='', max_length=64)),
                ('action', models.CharField(choices=[('requested', 'Requested'), ('extended', 'Extended'), ('mismatch', 'Arguments mismatch'), ('approved', 'Approved'), ('denied', 'Denied'), ('expired', 'Expired'), ('cancelled', 'Cancelled'), ('disconnected', 'Disconnected'), ('executed', 'Executed'), ('failed', 'Failed'), ('reviewed', 'Reviewed')], max_length=16)),
                ('actor_kind', models.CharField(choices=[('page', 'Page user'), ('operator', 'Operator'), ('system', 'System')], max_length=16)),
                ('actor', models.CharField(blank=True, default='', max_length=150)),
                ('channel', models.CharField(choices=[('page', 'Page'), ('admin', 'Admin'), ('console', 'Console'), ('system', 'System')], max_length=16)),
                ('args_hash', models.CharField(blank=True, default='', max_length=64)),
                ('data', models.JSONField(blank=True, default=dict)),
                ('created_at', models.DateTimeField()),
                ('prev_hash', models.CharField(max_length=64)),
                ('hash', models.CharField(max_length=64)),
                ('approval', models.ForeignKey(blank=True, db_constraint=False, null=True, on_delete=django.db.models.deletion.DO_NOTHING, related_name='audit_events', to='approvals.approval')),
                ('tenant', models.ForeignKey(db_constraint=False, on_delete=django.db.models.deletion.DO_NOTHING, related_name='+', to='aitp.tenant')),
            ],
            options={
                'ordering': ['seq'],
                'default_permissions': ('view',),
            },
        ),
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
                'ordering': ['tenant', 'number'],
            },
        ),
        migrations.CreateModel(
            name='ServerTool',
            fields=[
                ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                ('name', models.CharField(max_length=64, validators=[django.core.validators.RegexValidator('^[a-zA-Z0-9_-]{1,64}$', 'letters, digits, _ and - only (1-64)')])),
                ('description', models.TextField(blank=True, default='')),
                ('parameters', models.JSONField(blank=True, help_text='AITP schema with upper-case types, e.g. {"type": "OBJECT", "properties": {...}}.', null=True)),
                ('risk', models.CharField(choices=[('none', 'None'), ('low', 'Low'), ('high', 'High'), ('critical', 'Critical')], default='none', max_length=16)),
                ('kind', models.CharField(choices=[('webhook', 'Webhook'), ('python', 'Python (built in)')], default='webhook', max_length=16)),
                ('webhook_url', models.CharField(blank=True, default='', max_length=2000, validators=[django.core.validators.URLValidator(schemes=['http', 'https'])])),
                ('webhook_secret', models.CharField(default=approvals.models.generate_webhook_secret, max_length=128)),
                ('timeout_seconds', models.FloatField(default=approvals.models.default_webhook_timeout)),
                ('python_handler', models.CharField(blank=True, default='', max_length=64)),
                ('approval_policy', models.CharField(choices=[('user', 'The page user'), ('operator', 'An operator'), ('user_and_operator', 'The page user and an operator')], default='user', max_length=24)),
                ('enabled', models.BooleanField(default=True)),
                ('created_at', models.DateTimeField(default=django.utils.timezone.now)),
                ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='server_tools', to='aitp.tenant')),
            ],
            options={
                'ordering': ['tenant', 'name'],
            },
        ),
        migrations.AddIndex(
            model_name='approval',
            index=models.Index(fields=['status', 'needs_operator'], name='approval_status_op_idx'),
        ),
        migrations.AddIndex(
            model_name='approval',
            index=models.Index(fields=['tenant', 'created_at'], name='approval_tenant_created_idx'),
        ),
        migrations.AddConstraint(
            model_name='demoorder',
            constraint=models.UniqueConstraint(fields=('tenant', 'number'), name='uniq_demoorder_tenant_number'),
        ),
        migrations.AddConstraint(
            model_name='servertool',
            constraint=models.UniqueConstraint(fields=('tenant', 'name'), name='uniq_servertool_tenant_name'),
        ),
    ]
