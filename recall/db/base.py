from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.db.backends.postgresql import base

from recall.db import embedded


class DatabaseWrapper(base.DatabaseWrapper):
    """The stock PostgreSQL backend, pointed at the embedded server.

    The server starts when the first connection wrapper is built, and the
    resolved socket and role are written into the settings dictionary so that
    ``dbshell`` and the test-database machinery see real values.
    """

    def __init__(self, settings_dict, alias="default"):
        server = embedded.start(Path(settings.RECALL_DATA_DIR))
        settings_dict.update(
            HOST=server.host,
            PORT=str(server.port),
            USER=settings_dict.get("USER") or embedded.OWNER_ROLE,
        )
        if not settings_dict.get("NAME"):
            settings_dict["NAME"] = embedded.DATABASE
        super().__init__(settings_dict, alias)
