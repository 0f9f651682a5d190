from django.db import migrations


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('aitp', '0001_initial'),
    ]

    operations = [
        migrations.CreateModel(
            name='LiveSession',
            fields=[
            ],
            options={
                'verbose_name': 'live session',
                'verbose_name_plural': 'live sessions',
                'proxy': True,
                'default_permissions': (),
                'indexes': [],
                'constraints': [],
            },
            bases=('aitp.session',),
        ),
    ]
