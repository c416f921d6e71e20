# A usage event outlives its key. Django's on_delete=SET_NULL acts only when
# Django's collector deletes the key; deleting an agent deletes its keys in the
# database (ON DELETE CASCADE from agents), where the key's constraint had no
# action, so the commit failed once a scoped key had been used. The database
# now clears the key itself.
#
# Not atomic, in two steps: the new key is added NOT VALID (one statement: the
# old one is dropped in the same block), then validated in a transaction of
# its own, whose check of the existing rows does not stop the tool calls that
# insert usage events meanwhile. The old key held for every row, so it passes.

from django.db import migrations

REPLACE = """
DO $$
DECLARE found text;
BEGIN
  FOR found IN SELECT conname FROM pg_constraint
    WHERE conrelid = 'usage_events'::regclass AND contype = 'f'
    AND confrelid = 'api_keys'::regclass
  LOOP
    EXECUTE format('ALTER TABLE usage_events DROP CONSTRAINT %I', found);
  END LOOP;
  ALTER TABLE usage_events ADD CONSTRAINT usage_events_api_key_id_fk_api_keys_id
    FOREIGN KEY (api_key_id) REFERENCES api_keys (id)
    ON DELETE SET NULL DEFERRABLE INITIALLY DEFERRED NOT VALID;
END $$;
"""

VALIDATE = "ALTER TABLE usage_events VALIDATE CONSTRAINT usage_events_api_key_id_fk_api_keys_id;"

BACKWARD = """
DO $$
BEGIN
  ALTER TABLE usage_events DROP CONSTRAINT usage_events_api_key_id_fk_api_keys_id;
  ALTER TABLE usage_events ADD CONSTRAINT usage_events_api_key_id_fk_api_keys_id
    FOREIGN KEY (api_key_id) REFERENCES api_keys (id) DEFERRABLE INITIALLY DEFERRED;
END $$;
"""


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("billing", "0009_billing_account_mcpize_tier"),
        ("accounts", "0001_initial"),
    ]

    operations = [
        migrations.RunSQL(REPLACE, BACKWARD),
        migrations.RunSQL(VALIDATE, migrations.RunSQL.noop),
    ]
