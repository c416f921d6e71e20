from django.db import migrations, models

# Guarantee: JOB_MAX_ATTEMPTS bounds the runs that failed, as it says, not
# the runs whose worker died (0022's lost_runs, bounded on their own).
#
# The retry check compared attempts, which every run adds to, taken over or
# not: a long import that restarted three times failed on its first passing
# error, with no retry. failures counts the runs that queued the job again
# (Job.objects.retry_later, on the operator path). The database default lets
# servers of the previous release insert jobs during a rolling upgrade.


class Migration(migrations.Migration):
    dependencies = [("memories", "0022_job_lost_runs")]

    operations = [
        migrations.AddField(
            model_name="job",
            name="failures",
            field=models.PositiveSmallIntegerField(db_default=0),
        ),
    ]
