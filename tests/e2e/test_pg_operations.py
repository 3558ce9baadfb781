"""Relay's store on PostgreSQL as production runs it (a private cluster, tests/postgres.py):

- migrations as a release step: `relay migrate` as the database's owner, then the processes under a role with no
  CREATE rights (only SELECT, INSERT, UPDATE, DELETE on the tables) and RELAY_MIGRATE_ON_START=false; a schema
  behind the code is refused, naming both revisions, and `relay migrate --sql` prints a script that is the migration;
- TLS with ``sslmode=verify-full``: a private CA made here with Debian's openssl, the cluster's ssl turned on, the
  store connecting through the CA and refused with another CA or another host name.

SQLite, and the processes' one-line exit: tests/unit/test_schema_version.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml  # type: ignore[import-untyped,unused-ignore]
from alembic import command
from psycopg import sql
from sqlalchemy import create_engine, text
from sqlalchemy.exc import OperationalError

from core import migrations
from core.errors import SchemaVersionError
from core.models import make_engine, open_engine
from core.settings import Settings
from core.store import Store
from core.units import utcnow
from tests.e2e.test_temporal_tls import make_pki
from tests.postgres import PostgresCluster, pg_bin, postgres_cluster
from tests.support import VENV_BIN, Process, free_port, relay_env
from tests.unit.test_migrations import revision, schema_differences
from tests.unit.test_schema_version import BEHIND, HEAD

pytestmark = [pytest.mark.e2e, pytest.mark.concurrent]
TABLE_RIGHTS = "SELECT, INSERT, UPDATE, DELETE"


@pytest.fixture(scope="module")
def cluster() -> Iterator[PostgresCluster]:
    with postgres_cluster() as started:
        yield started


@dataclass(frozen=True)
class Roles:
    owner_url: str  # owns the database (and so its schema): what `relay migrate` runs as
    app_url: str  # gateways and workers: no CREATE anywhere, DML on the tables
    app_params: dict[str, Any]


def _superuser(cluster: PostgresCluster, database: str) -> psycopg.Connection[tuple[object, ...]]:
    return psycopg.connect(**cluster.params(database), autocommit=True)


@pytest.fixture
def roles(cluster: PostgresCluster) -> Roles:
    """A new database owned by a role of its own, and an application role that may only read and write rows:
    the owner's default privileges grant it DML on every table the owner creates (the migrations' included)."""
    suffix = uuid.uuid4().hex[:8]
    owner, app, database = f"relay_owner_{suffix}", f"relay_app_{suffix}", f"relay_ops_{suffix}"
    with _superuser(cluster, "postgres") as conn:
        for role in (owner, app):
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(database), sql.Identifier(owner)))
    with _superuser(cluster, database) as conn:
        # PostgreSQL 15 grants PUBLIC no CREATE on schema public; older versions did: revoke it either way.
        conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(sql.Identifier(app)))
        conn.execute(sql.SQL("ALTER DEFAULT PRIVILEGES FOR ROLE {} IN SCHEMA public GRANT " + TABLE_RIGHTS +
                             " ON TABLES TO {}").format(sql.Identifier(owner), sql.Identifier(app)))
    base = f"postgresql+psycopg://{{}}@127.0.0.1:{cluster.port}/{database}"
    return Roles(base.format(owner), base.format(app), {**cluster.params(database), "user": app})


def relay_migrate(tmp_path: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(VENV_BIN / "relay"), "migrate", *args], capture_output=True, text=True, timeout=60,
                          env=relay_env(tmp_path, RELAY_DATABASE_URL=url, RELAY_MIGRATE_ON_START="false"))


def downgrade(url: str, target: str) -> None:
    """The schema put back to ``target``, as an older Relay's database (run as the owner)."""
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            cfg = migrations.config()
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, target)
            conn.commit()
    finally:
        engine.dispose()


