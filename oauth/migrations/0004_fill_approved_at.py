from django.db import migrations
from django.db.models import Exists, F, OuterRef


def fill(apps, schema_editor):
    # A client that holds a grant or a refresh token was approved by someone;
    # without this, dynamic registrations made before the expiry rule existed
    # would expire a day after their registration, in use or not.
    Application = apps.get_model("oauth", "Application")
    Grant = apps.get_model("oauth", "Grant")
    RefreshToken = apps.get_model("oauth", "RefreshToken")
    Application.objects.filter(approved_at__isnull=True).filter(
        Exists(Grant.objects.filter(application=OuterRef("pk")))
        | Exists(RefreshToken.objects.filter(application=OuterRef("pk")))
    ).update(approved_at=F("created"))


class Migration(migrations.Migration):
    dependencies = [
        ("oauth", "0003_registrations"),
    ]

    operations = [
        migrations.RunPython(fill, migrations.RunPython.noop),
    ]
