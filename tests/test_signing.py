"""Signed intents: HMAC-SHA256 with key rotation; a tampered message is refused."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from typing import Any

import pytest

from fencing import ConfigurationError, Intent, InvalidIntent, Signer

K1 = b"k1-secret-0123456789abcdef"
K2 = b"k2-secret-fedcba9876543210"


def intent(**fields: Any) -> Intent:
    base: dict[str, Any] = {
        "id": "i-1",
        "collection": "orders",
        "key": "o-1",
        "expected_version": 3,
        "transition": "ship",
        "guard": {"status": "packed"},
        "decided_at": 1.5,
    }
    base.update(fields)
    return Intent(**base)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def forge(kid: str, secret: bytes, body_text: str) -> str:
    """A correctly signed token over any payload text (as a holder of the key could make)."""
    body = b64(body_text.encode())
    mac = hmac.new(secret, f"{kid}.{body}".encode(), hashlib.sha256).digest()
    return f"{kid}.{body}.{b64(mac)}"


def test_sign_verify_round_trip() -> None:
    signer = Signer(keys={"k1": K1}, current="k1")
    original = intent()
    token = signer.sign(original)
    assert isinstance(token, str) and token.isascii() and token.count(".") == 2
    assert token.startswith("k1.")
    assert signer.verify(token) == original
    assert signer.verify(token.encode()) == original
    assert signer.verify(token).to_json() == original.to_json()
    assert signer.current == "k1"


@pytest.mark.parametrize("key", ["o-1", 42, "ключ 🔑"])
def test_round_trip_of_any_key(key: str | int) -> None:
    signer = Signer(keys={"k1": K1}, current="k1")
    assert signer.verify(signer.sign(intent(key=key))).key == key


def test_key_rotation() -> None:
    old = Signer(keys={"k1": K1}, current="k1")
    rotated = Signer(keys={"k2": K2, "k1": K1}, current="k2")
    in_flight = old.sign(intent(id="old"))
    assert rotated.verify(in_flight).id == "old"  # the old key still verifies
    fresh = rotated.sign(intent(id="new"))
    assert fresh.startswith("k2.")  # the new key signs
    assert rotated.verify(fresh).id == "new"
    with pytest.raises(InvalidIntent, match="unknown key"):
        old.verify(fresh)  # a node that has not rotated yet does not know k2
    retired = Signer(keys={"k2": K2}, current="k2")
    with pytest.raises(InvalidIntent, match="unknown key"):
        retired.verify(in_flight)  # once k1 is dropped, its tokens are refused


def test_same_key_id_with_another_secret_is_refused() -> None:
    ours = Signer(keys={"k1": K1}, current="k1")
    theirs = Signer(keys={"k1": K2}, current="k1")
    with pytest.raises(InvalidIntent, match="tampered"):
        ours.verify(theirs.sign(intent()))


def test_tampered_payload_is_refused() -> None:
    signer = Signer(keys={"k1": K1}, current="k1")
    kid, body, mac = signer.sign(intent(expected_version=3)).split(".")
    data = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    data["expected_version"] = 4
    evil = b64(json.dumps(data, sort_keys=True, separators=(",", ":")).encode())
    with pytest.raises(InvalidIntent, match="tampered"):
        signer.verify(f"{kid}.{evil}.{mac}")
    # every single-character change of the payload is refused
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    for i in range(len(body)):
        changed = body[:i] + alphabet[(alphabet.index(body[i]) + 1) % 64] + body[i + 1 :]
        with pytest.raises(InvalidIntent):
            signer.verify(f"{kid}.{changed}.{mac}")
    with pytest.raises(InvalidIntent):
        signer.verify(f"{kid}.{body}A.{mac}")
    with pytest.raises(InvalidIntent):
        signer.verify(f"{kid}.{body[:-1]}.{mac}")


def test_tampered_mac_is_refused() -> None:
    signer = Signer(keys={"k1": K1}, current="k1")
    token = signer.sign(intent())
    kid, body, mac = token.split(".")
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
    for i in range(len(mac)):
        for shift in (1, 2, 32):
            changed = mac[:i] + alphabet[(alphabet.index(mac[i]) + shift) % 64] + mac[i + 1 :]
            with pytest.raises(InvalidIntent):
                signer.verify(f"{kid}.{body}.{changed}")
    # other spellings of the same MAC bytes are not the token either
    for variant in (mac + "=", mac + "==", mac[:5] + "*" + mac[5:], mac + "\n", " " + mac, ""):
        with pytest.raises(InvalidIntent):
            signer.verify(f"{kid}.{body}.{variant}")
    with pytest.raises(InvalidIntent):
        signer.verify(f"{kid}.{body}.{mac[:-1]}")


def test_key_id_is_covered_by_the_mac() -> None:
    signer = Signer(keys={"k1": K1, "k2": K1}, current="k1")  # same secret, other id
    _, body, mac = signer.sign(intent()).split(".")
    with pytest.raises(InvalidIntent, match="tampered"):
        signer.verify(f"k2.{body}.{mac}")


@pytest.mark.parametrize("kid", ["k9", "", "K1", "k1 ", "../k1"])
def test_unknown_key_id_is_refused(kid: str) -> None:
    signer = Signer(keys={"k1": K1}, current="k1")
    _, body, mac = signer.sign(intent()).split(".")
    with pytest.raises(InvalidIntent):
        signer.verify(f"{kid}.{body}.{mac}")


def test_unsigned_plain_json_is_refused() -> None:
    signer = Signer(keys={"k1": K1}, current="k1")
    plain = intent().to_json()
    with pytest.raises(InvalidIntent, match="not signed"):
        signer.verify(plain)
    with pytest.raises(InvalidIntent):
        signer.verify(plain.encode())


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        ".",
        "..",
        "...",
        "k1..",
        "k1.x.y.z",
        "k1.!!!.???",
        "a" * 200_000,
        "k1." + "A" * 200_000 + ".x",
        "\x00",
        b"\xff\xfe",
        b"k1.\x80.\x81",
    ],
    ids=[
        "empty",
        "one dot",
        "two dots",
        "three dots",
        "empty parts",
        "four parts",
        "not base64",
        "long",
        "long payload",
        "NUL",
        "bytes not UTF-8",
        "bytes not ASCII",
    ],
)
def test_garbage_is_refused(garbage: str | bytes) -> None:
    signer = Signer(keys={"k1": K1}, current="k1")
    with pytest.raises(InvalidIntent):
        signer.verify(garbage)


@pytest.mark.parametrize("token", ["k1.é.x", "ключ.abc.def", "k1.abc.déf", "k1.🔑.x"])
def test_non_ascii_is_refused(token: str) -> None:
    signer = Signer(keys={"k1": K1}, current="k1")
    with pytest.raises(InvalidIntent):
        signer.verify(token)
    with pytest.raises(InvalidIntent):
        signer.verify(token.encode())


@pytest.mark.parametrize("value", [None, 5, ["k1.a.b"], {"token": "x"}, bytearray(b"k1.a.b")])
def test_non_text_is_refused(value: Any) -> None:
    signer = Signer(keys={"k1": K1}, current="k1")
    with pytest.raises(InvalidIntent):
        signer.verify(value)


@pytest.mark.parametrize(
    "body_text",
    [
        "not json",
        "[]",
        "{}",
        '{"v": 2}',
        json.dumps({**intent().to_dict(), "extra": 1}),
        json.dumps({**intent().to_dict(), "expected_version": -1}),
        json.dumps({**intent().to_dict(), "decided_at": float("nan")}),
    ],
)
def test_signed_but_invalid_intent_is_refused(body_text: str) -> None:
    # A valid MAC does not make a malformed payload acceptable.
    signer = Signer(keys={"k1": K1}, current="k1")
    with pytest.raises(InvalidIntent):
        signer.verify(forge("k1", K1, body_text))
    assert signer.verify(forge("k1", K1, intent().to_json())) == intent()


@pytest.mark.parametrize(
    ("value", "name"),
    [(None, "NoneType"), ("i-1", "str"), (intent().to_dict(), "dict"), (intent().to_json(), "str")],
)
def test_sign_needs_an_intent(value: Any, name: str) -> None:
    with pytest.raises(InvalidIntent) as raised:
        Signer(keys={"k1": K1}, current="k1").sign(value)
    assert str(raised.value) == f"can only sign an Intent, not {name}"


_KEY_ID = (
    "key ids must be strings of 1-32 letters, digits, _ or -"
    " (one is a {}; keys maps key id -> secret bytes)"
)
_SHORT = "key {!r} must be at least 16 bytes (use secrets.token_bytes(32))"
_CURRENT = "current must be one of the key ids ['k1']; it is not"


@pytest.mark.parametrize(
    ("keys", "current", "message"),
    [
        ({}, "k1", "a Signer needs at least one key"),
        ({"k1": K1}, "k2", _CURRENT),
        ({"k1": K1}, None, _CURRENT),
        ({"k1": b"short"}, "k1", _SHORT.format("k1")),
        ({"k1": b""}, "k1", _SHORT.format("k1")),
        ({"k1": K1.decode()}, "k1", _SHORT.format("k1")),
        ({"k1": None}, "k1", _SHORT.format("k1")),
        ({"": K1}, "", _KEY_ID.format("str")),
        ({"k 1": K1}, "k 1", _KEY_ID.format("str")),
        ({"k.1": K1}, "k.1", _KEY_ID.format("str")),
        ({"k" * 33: K1}, "k" * 33, _KEY_ID.format("str")),
        ({"ключ": K1}, "ключ", _KEY_ID.format("str")),
        ({1: K1}, 1, _KEY_ID.format("int")),
        ({"k1": K1, "k2": b"x"}, "k1", _SHORT.format("k2")),
    ],
    ids=[
        "no key",
        "current unknown",
        "current None",
        "short secret",
        "empty secret",
        "text secret",
        "None secret",
        "empty id",
        "id with a space",
        "id with a dot",
        "id of 33",
        "id not ASCII",
        "id not text",
        "one short secret",
    ],
)
def test_bad_key_config_is_a_configuration_error(keys: Any, current: Any, message: str) -> None:
    with pytest.raises(ConfigurationError) as raised:
        Signer(keys=keys, current=current)
    assert str(raised.value) == message


def _mac(body: str) -> str:
    return b64(hmac.new(K1, f"k1.{body}".encode(), hashlib.sha256).digest())


_NOT_SIGNED = "intent is not signed (expected '<key id>.<payload>.<mac>')"
_LARGE = "signed intent is too large or not ASCII"


@pytest.mark.parametrize(
    ("token", "message"),
    [
        (b"\xff\xfe", "signed intent is not ASCII"),
        (5, "signed intent must be a string, not int"),
        (None, "signed intent must be a string, not NoneType"),
        (bytearray(b"k1.a.b"), "signed intent must be a string, not bytearray"),
        ("k1.\u00e9.x", _LARGE),
        ("a" * (2 * 64 * 1024 + 1), _LARGE),
        ("a" * (2 * 64 * 1024), _NOT_SIGNED),  # at most twice the largest intent: read
        ("k1.x.y.z", _NOT_SIGNED),
        ("k9.a.b", "intent is signed with unknown key id 'k9'"),
        ("k1.a.b", "intent signature does not match: the message was tampered with"),
        ("k1.A." + _mac("A"), "signed intent is not valid base64url"),
    ],
    ids=[
        "bytes not ASCII",
        "int",
        "None",
        "bytearray",
        "text not ASCII",
        "one over twice the largest intent",
        "twice the largest intent",
        "four parts",
        "unknown key id",
        "wrong MAC",
        "signed but not base64url",
    ],
)
def test_a_refused_token_says_why(token: Any, message: str) -> None:
    with pytest.raises(InvalidIntent) as raised:
        Signer(keys={"k1": K1}, current="k1").verify(token)
    assert str(raised.value) == message


def test_signer_does_not_share_the_callers_key_dict() -> None:
    keys = {"k1": K1}
    signer = Signer(keys=keys, current="k1")
    token = signer.sign(intent())
    keys["k1"] = K2
    assert signer.verify(token) == intent()


# -- signed text (an HTTP ETag's signature: fencing.contrib.http) ------------------------
def test_signed_text_is_the_hmac_of_key_id_purpose_and_text() -> None:
    signer = Signer({"k1": K1}, current="k1")
    mac = hmac.new(K1, b'k1.etag:["o-1",3]', hashlib.sha256).digest()
    assert signer.sign_text("etag", '["o-1",3]') == f"k1.{b64(mac)}"


def test_signed_text_may_hold_a_lone_surrogate() -> None:
    """A text is signed as its UTF-8 bytes, a lone surrogate written as it stands
    (``surrogatepass``): any ``str`` can be signed, none raises."""
    signer = Signer({"k1": K1}, current="k1")
    mac = hmac.new(K1, b"k1.etag:a\xed\xa0\x80b", hashlib.sha256).digest()
    assert signer.sign_text("etag", "a\ud800b") == f"k1.{b64(mac)}"
    assert signer.verify_text("etag", "a\ud800b", f"k1.{b64(mac)}")
    assert not signer.verify_text("etag", "a\udc00b", f"k1.{b64(mac)}")


def test_signed_text_verifies_with_any_known_key_and_nothing_else() -> None:
    old = Signer({"k1": K1}, current="k1").sign_text("etag", "v3")
    rotated = Signer({"k1": K1, "k2": K2}, current="k2")
    assert rotated.verify_text("etag", "v3", old)
    assert rotated.verify_text("etag", "v3", rotated.sign_text("etag", "v3"))
    assert rotated.sign_text("etag", "v3").startswith("k2.")
    assert not rotated.verify_text("etag", "v4", old)  # another text
    assert not rotated.verify_text("other", "v3", old)  # another purpose
    assert not Signer({"k2": K2}, current="k2").verify_text("etag", "v3", old)  # key dropped
    assert not rotated.verify_text("etag", "v3", old[:-1] + ("A" if old[-1] != "A" else "B"))
    assert not rotated.verify_text("etag", "v3", "k1." + "é" * 43)  # not ASCII: no error
    assert not rotated.verify_text("etag", "v3", old.replace("k1.", "k9."))


def test_signed_text_cannot_stand_for_a_signed_intent() -> None:
    """An intent's MAC covers '<kid>.<base64url>'; a text's '<kid>.<purpose>:<text>':
    the ':' keeps the two apart, whatever text is signed."""
    signer = Signer({"k1": K1}, current="k1")
    body = b64(intent().to_json().encode())
    kid, mac = signer.sign_text("etag", "x").split(".")
    with pytest.raises(InvalidIntent, match="tampered"):
        signer.verify(f"{kid}.{body}.{mac}")
    for purpose in ("", "Etag", "a:b", "x" * 33):
        with pytest.raises(ConfigurationError) as refused:
            signer.sign_text(purpose, "x")
        assert str(refused.value) == "a purpose is 1-32 lowercase letters, digits or -"
        assert not signer.verify_text(purpose, "x", signer.sign_text("etag", "x"))
