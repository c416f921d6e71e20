from django.db import migrations, models
from django.db.models.functions import Lower

# Guarantees: a user's agent names are unique whatever their case. Names are
# looked up ignoring case everywhere (the consent page, a trusted client's
# agent, imports), so "Claude" and "claude" made at the same moment used to
# both succeed, and which one a later lookup found was the scan's choice.
# Names that already differ only in case get the start of their id, the
# oldest keeping its own; agents is under forced row-level security, so only the operator
# role sees every user's rows.
RENAME = """
SET LOCAL ROLE recall_operator;
WITH ranked AS (
    SELECT id, name,
           row_number() OVER (
               PARTITION BY user_id, lower(name) ORDER BY created_at, id
           ) AS place
    FROM agents
)
UPDATE agents
SET name = left(ranked.name, 53) || ' (' || left(ranked.id::text, 8) || ')'
FROM ranked
WHERE agents.id = ranked.id AND ranked.place > 1;
RESET ROLE;
"""


class Migration(migrations.Migration):
    dependencies = [("accounts", "0005_agents")]

    operations = [
        migrations.RunSQL(RENAME, migrations.RunSQL.noop),
        migrations.RemoveConstraint(model_name="agent", name="agents_user_name_unique"),
        migrations.AddConstraint(
            model_name="agent",
            constraint=models.UniqueConstraint(
                "user", Lower("name"), name="agents_user_name_unique"
            ),
        ),
    ]
