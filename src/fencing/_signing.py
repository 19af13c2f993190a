"""HMAC-SHA256 signing of intents, with key rotation. No I/O."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Mapping

from ._errors import ConfigurationError, InvalidIntent
from ._values import MAX_INTENT_BYTES, Intent

__all__ = ["Signer"]

_KID = re.compile(r"[A-Za-z0-9_\-]{1,32}")
_MIN_KEY_BYTES = 16
_PURPOSE = re.compile(r"[a-z0-9\-]{1,32}")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class Signer:
    """Signs intents so that a tampered or forged task message is refused.

    ``keys`` maps key ids to secrets; ``current`` signs, every key verifies, so a
    key can be rotated: add the new key, make it current, and drop the old one
    once no message signed with it can still be in flight.

    A token is ``<key id>.<base64url intent JSON>.<base64url HMAC-SHA256>``; the MAC
    covers the key id and the payload.
    """

    __slots__ = ("_current", "_keys")

    def __init__(self, keys: Mapping[str, bytes], current: str) -> None:
        if not keys:
            raise ConfigurationError("a Signer needs at least one key")
        for kid, secret in keys.items():
            if not isinstance(kid, str) or _KID.fullmatch(kid) is None:
                # not echoed: a swapped {secret: id} mapping would print the secret
                raise ConfigurationError(
                    "key ids must be strings of 1-32 letters, digits, _ or -"
                    f" (one is a {type(kid).__name__}; keys maps key id -> secret bytes)"
                )
            if not isinstance(secret, bytes) or len(secret) < _MIN_KEY_BYTES:
                raise ConfigurationError(
                    f"key {kid!r} must be at least {_MIN_KEY_BYTES} bytes"
                    " (use secrets.token_bytes(32))"
                )
        if current not in keys:
            # not echoed: a secret passed as ``current`` by mistake would be printed
            raise ConfigurationError(
                f"current must be one of the key ids {sorted(keys)}; it is not"
            )
        self._keys = dict(keys)
        self._current = current

    @property
    def current(self) -> str:
        return self._current

    def _mac(self, kid: str, body: str) -> bytes:
        return hmac.new(self._keys[kid], f"{kid}.{body}".encode("ascii"), hashlib.sha256).digest()

    def sign(self, intent: Intent) -> str:
        """A signed token carrying the intent."""
        if not isinstance(intent, Intent):
            raise InvalidIntent(f"can only sign an Intent, not {type(intent).__name__}")
        body = _b64(intent.to_json().encode())
        return f"{self._current}.{body}.{_b64(self._mac(self._current, body))}"

    def sign_text(self, purpose: str, text: str) -> str:
        """``<key id>.<base64url HMAC-SHA256>`` of ``text`` for ``purpose`` (e.g. ``"etag"``),
        with the current key. The MAC covers the key id, the purpose and the text; a
        purpose's ``:`` keeps these MACs apart from any intent token's (whose payload is
        base64url only), and apart between purposes."""
        if _PURPOSE.fullmatch(purpose) is None:
            raise ConfigurationError("a purpose is 1-32 lowercase letters, digits or -")
        return f"{self._current}.{_b64(self._text_mac(self._current, purpose, text))}"

    def verify_text(self, purpose: str, text: str, signature: str) -> bool:
        """Whether ``signature`` (from :meth:`sign_text`, with any known key) signs ``text``
        for ``purpose``."""
        kid, _, mac_text = signature.partition(".")
        if not signature.isascii() or kid not in self._keys or _PURPOSE.fullmatch(purpose) is None:
            return False
        return hmac.compare_digest(mac_text, _b64(self._text_mac(kid, purpose, text)))

    def _text_mac(self, kid: str, purpose: str, text: str) -> bytes:
        message = f"{kid}.{purpose}:{text}".encode("utf-8", "surrogatepass")
        return hmac.new(self._keys[kid], message, hashlib.sha256).digest()

    def verify(self, token: str | bytes) -> Intent:
        """The intent in a token; :class:`InvalidIntent` if tampered, unsigned or unknown-key."""
        if isinstance(token, bytes):
            try:
                token = token.decode("ascii")
            except UnicodeDecodeError:
                raise InvalidIntent("signed intent is not ASCII") from None
        if not isinstance(token, str):
            raise InvalidIntent(f"signed intent must be a string, not {type(token).__name__}")
        if len(token) > 2 * MAX_INTENT_BYTES or not token.isascii():
            raise InvalidIntent("signed intent is too large or not ASCII")
        parts = token.split(".")
        if len(parts) != 3:
            raise InvalidIntent("intent is not signed (expected '<key id>.<payload>.<mac>')")
        kid, body, mac_text = parts
        if kid not in self._keys:
            raise InvalidIntent(f"intent is signed with unknown key id {kid!r}")
        # Compare the MAC as text: decoding first would accept other spellings of the
        # same bytes (padding, stray characters, unused trailing bits).
        if not hmac.compare_digest(mac_text, _b64(self._mac(kid, body))):
            raise InvalidIntent("intent signature does not match: the message was tampered with")
        try:
            payload = _unb64(body)
        except (binascii.Error, ValueError):
            raise InvalidIntent("signed intent is not valid base64url") from None
        return Intent.from_json(payload)
