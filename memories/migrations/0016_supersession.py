import django.contrib.postgres.fields
from django.db import migrations, models

# Guarantees (issue 22, docs/knowledge-updates.md):
# * a memory is replaced by at most one other memory (superseded_by), of the
#   same user (the trigger below; the key itself is on id alone: a composite
#   one would need a second unique index on every memory, paid on each write
#   and picked by the planner in place of the primary key); when the
#   replacing memory is deleted, the older one is current again (ON DELETE
#   SET NULL, and the trigger clears superseded_at with it);
# * superseded_by and superseded_at are set together or not at all, and a
#   memory never replaces itself;
# * a link never crosses a boundary: the replacing memory is visible to the
#   transaction that writes the link (the lookup runs as the invoker, under
#   row-level security, so an agent cannot name a memory it cannot read), is
#   in the same namespace, was written by the same writer (the same agent, or
#   both user-wide) and is not itself replaced;
# * a memory that moves to another namespace leaves its links behind: what it
#   replaced is current again, and it is current itself;
# * setting or clearing a link is a change a user can see: the version goes
#   up, and the history trigger records it (superseded or restored); an
#   import, whose history came with its memories, restores links without.
LINKS = """
ALTER TABLE memories ADD CONSTRAINT memories_superseded_by_fk
    FOREIGN KEY (superseded_by) REFERENCES memories (id) ON DELETE SET NULL;
ALTER TABLE memories ADD CONSTRAINT memories_superseded_pair
    CHECK ((superseded_by IS NULL) = (superseded_at IS NULL));
ALTER TABLE memories ADD CONSTRAINT memories_superseded_not_self
    CHECK (superseded_by IS NULL OR superseded_by <> id);
CREATE INDEX memories_replaces_idx ON memories (user_id, superseded_by)
    WHERE superseded_by IS NOT NULL;

CREATE FUNCTION memories_check_supersession() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
DECLARE
    other record;
BEGIN
    IF TG_OP = 'UPDATE' AND NEW.superseded_by IS NOT NULL
       AND NEW.superseded_by IS NOT DISTINCT FROM OLD.superseded_by
       AND (NEW.namespace, NEW.agent_id) IS DISTINCT FROM (OLD.namespace, OLD.agent_id) THEN
        NEW.superseded_by := NULL;  -- moved away: the link stays behind
    END IF;
    IF NEW.superseded_by IS NULL THEN
        NEW.superseded_at := NULL;
    ELSE
        IF NEW.superseded_by = NEW.id THEN
            RAISE EXCEPTION 'a memory cannot replace itself' USING ERRCODE = 'check_violation';
        END IF;
        IF TG_OP = 'INSERT' OR NEW.superseded_by IS DISTINCT FROM OLD.superseded_by THEN
            SELECT namespace, agent_id, superseded_by INTO other
              FROM memories WHERE id = NEW.superseded_by AND user_id = NEW.user_id;
            IF NOT FOUND THEN
                RAISE EXCEPTION 'the replacing memory is not visible here'
                    USING ERRCODE = 'foreign_key_violation';
            END IF;
            IF other.namespace <> NEW.namespace
               OR other.agent_id IS DISTINCT FROM NEW.agent_id THEN
                RAISE EXCEPTION 'a link never crosses a namespace or an agent'
                    USING ERRCODE = 'check_violation';
            END IF;
            IF other.superseded_by IS NOT NULL THEN
                RAISE EXCEPTION 'the replacing memory is replaced itself'
                    USING ERRCODE = 'check_violation';
            END IF;
            NEW.superseded_at := coalesce(NEW.superseded_at, statement_timestamp());
        END IF;
    END IF;
    -- An import restores links whose history came with the memories
    -- (app.importing): no version, so no history row, of their own.
    IF TG_OP = 'UPDATE' AND NEW.superseded_by IS DISTINCT FROM OLD.superseded_by
       AND coalesce(current_setting('app.importing', true), '') <> 'on' THEN
        NEW.version := OLD.version + 1;
    END IF;
    RETURN NEW;
END $$;
CREATE TRIGGER memories_supersession
    BEFORE INSERT OR UPDATE ON memories
    FOR EACH ROW EXECUTE FUNCTION memories_check_supersession();

-- What a memory that moved replaced is current again. Runs as the owner: the
-- rows it clears belong to the same writer, whom the move already passed.
CREATE FUNCTION memories_release_replaced() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    UPDATE memories SET superseded_by = NULL
     WHERE user_id = NEW.user_id AND superseded_by = NEW.id;
    RETURN NULL;
END $$;
CREATE TRIGGER memories_release_replaced
    AFTER UPDATE ON memories
    FOR EACH ROW
    WHEN ((OLD.namespace, OLD.agent_id) IS DISTINCT FROM (NEW.namespace, NEW.agent_id))
    EXECUTE FUNCTION memories_release_replaced();
"""

