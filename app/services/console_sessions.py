"""Console sign-out that holds: revoked session signatures in SQL, seen by every worker."""

from __future__ import annotations

import time

from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from app.core.auth import session_parts, session_valid
from app.core.models import RevokedSession


class ConsoleSessions:
    """Sessions are signed and stateless; only their revocations are stored, until they expire."""

    def __init__(self, sessions: sessionmaker[Session]) -> None:
        self.sessions = sessions

    def valid(self, admin_token: str, cookie: str | None) -> bool:
        if cookie is None or not session_valid(admin_token, cookie, time.time()):
            return False
        _, signature = session_parts(cookie)
        with self.sessions() as s:
            return s.scalar(select(RevokedSession.signature).where(RevokedSession.signature == signature)) is None

    def revoke(self, cookie: str) -> None:
        expires, signature = session_parts(cookie)
        with self.sessions.begin() as s:
            s.execute(delete(RevokedSession).where(RevokedSession.expires_at < time.time()))  # expired anyway
            try:
                with s.begin_nested():
                    s.add(RevokedSession(signature=signature, expires_at=expires))
            except IntegrityError:
                pass  # signed out twice
