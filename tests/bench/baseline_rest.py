"""The `rest` part's baseline: the smallest FastAPI + SQLModel app answering getApp as Relay's REST API does.

    python -m tests.bench.baseline_rest PORT DB_URL

It reads Relay's own database (``DB_URL``, a SQLAlchemy URL): the bearer key is looked up by its SHA-256 hex digest
in the ``apikey`` table, as ``core.store.hash_key`` and ``Store.authenticate`` do (revoked or unknown: 401, a key of
another org: 403), then the app's row in ``application`` (404 when missing), and answers upstream's ``Application``
fields. (Relay's getApp also reads the app's executors, for ``status`` and ``language``: that read is Relay's own
cost, not the baseline's; here ``status`` is always UNAVAILABLE.) One plain ``def`` endpoint, so FastAPI runs both
reads in one thread-pool hop. It runs under uvicorn as `relay gateway` does (``cli/serve.py``): HTTP/1.1 on h11, the
standard asyncio loop, log level info with the access log on.
"""

from __future__ import annotations

import hashlib
import sys
from datetime import datetime, timedelta
from typing import Annotated

import uvicorn
from fastapi import Depends, FastAPI, HTTPException
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import JSON, Column, Interval
from sqlmodel import Field, Session, SQLModel, create_engine, select

Bearer = Annotated[HTTPAuthorizationCredentials | None, Depends(HTTPBearer(auto_error=False))]


class ApiKey(SQLModel, table=True):
    __tablename__ = "apikey"

    id: str = Field(primary_key=True)
    org: str
    key_hash: str
    apps: list[str] | None = Field(default=None, sa_column=Column(JSON))
    revoked_at: datetime | None = None


class Application(SQLModel, table=True):
    __tablename__ = "application"

    id: str = Field(primary_key=True)
    org: str
    name: str
    executor_timeout: timedelta = Field(sa_type=Interval)
    gc_time_threshold: timedelta | None = Field(default=None, sa_type=Interval)
    gc_rows_threshold: int | None = None
    global_timeout: timedelta | None = Field(default=None, sa_type=Interval)
    private_mode: bool = False
    cross_version_recovery: bool = False
    language: str | None = None


class ApplicationPublic(SQLModel):
    id: str
    name: str
    orgId: str
    status: str
    language: str | None
    gcTimeThresholdMs: int | None
    gcRowsThreshold: int | None
    globalTimeoutMs: int | None
    executorTimeoutSecs: int
    privateMode: bool
    dbosCloud: bool
    crossVersionRecovery: bool


def _ms(value: timedelta | None) -> int | None:
    return None if value is None else value // timedelta(milliseconds=1)


def create_app(db_url: str) -> FastAPI:
    engine = create_engine(db_url, connect_args={"check_same_thread": False} if db_url.startswith("sqlite") else {})
    app = FastAPI()

    @app.get("/v2/orgs/{org}/apps/{name}")
    def get_app(org: str, name: str, credentials: Bearer) -> ApplicationPublic:
        if credentials is None:
            raise HTTPException(401, "missing bearer token")
        digest = hashlib.sha256(credentials.credentials.encode()).hexdigest()
        with Session(engine) as session:
            key = session.exec(select(ApiKey).where(ApiKey.key_hash == digest)).first()
            if key is None or key.revoked_at is not None:
                raise HTTPException(401, "unknown or revoked API key")
            if key.org != org or (key.apps and name not in key.apps):
                raise HTTPException(403, "this key may not read this app")
            row = session.exec(select(Application).where(Application.org == org, Application.name == name)).first()
        if row is None:
            raise HTTPException(404, "no such app")
        return ApplicationPublic(
            id=row.id, name=row.name, orgId=row.org, status="UNAVAILABLE", language=row.language,
            gcTimeThresholdMs=_ms(row.gc_time_threshold), gcRowsThreshold=row.gc_rows_threshold,
            globalTimeoutMs=_ms(row.global_timeout), executorTimeoutSecs=int(row.executor_timeout.total_seconds()),
            privateMode=row.private_mode, dbosCloud=False, crossVersionRecovery=row.cross_version_recovery)

    return app


def main(argv: list[str]) -> None:
    port, db_url = int(argv[0]), argv[1]
    uvicorn.run(create_app(db_url), host="127.0.0.1", port=port, http="h11", loop="asyncio", log_level="info")


if __name__ == "__main__":
    main(sys.argv[1:])
