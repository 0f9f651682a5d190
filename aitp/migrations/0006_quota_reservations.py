"""Model tokens reserved against a tenant's monthly quota while a request runs,
and the index that counts a tenant's live sessions against its ceiling."""
import django.db.models.deletion
import django.utils.timezone
from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("aitp", "0005_voice_audio_usage"),
    ]

    operations = [
        migrations.CreateModel(
            name="TokenReservation",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("tokens", models.PositiveBigIntegerField()),
                ("session_id", models.CharField(blank=True, default="", max_length=40)),
                ("process", models.CharField(blank=True, db_index=True, default="", max_length=100)),
                ("created_at", models.DateTimeField(default=django.utils.timezone.now)),
                ("expires_at", models.DateTimeField()),
                ("tenant", models.ForeignKey(
                    on_delete=django.db.models.deletion.CASCADE, related_name="token_reservations",
                    to="tenants.tenant")),
            ],
            options={"ordering": ["created_at"]},
        ),
        migrations.AddIndex(
            model_name="tokenreservation",
            index=models.Index(fields=["tenant", "expires_at"], name="reservation_tenant_idx"),
        ),
        migrations.AddIndex(
            model_name="session",
            index=models.Index(fields=["tenant", "ended_at"], name="session_tenant_live_idx"),
        ),
    ]
