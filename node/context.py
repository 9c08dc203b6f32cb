"""Everything a running node holds: settings, database, blob store, password hasher."""

from __future__ import annotations

from dataclasses import dataclass

from argon2 import PasswordHasher
from sqlalchemy import Engine
from sqlalchemy.orm import Session, sessionmaker

from node.db.session import make_engine, make_sessionmaker
from node.services.security import password_hasher
from node.settings import Settings
from node.storage import BlobStore, FileBlobStore


@dataclass
class NodeContext:
    settings: Settings
    engine: Engine
    sessions: sessionmaker[Session]
    store: BlobStore
    hasher: PasswordHasher

    @classmethod
    def from_settings(cls, settings: Settings) -> NodeContext:
        settings.data_dir.mkdir(parents=True, exist_ok=True)
        engine = make_engine(settings.resolved_database_url)
        return cls(
            settings=settings,
            engine=engine,
            sessions=make_sessionmaker(engine),
            store=FileBlobStore(settings.blob_dir),
            hasher=password_hasher(settings),
        )

    def close(self) -> None:
        self.engine.dispose()