def test_processes_run_without_create_rights_once_relay_migrate_has_run(
    roles: Roles, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    done = relay_migrate(tmp_path, roles.owner_url)
    assert done.returncode == 0 and done.stdout.endswith(f": at revision {HEAD}\n"), done

    # The premise: the application role cannot create anything.
    with psycopg.connect(**roles.app_params) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("CREATE TABLE probe (x integer)")

    monkeypatch.setenv("RELAY_MIGRATE_ON_START", "false")
    store = Store(open_engine(Settings(database_url=roles.app_url)))
    try:
        store.ensure_app("local", "orders")  # a row and its audit row
        assert store.write_audit(org="local", operation="test.written", app="orders", event_key="once")
        assert not store.write_audit(org="local", operation="test.written", app="orders", event_key="once")
        key = store.create_key(org="local", name="ci")
        assert store.authenticate(key).org == "local"
        assert [a.operation for a in store.list_audit("local")] == ["test.written", "app.registered"]
        assert store.prune_audit_batch(before=utcnow() + timedelta(days=1), limit=1000) == 2  # DELETE too
    finally:
        store.engine.dispose()

    # The schema behind the code (an older release's database): refused, naming both revisions, nothing run.
    downgrade(roles.owner_url, BEHIND)
    with pytest.raises(SchemaVersionError) as refused:
        make_engine(roles.app_url, migrate=False)
    assert str(refused.value) == f"database schema is at {BEHIND}, this Relay needs {HEAD}: run `relay migrate`"
    # A process says it in one line and exits 1, before it reaches for Temporal.
    gateway = Process([str(VENV_BIN / "relay"), "gateway"], log=tmp_path / "gateway.log", env=relay_env(
        tmp_path, RELAY_DATABASE_URL=roles.app_url, RELAY_MIGRATE_ON_START="false",
        RELAY_TEMPORAL_ADDRESS=f"127.0.0.1:{free_port()}", RELAY_TEMPORAL_CONNECT_TIMEOUT_SECS="1"))
    try:
        assert gateway.popen.wait(60) == 1
    finally:
        gateway.stop()
    [line] = gateway.output().splitlines()
    assert line.endswith(f"cannot start: database schema is at {BEHIND}, this Relay needs {HEAD}: run `relay migrate`")
    # Migrating on start under this role would need the CREATE right it lacks; DDL is transactional: nothing changed.
    with pytest.raises(Exception, match="permission denied for schema public"):
        make_engine(roles.app_url, migrate=True)
    engine = create_engine(roles.owner_url)
    try:
        assert revision(engine) == {BEHIND}
    finally:
        engine.dispose()

    # The release step again, then the processes start.
    assert relay_migrate(tmp_path, roles.owner_url).returncode == 0
    make_engine(roles.app_url, migrate=False).dispose()


def test_migrate_sql_is_the_migration(roles: Roles, tmp_path: Path) -> None:
    done = relay_migrate(tmp_path, roles.owner_url, "--sql")
    assert done.returncode == 0, done.stderr
    assert "CREATE TYPE executorstatus AS ENUM" in done.stdout and done.stdout.rstrip().endswith("COMMIT;")
    engine = create_engine(roles.owner_url)
    try:
        assert revision(engine) == frozenset()  # printed, not run
        with engine.connect() as conn:
            conn.exec_driver_sql(done.stdout)  # what a DBA would run with psql
            conn.commit()
        assert revision(engine) == {HEAD} and schema_differences(engine) == []
    finally:
        engine.dispose()
    assert relay_migrate(tmp_path, roles.owner_url, "--sql").stdout == f"-- at revision {HEAD}: nothing to run\n"


# -- TLS --------------------------------------------------------------------------------------------------------


@pytest.fixture
def tls(cluster: PostgresCluster, tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """The cluster serving TLS with a certificate for localhost (and 127.0.0.1) from a private CA; the CA and
    another CA. Turned off again at the end (ssl is reloadable: no restart)."""
    pki = make_pki(tmp_path)
    tls_dir = cluster.root / "tls"
    tls_dir.mkdir()
    for name in ("server.pem", "server.key"):
        shutil.copy(tmp_path / name, tls_dir / name)
        (tls_dir / name).chmod(0o600)  # PostgreSQL refuses a key others may read
        if cluster.user is not None:
            os.chown(tls_dir / name, cluster.user.pw_uid, cluster.user.pw_gid)
    settings = {"ssl_cert_file": str(tls_dir / "server.pem"), "ssl_key_file": str(tls_dir / "server.key"),
                "ssl": "on"}
    with _superuser(cluster, "postgres") as conn:
        for name, value in settings.items():
            conn.execute(sql.SQL("ALTER SYSTEM SET {} = {}").format(sql.Identifier(name), sql.Literal(value)))
        conn.execute("SELECT pg_reload_conf()")
    try:
        yield pki.ca, pki.other_ca
    finally:
        with _superuser(cluster, "postgres") as conn:
            for name in settings:
                conn.execute(sql.SQL("ALTER SYSTEM RESET {}").format(sql.Identifier(name)))
            conn.execute("SELECT pg_reload_conf()")


def test_the_store_connects_with_verify_full_and_refuses_another_ca_or_name(
    cluster: PostgresCluster, tls: tuple[Path, Path], tmp_path: Path
) -> None:
    ca, other_ca = tls
    database = cluster.create_database("tls").rsplit("/", 1)[1]

    def url(host: str, root: Path, *extra: str) -> str:
        query = "&".join(["sslmode=verify-full", f"sslrootcert={root}", *extra])
        return f"postgresql+psycopg://relay@{host}:{cluster.port}/{database}?{query}"

    store = Store(make_engine(url("localhost", ca)))
    try:
        store.ensure_app("local", "orders")
        with store.engine.connect() as conn:
            assert conn.execute(text("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")).scalar_one()
    finally:
        store.engine.dispose()

    with pytest.raises(OperationalError, match="certificate verify failed"):
        make_engine(url("localhost", other_ca))
    # verify-full checks the name too: the right CA, but a name the certificate is not for (same address).
    with pytest.raises(OperationalError, match='does not match host name "relay.example"'):
        make_engine(url("relay.example", ca, "hostaddr=127.0.0.1"))

    # A real process, the URL from a file (RELAY_DATABASE_URL_FILE, as a mounted secret).
    url_file = tmp_path / "database-url"
    url_file.write_text(url("localhost", ca) + "\n")
    done = subprocess.run([str(VENV_BIN / "relay"), "migrate"], capture_output=True, text=True, timeout=60,
                          env=relay_env(tmp_path, RELAY_DATABASE_URL_FILE=str(url_file)))
    assert done.returncode == 0, done
    assert done.stdout.startswith(f"postgresql+psycopg://relay@localhost:{cluster.port}/{database}?sslmode=verify-full")
    assert done.stdout.endswith(f": at revision {HEAD}\n")


def test_the_compose_files_database_roles_are_the_readmes(cluster: PostgresCluster, tmp_path: Path) -> None:
    """deploy/compose's init script for Relay's PostgreSQL, run by ``sh`` as the postgres image runs it (its
    POSTGRES_USER a superuser owning POSTGRES_DB): `relay migrate` as that owner, then the store as relay_app, which
    reads and writes rows and creates nothing."""
    compose = yaml.safe_load((Path(__file__).resolve().parents[2] / "deploy" / "compose" / "compose.yaml").read_text())
    # Compose reads "$$" as a literal "$" (the container's variables, not the env file's).
    script = compose["configs"]["relay-database-roles"]["content"].replace("$$", "$")
    owner, database = "relay_owner", f"relay_compose_{uuid.uuid4().hex[:8]}"
    with _superuser(cluster, "postgres") as conn:
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (owner,)).fetchone() is None:
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN SUPERUSER").format(sql.Identifier(owner)))
        conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(sql.Identifier(database), sql.Identifier(owner)))
    env = {"PATH": f"{pg_bin()}:/usr/bin:/bin", "PGHOST": "127.0.0.1", "PGPORT": str(cluster.port),
           "POSTGRES_USER": owner, "POSTGRES_DB": database, "RELAY_APP_DB_PASSWORD": "not-checked-here"}
    ran = subprocess.run(["sh", "-c", script], env=env, capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    base = f"postgresql+psycopg://{{}}@127.0.0.1:{cluster.port}/{database}"
    done = relay_migrate(tmp_path, base.format(owner))
    assert done.returncode == 0 and done.stdout.endswith(f": at revision {HEAD}\n"), done
    app_params = {**cluster.params(database), "user": "relay_app"}
    with psycopg.connect(**app_params) as conn, pytest.raises(psycopg.errors.InsufficientPrivilege):
        conn.execute("CREATE TABLE probe (x integer)")
    store = Store(make_engine(base.format("relay_app"), migrate=False))
    try:
        store.ensure_app("local", "orders")
        assert store.write_audit(org="local", operation="test.written", app="orders", event_key="compose")
        assert store.prune_audit_batch(before=utcnow() + timedelta(days=1), limit=1000) == 2
    finally:
        store.engine.dispose()


def test_the_compose_guides_roles_for_an_earlier_compose_volume(tmp_path: Path) -> None:
    """The compose guide's commands for a compose data volume made by an earlier release: the image's bootstrap
    superuser ``relay`` owns the database and its tables (here, this cluster's own superuser, also ``relay``); run
    as written (the ``psql -c`` commands of its block, passwords put in), ``relay_app`` reads and writes every
    table, those of a later migration too, and creates nothing."""
    guide = (Path(__file__).resolve().parents[2] / "docs" / "pages" / "guides" / "compose.md").read_text()
    [block] = [b for b in re.findall(r"```shell\n(.*?)```", guide, re.S) if "docker compose exec relay-postgresql" in b]
    commands = [c.replace("<RELAY_APP_DB_PASSWORD>", "app-password") for c in re.findall(r'-c "([^"]+)"', block)]
    assert len(commands) == 4 and "-U relay -d relay" in block
    with postgres_cluster() as legacy:  # its own cluster: roles are cluster-wide, and relay_app is made here
        name = legacy.create_database("earlier").rsplit("/", 1)[1]
        owner_url, app_url = (f"postgresql+psycopg://{user}@127.0.0.1:{legacy.port}/{name}" for user in ("relay",
                                                                                                        "relay_app"))
        assert relay_migrate(tmp_path, owner_url).returncode == 0
        downgrade(owner_url, BEHIND)  # the earlier release's schema, owned by relay
        ran = subprocess.run([str(pg_bin() / "psql"), "-v", "ON_ERROR_STOP=1", "-h", "127.0.0.1", "-p",
                              str(legacy.port), "-U", "relay", "-d", name, *[a for c in commands for a in ("-c", c)]],
                             env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=60)
        assert ran.returncode == 0, ran.stderr
        # The upgrade: relay migrate as the owner, then the processes as relay_app on the tables of both releases.
        done = relay_migrate(tmp_path, owner_url)
        assert done.returncode == 0 and done.stdout.endswith(f": at revision {HEAD}\n"), done
        with psycopg.connect(**{**legacy.params(name), "user": "relay_app"}) as conn, \
                pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("CREATE TABLE probe (x integer)")
        store = Store(make_engine(app_url, migrate=False))
        try:
            store.ensure_app("local", "orders")
            store.gateways.register("relay-gateway-q", "gateway-1")  # a table of the earlier release
            store.gateways.report("relay-gateway-q", sockets=3, accepting=True)  # a column of this one
            assert store.gateways.live_counts(timedelta(minutes=1))["relay-gateway-q"][0] == 3
            assert store.prune_audit_batch(before=utcnow() + timedelta(days=1), limit=1000) == 1
        finally:
            store.engine.dispose()
