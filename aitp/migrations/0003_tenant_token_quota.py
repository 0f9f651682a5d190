from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ("aitp", "0002_session_process"),
    ]

    operations = [
        migrations.AddField(
            model_name="tenant",
            name="monthly_token_quota",
            field=models.PositiveBigIntegerField(
                blank=True,
                null=True,
                help_text="Model tokens (input + output) this tenant may use per calendar month; "
                "empty or 0 means unlimited. Once used up, new sessions and turns are refused.",
            ),
        ),
    ]
