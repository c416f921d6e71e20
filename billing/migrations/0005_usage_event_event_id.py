from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0004_usage_event_filter_indexes"),
    ]

    operations = [
        migrations.AddField(
            model_name="usageevent",
            name="event_id",
            field=models.UUIDField(blank=True, editable=False, null=True, unique=True),
        ),
    ]
