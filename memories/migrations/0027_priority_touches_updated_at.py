# updated_at moves when what a user can change and see changes. The trigger
# of 0002 predates priority, so a priority-only update_memory made a version
# and left updated_at at its old value, and list_memories(order="updated_at")
# placed the memory where it was before the edit.

from django.db import migrations


def _trigger(columns: tuple[str, ...]) -> str:
    changed = "\n          OR ".join(f"OLD.{c} IS DISTINCT FROM NEW.{c}" for c in columns)
    return f"""
DROP TRIGGER memories_touch_updated_at ON memories;
CREATE TRIGGER memories_touch_updated_at
    BEFORE UPDATE ON memories
    FOR EACH ROW
    WHEN ({changed})
    EXECUTE FUNCTION memories_touch_updated_at();
"""


BEFORE = ("content", "metadata", "namespace")
AFTER = (*BEFORE, "priority")


class Migration(migrations.Migration):
    dependencies = [("memories", "0026_pass_on_to_the_next_step")]

    operations = [migrations.RunSQL(_trigger(AFTER), reverse_sql=_trigger(BEFORE))]
