"""What opening a store with a bad URL says: the right error type, and never a secret.

- A database that does not exist, or credentials the server refuses, is a
  ``ConfigurationError`` (a task queue must not retry it forever); a server that is
  down stays a ``TransientStoreError``. Real servers, sync and async.
- No password (nor a ``Signer`` key) appears in anything a failing call produces: the
  exception's str/repr and its whole ``__cause__``/``__context__`` chain, the reprs of
  the URL, store, backend and settings objects, captured log records, and the output of
  ``fencing migrate``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import pytest

import fencing
from fencing import _cli
from fencing._url import StoreURL

from ._backends import require_server

SECRET = "Sup3r-s3cret_PW"
SCHEMES = ["postgresql", "postgres", "mysql", "mariadb", "redis", "rediss"]
# malformed or unusable URLs, each holding SECRET where a password goes
MALFORMED = [
    "{s}://user:{pw}@host:notaport/db",
    "{s}://user:{pw}/tail@host/db",  # a '/' in the password: urlsplit misreads it
    "{s}://user:{pw}@[::1/db",  # bad IPv6 literal
    "{s}://user:{pw}@127.0.0.1:99999/db",  # port out of range
    "{s}://user:{pw}@127.0.0.1:1/db?bad&&=",  # malformed query
    "{s}://user:{pw}@127.0.0.1:1/db?password={pw}&pool_size=x&min_size=x&wait_replicas=x",
    "{s}://user:{pw}@127.0.0.1:1/db?nosuchoption=1",
    "{s}:/user:{pw}@127.0.0.1:1/db",  # no '://'
    "{s}//user:{pw}@127.0.0.1:1/db",
    "{s}x://user:{pw}@127.0.0.1:1/db",  # unknown scheme
    "{s}://user:{pw}@127.0.0.1:1",  # no database, nothing listening
    "{s}://:{pw}@127.0.0.1:1/0",
]


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _texts(exc: BaseException) -> list[str]:
    out = []
    for e in _chain(exc):
        out += [str(e), repr(e), repr(e.args)]
    return out


def _open_sync(url: str) -> BaseException:
    try:
        store = fencing.open(url)
    except Exception as exc:
        return exc
    store.close()
    pytest.fail(f"{url} opened")


def _open_async(url: str) -> BaseException:
    async def go() -> None:
        store = await fencing.open_async(url)
        await store.close()

    try:
        asyncio.run(go())
    except Exception as exc:
        return exc
    pytest.fail(f"{url} opened")


OPENERS = {"sync": _open_sync, "async": _open_async}


def _no_secret(texts: list[str], caplog: pytest.LogCaptureFixture, secret: str = SECRET) -> None:
    logged = [r.getMessage() for r in caplog.records] + [repr(r.args) for r in caplog.records]
    logged += [str(r.exc_info) for r in caplog.records if r.exc_info]
    leaks = [t for t in texts + logged if secret in t]
    assert leaks == []


@pytest.mark.parametrize("scheme", SCHEMES)
def test_no_password_in_errors_of_malformed_urls(
    scheme: str, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    caplog.set_level(logging.DEBUG)
    for template in MALFORMED:
        url = template.format(s=scheme, pw=SECRET)
        for api, opener in OPENERS.items():
            exc = opener(url)
            assert isinstance(exc, fencing.FencingError), (url, api, exc)
            _no_secret(_texts(exc), caplog)
        assert _cli.main(["migrate", url]) == 2
        out, err = capsys.readouterr()
        assert "fencing:" in err
        _no_secret([out, err], caplog)


def test_no_password_in_reprs_of_parsed_urls_and_settings() -> None:
    from fencing.backends import postgres
    from fencing.backends.mysql.settings import settings_from_url as mysql_settings
    from fencing.backends.redis.settings import settings_from_url as redis_settings

    for scheme in ("postgresql", "mysql", "redis"):
        parsed = StoreURL.parse(f"{scheme}://user:{SECRET}@db.example/1?password={SECRET}")
        assert SECRET not in repr(parsed)
        assert SECRET not in parsed.redacted()
    url = StoreURL.parse(f"postgresql://user:{SECRET}@db.example/shop")
    config = postgres.settings.settings_from_url(url, {})
    assert SECRET in config.conninfo  # it is there, for the driver
    assert SECRET not in repr(config)
    url = StoreURL.parse(f"mysql://user:{SECRET}@db.example/shop")
    assert SECRET not in repr(mysql_settings(url, {}))
    url = StoreURL.parse(f"redis://user:{SECRET}@db.example/0")
    assert SECRET not in repr(redis_settings(url, {}))


def test_no_signing_key_in_signer_errors_or_repr() -> None:
    key = b"k" * 16 + SECRET.encode()
    signer = fencing.Signer(keys={"k1": key}, current="k1")
    assert SECRET not in repr(signer)
    bad: list[Any] = [
        {key: "k1"},  # swapped: secret as the key id
        {"k1": key.decode()},  # the secret as text, not bytes
        {"k1": key, "k2": b"too short"},
    ]
    for keys in bad:
        with pytest.raises(fencing.ConfigurationError) as info:
            fencing.Signer(keys=keys, current="k1")
        assert all(SECRET not in t for t in _texts(info.value))
    with pytest.raises(fencing.ConfigurationError) as info:
        fencing.Signer(keys={"k1": key}, current=key.decode())
    assert all(SECRET not in t for t in _texts(info.value))


# -- real servers: refused database or credentials -------------------------------------
def _server(name: str) -> tuple[str, int, str, str]:
    """host, port, a user that exists, a database that exists."""
    if name == "postgresql":
        pg = pytest.importorskip("tests.backends_postgres")
        base = StoreURL.parse(pg.BASE_URL)
        require_server("PostgreSQL", pg.HOST, pg.PORT)
        return pg.HOST, pg.PORT, base.username or "postgres", base.path
    if name == "mysql":
        my = pytest.importorskip("tests.backends_mysql")
        base = StoreURL.parse(my.BASE_URL)
        require_server("MySQL", my.HOST, my.PORT)
        return my.HOST, my.PORT, base.username or "root", base.path
    rd = pytest.importorskip("tests.backends_redis")
    require_server("Redis", rd.HOST, rd.PORT)
    return rd.HOST, rd.PORT, "default", "0"


def _refused(name: str) -> list[str]:
    host, port, user, db = _server(name)
    if name == "redis":
        return [
            f"redis://fencing_no_such_user:{SECRET}@{host}:{port}/0",
            f"redis://:{SECRET}@{host}:{port}/0",  # no password is set: AUTH refused
        ]
    return [
        f"{name}://fencing_no_such_user:{SECRET}@{host}:{port}/{db}",
        f"{name}://{user}:{SECRET}@{host}:{port}/fencing_no_such_database",
    ]


@pytest.mark.parametrize("name", ["postgresql", "mysql", "redis"])
def test_refused_database_or_credentials_is_a_configuration_error(
    name: str, api: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    for url in _refused(name):
        exc = OPENERS[api](url)
        assert isinstance(exc, fencing.ConfigurationError), (url, type(exc), exc)
        assert not isinstance(exc, fencing.StoreError)
        _no_secret(_texts(exc), caplog)


@pytest.mark.parametrize("name", ["postgresql", "mysql", "redis"])
def test_a_server_that_is_down_stays_transient(name: str, api: str) -> None:
    db = "0" if name == "redis" else "test"
    exc = OPENERS[api](f"{name}://user:{SECRET}@127.0.0.1:1/{db}")  # nothing listens there
    assert isinstance(exc, fencing.TransientStoreError), (type(exc), exc)
    assert all(SECRET not in t for t in _texts(exc))


def test_cli_migrate_says_configuration_error_without_the_password(
    capsys: pytest.CaptureFixture[str],
) -> None:
    url = _refused("postgresql")[1]
    assert _cli.main(["migrate", url]) == 2
    out, err = capsys.readouterr()
    assert "ConfigurationError" in err
    assert SECRET not in out + err
