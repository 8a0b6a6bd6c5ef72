"""Sealing what Redis must not hold in clear: a generation's record, its answer, and the names
its caller chose.

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

The answer, the generation's event log (a Redis Stream), is sealed entry by entry with the same
key (:meth:`RecordSeal.seal_entries`): each entry keeps its own stream id, so a resume still reads
from its offset with one ``XRANGE``, and the generation id and the entry's offset are its
associated data (an entry moved to another offset, or another log, does not open). An entry's
nonce is built as NIST SP 800-38D (8.2.1) describes, with no system call per chunk: 64 random bits
drawn once per process (redrawn every 2**32 entries) and a 32-bit count of the entries it
sealed, so no two entries a process seals share one, and two processes would need the same
random field (a handful of replica processes per secret: no collision in practice). The copy of
the log in the writer's process stays in clear. The caller's idempotency key and the record's
fingerprint (an unkeyed hash of the body, which a guess of the prompt could be checked against)
are sealed in the record too.

No caller-chosen string is ever part of a Redis key name (:func:`key_name`): an idempotency key,
or a tenant and the fingerprint of a body, name their key by a hash of them, keyed (HMAC-SHA256
with a second key derived from the secret) where there is a secret, SHA-256 where there is none.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

__all__ = ["SEALED", "RecordSeal", "Unreadable", "Unsealable", "key_name"]

#: What a sealed field begins with (a JSON body or header lines never begin with a NUL).
SEALED = b"\x00ss1"
_NONCE = 12
#: Entries one nonce field seals before it is redrawn (the count is 32 bits).
_MAX_ENTRIES = 2**32 - 1
#: Hex digits of a hashed key name: 128 bits, no collision among any number of live keys.
_NAME_HEX = 32


class Unreadable(Exception):
    """A generation's Redis record that this replica cannot read (malformed, or sealed)."""


class Unsealable(Unreadable):
    """A sealed field that this replica cannot open: no secret, another secret, or altered."""


class RecordSeal:
    """Seals and opens record fields with a key derived from ``secret`` (see the module)."""

    __slots__ = ("_aead", "_entries", "_entry_nonce", "_name_key")

    def __init__(self, secret: str) -> None:
        if not secret:
            raise ValueError("the Redis secret must not be empty")
        self._aead = AESGCM(_derive(secret, b"streamsafe redis record v1"))
        # A key of its own: a key name is no ciphertext, and the names of two fleets under
        # different secrets never match.
        self._name_key = _derive(secret, b"streamsafe redis key names v1")
        # The fixed field of the entries' nonces, and the entries sealed with it (see the
        # module).
        self._entry_nonce = os.urandom(_NONCE - 4)
        self._entries = 0

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

    def seal_entries(self, gen_id: bytes, first: int, payloads: Sequence[bytes]) -> list[bytes]:
        """``payloads``, the entries of generation ``gen_id``'s log from offset ``first`` on,
        each sealed for its offset."""
        if self._entries + len(payloads) > _MAX_ENTRIES:
            self._entry_nonce, self._entries = os.urandom(_NONCE - 4), 0
        field, count = self._entry_nonce, self._entries
        self._entries = count + len(payloads)
        encrypt = self._aead.encrypt
        out = []
        for i, payload in enumerate(payloads):
            nonce = field + (count + i).to_bytes(4, "big")
            out.append(nonce + encrypt(nonce, payload, b"%b\0log\0%d" % (gen_id, first + i)))
        return out

    def open_entry(self, gen_id: bytes, offset: int, sealed: bytes) -> bytes:
        """What :meth:`seal_entries` sealed at ``offset``; :class:`Unsealable` where it cannot
        be opened."""
        try:
            return self._aead.decrypt(
                sealed[:_NONCE], sealed[_NONCE:], b"%b\0log\0%d" % (gen_id, offset)
            )
        except InvalidTag:
            msg = (
                f"{gen_id.decode(errors='replace')}: its event log was sealed with another"
                " secret, or altered"
            )
            raise Unsealable(msg) from None

    def name(self, text: str) -> str:
        """``text``'s keyed hash, for a Redis key name (see :func:`key_name`)."""
        digest = hmac.digest(self._name_key, text.encode(), "sha256")
        return digest.hex()[:_NAME_HEX]


def key_name(text: str, seal: RecordSeal | None) -> str:
    """What stands for the caller-chosen ``text`` in a Redis key name: its HMAC-SHA256 under the
    secret's key where there is one (nobody without the secret can test a guess against it), its
    SHA-256 where there is none; 32 hex digits either way."""
    if seal is not None:
        return seal.name(text)
    return hashlib.sha256(text.encode()).hexdigest()[:_NAME_HEX]


def _derive(secret: str, info: bytes) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=info).derive(secret.encode())


def _context(gen_id: str, field: str) -> bytes:
    return gen_id.encode() + b"\0" + field.encode()
