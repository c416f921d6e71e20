from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0007_webhook_rejections"),
    ]

    operations = [
        migrations.AddField(
            model_name="billingaccount",
            name="mcpize_event_created",
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
