"""Sealing what a generation's Redis record must not hold in clear.

A generation's record (:mod:`streamsafe.gateway.replicas.generation_record`) is what another replica
needs to continue it when its owner dies: the request body (the prompt) and the client headers
it goes upstream with (``X-LlamaStack-Provider-Data``: a Llama Stack provider's API keys). Redis
kept both in clear for the record's lifetime (up to ``--orphan-ttl`` after an owner's death).

With a secret the replicas share (``--redis-secret``, ``STREAMSAFE_REDIS_SECRET``) both are
sealed with AES-256-GCM (:class:`RecordSeal`): a key derived from the secret by HKDF-SHA256, a
random 96-bit nonce per field, the generation id and the field's name as associated data (a
sealed field copied into another generation's record does not open). Without one, the provider
data is never written to Redis: a generation that carried it is not continued by another
replica (it ends with a 503 there, rather than run under other credentials), and the prompt is
kept in clear, as another replica needs it.
"""

from __future__ import annotations

import os

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

__all__ = ["SEALED", "RecordSeal", "Unreadable", "Unsealable"]

#: What a sealed field begins with (a JSON body or header lines never begin with a NUL).
SEALED = b"\x00ss1"
_NONCE = 12


class Unreadable(Exception):
    """A generation's Redis record that this replica cannot read (malformed, or sealed)."""


class Unsealable(Unreadable):
    """A sealed field that this replica cannot open: no secret, another secret, or altered."""


class RecordSeal:
    """Seals and opens record fields with a key derived from ``secret`` (see the module)."""

    __slots__ = ("_aead",)

    def __init__(self, secret: str) -> None:
        if not secret:
            raise ValueError("the Redis secret must not be empty")
        key = HKDF(
            algorithm=hashes.SHA256(), length=32, salt=None, info=b"streamsafe redis record v1"
        ).derive(secret.encode())
        self._aead = AESGCM(key)

    def seal(self, gen_id: str, field: str, data: bytes) -> bytes:
        """``data``, sealed for field ``field`` of generation ``gen_id``."""
        nonce = os.urandom(_NONCE)
        return SEALED + nonce + self._aead.encrypt(nonce, data, _context(gen_id, field))

    def open(self, gen_id: str, field: str, sealed: bytes) -> bytes:
        """What :meth:`seal` sealed; :class:`Unsealable` where it cannot be opened."""
        head = len(SEALED)
        nonce, box = sealed[head : head + _NONCE], sealed[head + _NONCE :]
        try:
            return self._aead.decrypt(nonce, box, _context(gen_id, field))
        except InvalidTag:
            msg = f"{gen_id}: the record's {field} was sealed with another secret, or altered"
            raise Unsealable(msg) from None


def _context(gen_id: str, field: str) -> bytes:
    return gen_id.encode() + b"\0" + field.encode()
