import django.db.models.deletion
import django.db.models.functions.datetime
from django.conf import settings
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("accounts", "0002_database_roles"),
        ("billing", "0002_row_level_security"),
        migrations.swappable_dependency(settings.AUTH_USER_MODEL),
    ]

    operations = [
        migrations.CreateModel(
            name="BillingAccount",
            fields=[
                ("user", models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, primary_key=True, related_name="billing", serialize=False, to=settings.AUTH_USER_MODEL)),
                ("stripe_customer_id", models.CharField(blank=True, max_length=255, null=True, unique=True)),
                ("created_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
                ("updated_at", models.DateTimeField(auto_now=True)),
            ],
            options={"db_table": "billing_accounts"},
        ),
        migrations.CreateModel(
            name="Subscription",
            fields=[
                ("id", models.CharField(max_length=255, primary_key=True, serialize=False)),
                ("customer_id", models.CharField(max_length=255)),
                ("user", models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name="subscriptions", to=settings.AUTH_USER_MODEL)),
                ("status", models.CharField(max_length=32)),
                ("price_id", models.CharField(blank=True, max_length=255)),
                ("event_id", models.CharField(max_length=255)),
                ("event_created", models.DateTimeField()),
                ("updated_at", models.DateTimeField(auto_now=True)),
            ],
            options={
                "db_table": "billing_subscriptions",
                "indexes": [models.Index(fields=["customer_id"], name="billing_subs_customer_idx")],
            },
        ),
        migrations.CreateModel(
            name="WebhookEvent",
            fields=[
                ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                ("source", models.CharField(choices=[("stripe", "Stripe"), ("mcpize", "MCPize")], max_length=16)),
                ("event_id", models.CharField(max_length=255)),
                ("event_type", models.CharField(blank=True, max_length=100)),
                ("received_at", models.DateTimeField(db_default=django.db.models.functions.datetime.Now())),
            ],
            options={
                "db_table": "billing_webhook_events",
                "constraints": [models.UniqueConstraint(fields=("source", "event_id"), name="billing_webhook_once")],
            },
        ),
    ]