LINKS_REVERSE = """
DROP TRIGGER IF EXISTS memories_release_replaced ON memories;
DROP FUNCTION IF EXISTS memories_release_replaced();
DROP TRIGGER IF EXISTS memories_supersession ON memories;
DROP FUNCTION IF EXISTS memories_check_supersession();
DROP INDEX IF EXISTS memories_replaces_idx;
ALTER TABLE memories DROP CONSTRAINT IF EXISTS memories_superseded_not_self;
ALTER TABLE memories DROP CONSTRAINT IF EXISTS memories_superseded_pair;
ALTER TABLE memories DROP CONSTRAINT IF EXISTS memories_superseded_by_fk;
"""

# Guarantees: as 0005's, and each history row also says what the memory was
# replaced by at that version; a link set or cleared is recorded as
# `superseded` or `restored` on the older memory, with the decision the
# writing transaction named (app.supersession: who decided, and why); a
# memory's `created` row names what it replaced (app.replaces, set by the
# write that stores it and cleared after).
HISTORY = """
CREATE OR REPLACE FUNCTION memories_record_history() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public
    AS $$
DECLARE
    m memories%ROWTYPE;
    act text;
    ver integer;
    replaced uuid[];
    why jsonb;
BEGIN
    IF TG_OP = 'DELETE' THEN
        m := OLD; act := 'deleted'; ver := OLD.version + 1;
    ELSIF TG_OP = 'INSERT' THEN
        m := NEW; act := 'created'; ver := NEW.version;
        IF EXISTS (SELECT 1 FROM memory_history
                   WHERE memory_id = NEW.id AND version >= NEW.version) THEN
            RETURN NULL;
        END IF;
        replaced := NULLIF(current_setting('app.replaces', true), '')::uuid[];
        IF replaced IS NOT NULL THEN
            why := NULLIF(current_setting('app.supersession', true), '')::jsonb;
        END IF;
    ELSE
        m := NEW; act := 'updated'; ver := NEW.version;
        IF OLD.superseded_by IS DISTINCT FROM NEW.superseded_by THEN
            act := CASE WHEN NEW.superseded_by IS NULL THEN 'restored' ELSE 'superseded' END;
            why := NULLIF(current_setting('app.supersession', true), '')::jsonb;
        END IF;
    END IF;
    INSERT INTO memory_history (memory_id, user_id, agent_id, version, action, namespace,
                                content, metadata, priority, expires_at, client, api_key_id,
                                recorded_at, superseded_by, replaces, decision)
    VALUES (m.id, m.user_id, m.agent_id, ver, act, m.namespace, m.content, m.metadata, m.priority,
            m.expires_at,
            COALESCE(NULLIF(current_setting('app.actor', true), ''), 'system'),
            NULLIF(current_setting('app.actor_key_id', true), '')::uuid,
            statement_timestamp(), m.superseded_by, replaced, why);
    RETURN NULL;
END $$;
"""

HISTORY_REVERSE = """
CREATE OR REPLACE FUNCTION memories_record_history() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = public
    AS $$
DECLARE
    m memories%ROWTYPE;
    act text;
    ver integer;
BEGIN
    IF TG_OP = 'DELETE' THEN
        m := OLD; act := 'deleted'; ver := OLD.version + 1;
    ELSIF TG_OP = 'INSERT' THEN
        m := NEW; act := 'created'; ver := NEW.version;
        IF EXISTS (SELECT 1 FROM memory_history
                   WHERE memory_id = NEW.id AND version >= NEW.version) THEN
            RETURN NULL;
        END IF;
    ELSE
        m := NEW; act := 'updated'; ver := NEW.version;
    END IF;
    INSERT INTO memory_history (memory_id, user_id, agent_id, version, action, namespace,
                                content, metadata, priority, expires_at, client, api_key_id,
                                recorded_at)
    VALUES (m.id, m.user_id, m.agent_id, ver, act, m.namespace, m.content, m.metadata, m.priority,
            m.expires_at,
            COALESCE(NULLIF(current_setting('app.actor', true), ''), 'system'),
            NULLIF(current_setting('app.actor_key_id', true), '')::uuid,
            statement_timestamp());
    RETURN NULL;
END $$;
"""


class Migration(migrations.Migration):
    dependencies = [("memories", "0015_absolute_score")]

    operations = [
        migrations.AddField(
            model_name="memory",
            name="superseded_by",
            field=models.UUIDField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="memory",
            name="superseded_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="memoryhistory",
            name="superseded_by",
            field=models.UUIDField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="memoryhistory",
            name="replaces",
            field=django.contrib.postgres.fields.ArrayField(
                base_field=models.UUIDField(), blank=True, null=True, size=None
            ),
        ),
        migrations.AddField(
            model_name="memoryhistory",
            name="decision",
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AlterField(
            model_name="memoryhistory",
            name="action",
            field=models.CharField(
                choices=[
                    ("created", "Created"),
                    ("updated", "Updated"),
                    ("deleted", "Deleted"),
                    ("superseded", "Superseded"),
                    ("restored", "Restored"),
                ],
                max_length=10,
            ),
        ),
        migrations.RunSQL(LINKS, LINKS_REVERSE),
        migrations.RunSQL(HISTORY, HISTORY_REVERSE),
    ]
