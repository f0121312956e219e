"""The admin token: required by every write; generated once when none is configured."""

from __future__ import annotations

import hmac
import logging
import os
import secrets
from pathlib import Path

log = logging.getLogger(__name__)


def load_or_create_token(configured: str | None, token_file: Path) -> str:
    if configured:
        return configured
    try:
        return token_file.read_text(encoding="ascii").strip()
    except FileNotFoundError:
        pass
    token = secrets.token_urlsafe(32)
    token_file.parent.mkdir(parents=True, exist_ok=True)
    try:
        # O_EXCL: two processes starting at once must not each print a different token.
        fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return token_file.read_text(encoding="ascii").strip()
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write(token + "\n")
    log.warning("generated admin token (stored in %s, mode 600): %s", token_file, token)
    return token


def token_matches(expected: str, authorization: str | None) -> bool:
    if not authorization:
        return False
    scheme, _, given = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(given.strip().encode(), expected.encode())


# ---- browser sessions for the admin console ----------------------------------------------------------
# Stateless and signed with the admin token, so every worker accepts them and rotating the token
# signs everyone out. The CSRF token is derived from the session, sent by the page in a header.

SESSION_COOKIE = "moerag_session"
SESSION_SECONDS = 12 * 3600


def _sign(token: str, message: str) -> str:
    return hmac.new(token.encode(), message.encode(), "sha256").hexdigest()


def new_session(token: str, now: float) -> str:
    expires = str(int(now + SESSION_SECONDS))
    return f"{expires}.{_sign(token, 'session:' + expires)}"


def session_valid(token: str, cookie: str | None, now: float) -> bool:
    if not cookie or "." not in cookie:
        return False
    expires, _, signature = cookie.partition(".")
    if not expires.isdigit() or int(expires) < now:
        return False
    return hmac.compare_digest(signature, _sign(token, "session:" + expires))


def session_parts(cookie: str) -> tuple[int, str]:
    """(expiry in epoch seconds, signature) of a well-formed cookie."""
    expires, _, signature = cookie.partition(".")
    return int(expires), signature


def csrf_token(token: str, cookie: str) -> str:
    return _sign(token, "csrf:" + cookie)
