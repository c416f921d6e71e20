from django.apps import AppConfig


class MemoriesConfig(AppConfig):
    name = "memories"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from accounts import holdings
        from memories import services

        holdings.register(
            "memories",
            services.count_memories,
            services.memories_per_user,
            before_agent_deleted=services.hold_agents_memories,
            before_users_deleted=services.hold_users_memories,
        )

        from memories.importers import job

        services.runs("import", job.run_taken)
