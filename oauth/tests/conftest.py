from __future__ import annotations

import pytest

from tests.oauth_servers import MetadataHost


@pytest.fixture
def host(monkeypatch, settings):
    """A real https host on loopback for client metadata documents, its CA trusted."""
    server = MetadataHost()
    monkeypatch.setenv("SSL_CERT_FILE", str(server.ca_file))
    settings.OAUTH_CIMD_ALLOW_PRIVATE_ADDRESSES = True
    yield server
    server.close()
