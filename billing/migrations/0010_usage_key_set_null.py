# A usage event outlives its key. Django's on_delete=SET_NULL acts only when
# Django's collector deletes the key; deleting an agent deletes its keys in the
# database (ON DELETE CASCADE from agents), where the key's constraint had no
# action, so the commit failed once a scoped key had been used. The database
# now clears the key itself.

from django.db import migrations

FORWARD = """
DO $$
DECLARE found text;
BEGIN
  FOR found IN SELECT conname FROM pg_constraint
    WHERE conrelid = 'usage_events'::regclass AND contype = 'f'
    AND confrelid = 'api_keys'::regclass
  LOOP
    EXECUTE format('ALTER TABLE usage_events DROP CONSTRAINT %I', found);
  END LOOP;
END $$;
ALTER TABLE usage_events ADD CONSTRAINT usage_events_api_key_id_fk_api_keys_id
  FOREIGN KEY (api_key_id) REFERENCES api_keys (id)
  ON DELETE SET NULL DEFERRABLE INITIALLY DEFERRED;
"""

BACKWARD = """
ALTER TABLE usage_events DROP CONSTRAINT usage_events_api_key_id_fk_api_keys_id;
ALTER TABLE usage_events ADD CONSTRAINT usage_events_api_key_id_fk_api_keys_id
  FOREIGN KEY (api_key_id) REFERENCES api_keys (id) DEFERRABLE INITIALLY DEFERRED;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("billing", "0009_billing_account_mcpize_tier"),
        ("accounts", "0001_initial"),
    ]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
