"""Model tokens reserved against a tenant's monthly quota while a request runs."""
from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ("aitp", "0005_voice_audio_usage"),
    ]

    operations = []
