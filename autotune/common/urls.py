"""A storage URL as people may see it: every credential masked (messages, stored provenance,
the terminal)."""

from __future__ import annotations

import re

MASK = "***"


# Query (or libpq key=value) settings that hold a secret: libpq's `password` and `sslpassword`,
# and what other dialects call theirs (`passwd`, `pwd`, tokens). Paths to files that hold one
# (`passfile`, `sslkey`) say nothing secret and are shown, as is a `tokenizer=` (a token is
# a secret, a tokenizer or a token count not).
_SECRET_SETTING = re.compile(
    r"(?P<key>(?:^|[?&;\s])[\w.-]*(?:passw|pwd|secret|token(?![a-z])|credential)[\w.-]*=)"
    r"(?P<value>[^&;\s]*)",
    re.IGNORECASE,
)


def safe_url(url: str) -> str:
    """The URL as typed, with every credential masked, for messages: the password of its user
    info and secret query settings (`?password=`, `?sslpassword=`, ...).

    Not SQLAlchemy's `render_as_string(hide_password=True)`: it shows `?password=` as it is,
    and a password holding an unencoded `@` only up to that `@` (make_url splits there). The
    user info here runs to the URL's last `@`: a query value holding an `@` masks more than it
    needs to, never less."""
    url = _SECRET_SETTING.sub(lambda m: m["key"] + MASK, url)
    scheme, sep, rest = url.partition("://")
    at = rest.rfind("@")
    if not sep or at < 0 or rest.startswith("/"):  # no user info (sqlite:///path: a path)
        return url
    user, colon, _ = rest[:at].partition(":")
    return f"{scheme}://{user}{colon and ':' + MASK}{rest[at:]}"
