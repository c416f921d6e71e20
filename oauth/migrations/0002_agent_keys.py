from django.db import migrations

# Guarantees: every grant and token names an existing agent, and deleting an
# agent ends its connections: its codes and tokens go with it, whichever path
# deletes the agent (the tenant path never loads these rows).
AGENT_KEYS = """
ALTER TABLE oauth_grants ADD CONSTRAINT oauth_grants_agent_fk
    FOREIGN KEY (agent_id) REFERENCES agents (id) ON DELETE CASCADE;
ALTER TABLE oauth_access_tokens ADD CONSTRAINT oauth_access_tokens_agent_fk
    FOREIGN KEY (agent_id) REFERENCES agents (id) ON DELETE CASCADE;
ALTER TABLE oauth_refresh_tokens ADD CONSTRAINT oauth_refresh_tokens_agent_fk
    FOREIGN KEY (agent_id) REFERENCES agents (id) ON DELETE CASCADE;
CREATE INDEX oauth_access_tokens_agent_idx ON oauth_access_tokens (agent_id);
CREATE INDEX oauth_refresh_tokens_agent_idx ON oauth_refresh_tokens (agent_id);
"""

AGENT_KEYS_REVERSE = """
DROP INDEX IF EXISTS oauth_refresh_tokens_agent_idx;
DROP INDEX IF EXISTS oauth_access_tokens_agent_idx;
ALTER TABLE oauth_refresh_tokens DROP CONSTRAINT IF EXISTS oauth_refresh_tokens_agent_fk;
ALTER TABLE oauth_access_tokens DROP CONSTRAINT IF EXISTS oauth_access_tokens_agent_fk;
ALTER TABLE oauth_grants DROP CONSTRAINT IF EXISTS oauth_grants_agent_fk;
"""


class Migration(migrations.Migration):
    dependencies = [
        ("oauth", "0001_initial"),
        ("accounts", "0005_agents"),
    ]

    operations = [
        migrations.RunSQL(AGENT_KEYS, AGENT_KEYS_REVERSE),
    ]
