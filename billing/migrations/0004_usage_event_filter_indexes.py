import django.db.models.deletion
from django.conf import settings
from django.contrib.postgres.operations import AddIndexConcurrently
from django.db import migrations, models

# The indexes the admin's usage list, filters and CSV export need (see the
# comments on UsageEvent.Meta). Built CONCURRENTLY, outside a transaction, so
# that on a table of millions of rows the usage recorder keeps inserting while
# they build. Then the foreign key's own index on user_id goes: the
# (user_id, occurred_at) index serves every lookup it did, and each index on
# this table costs a write per tool call.


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("billing", "0003_billing_state"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        AddIndexConcurrently(
            model_name="usageevent",
            index=models.Index(fields=["occurred_at", "id"], name="usage_events_time_idx"),
        ),
        AddIndexConcurrently(
            model_name="usageevent",
            index=models.Index(fields=["tool_name", "occurred_at"], name="usage_events_tool_time_idx"),
        ),
        AddIndexConcurrently(
            model_name="usageevent",
            index=models.Index(
                condition=models.Q(("error_code__isnull", False)),
                fields=["error_code", "occurred_at"],
                name="usage_events_error_time_idx",
            ),
        ),
        AddIndexConcurrently(
            model_name="usageevent",
            index=models.Index(
                condition=models.Q(("success", False)),
                fields=["occurred_at"],
                name="usage_events_failed_time_idx",
            ),
        ),
        migrations.AlterField(
            model_name="usageevent",
            name="user",
            field=models.ForeignKey(db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name="+", to=settings.AUTH_USER_MODEL),
        ),
    ]
