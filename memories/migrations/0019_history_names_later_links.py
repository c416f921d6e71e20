from importlib import import_module

from django.db import migrations

_supersession = import_module("memories.migrations.0016_supersession")

# Guarantee: a link is recorded in the history of both memories, whenever it
# is made. A memory stored as the replacement names what it replaced on its
# `created` row (0016). One that was stored before it replaced anything (a
# link made from a hint or a mark, a chat model's decision after the write,
# a fact stated again) gets an `updated` row of its own, its content
# unchanged, naming what it now replaces and who decided (app.replaces and
# app.supersession, set by the write around a version bump of that memory,
# services/superseding.py `apply`).
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
        ELSE
            replaced := NULLIF(current_setting('app.replaces', true), '')::uuid[];
            IF replaced IS NOT NULL THEN
                why := NULLIF(current_setting('app.supersession', true), '')::jsonb;
            END IF;
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


class Migration(migrations.Migration):
    dependencies = [("memories", "0018_purge_link_reasons")]

    operations = [migrations.RunSQL(HISTORY, _supersession.HISTORY)]
