from django.db import migrations, models

# Guarantee: a job that kills or hangs whatever runs it fails after
# queue.LOST_RUNS lost runs instead of being taken over for ever.
#
# attempts counts every run, those a passing error queued again included, so
# it cannot tell a job that keeps losing its worker from one that was unlucky.
# lost_runs counts only the runs whose lease ran out while they held the job:
# taking a job over adds one, and an import's saved progress (on the tenant
# path, hence the column grant) sets it back to 0. The database default lets
# servers of the previous release insert jobs during a rolling upgrade.
GRANT = "GRANT UPDATE (lost_runs) ON memory_jobs TO recall_app, recall_agent;"
REVOKE = "REVOKE UPDATE (lost_runs) ON memory_jobs FROM recall_app, recall_agent;"


class Migration(migrations.Migration):
    dependencies = [("memories", "0021_rank_previous_signature")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="lost_runs",
            field=models.PositiveSmallIntegerField(db_default=0),
        ),
        migrations.RunSQL(GRANT, REVOKE),
    ]
