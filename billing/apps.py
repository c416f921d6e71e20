from django.apps import AppConfig


class BillingConfig(AppConfig):
    name = "billing"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from accounts import holdings
        from billing import services, usage
        from core import usage as events

        # Apps below billing hand their usage events to its recorder.
        events.install(usage.get_recorder)
        holdings.register("usage events", services.count_usage_events)
        holdings.register("subscriptions", services.count_subscriptions)
