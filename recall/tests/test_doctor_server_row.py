"""`recall doctor`'s server row points at RECALL_DATA_DIR only when the database lives there."""

from __future__ import annotations

from recall import doctor


def test_with_database_url_the_missing_server_is_not_looked_for_in_the_data_directory(settings):
    settings.EMBEDDED_DATABASE = False

    [server] = doctor.running_server([])

    assert server.status == "warning"
    assert "no `recall serve` is running on this machine" in server.message
    assert "RECALL_DATA_DIR" not in server.message + server.fix
    assert str(doctor.data_dir_path()) not in server.message


def test_on_the_embedded_database_the_missing_server_is_the_data_directorys(settings):
    settings.EMBEDDED_DATABASE = True

    [server] = doctor.running_server([])

    assert str(doctor.data_dir_path()) in server.message
    assert "RECALL_DATA_DIR" in server.fix
