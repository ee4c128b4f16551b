"""The opening of every step channel: the FFN worker's hello and, where the deployment has a
shared secret, a mutual challenge-response that comes before any rank, fingerprint or tensor
(docs/design.md, section "Authentication").

The FFN side sends its hello (a magic, whether it authenticates, a fresh nonce). With a secret,
the Attention side answers with a fresh nonce of its own and an HMAC-SHA256 over both nonces; the
FFN side checks it and proves the secret back with an HMAC of its own role over the same nonces.
Each side's nonce is new per connection, so a recorded exchange proves nothing on another one,
and the role in each MAC keeps one side's proof from serving as the other's.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import socket
import struct

from afd_models.connectors.base import AFDConnectionError
from afd_models.connectors.p2p.wire import read_into
from afd_models.connectors.specs import AUTH_TOKEN_ENV

#: bytes of each side's nonce
NONCE_BYTES = 32
#: bytes of a proof (an HMAC-SHA256)
PROOF_BYTES = hashlib.sha256().digest_size
#: the FFN side's first message on a step channel: magic, whether it authenticates, its nonce
HELLO = struct.Struct(f"!8s?{NONCE_BYTES}s")
#: what a hello begins with (the protocol and its version)
MAGIC = b"AFD-P2P1"
#: how the secret's two ways in are named to an operator
SECRET_SOURCES = f"{AUTH_TOKEN_ENV} or additional_config.afd.auth_token_file"


class AuthenticationError(AFDConnectionError):
    """The peer did not prove the shared secret; the message says how."""


def _proof(secret: bytes, role: bytes, ffn_nonce: bytes, attention_nonce: bytes) -> bytes:
    message = b"afd-auth/1 " + role + b"\0" + ffn_nonce + attention_nonce
    return hmac.new(secret, message, hashlib.sha256).digest()


def send_hello(channel: socket.socket, secret: bytes | None) -> bytes:
    """FFN side: open the step channel with the hello (whether ``secret`` is asked for, and a
    fresh nonce); the nonce, for :func:`check_proof`."""
    ffn_nonce = secrets.token_bytes(NONCE_BYTES)
    channel.sendall(HELLO.pack(MAGIC, secret is not None, ffn_nonce))
    return ffn_nonce


def check_proof(channel: socket.socket, secret: bytes, ffn_nonce: bytes, deadline: float) -> None:
    """FFN side, after the hello: check the peer's proof of ``secret`` by ``deadline``
    (``time.monotonic()``) and prove the secret back.

    Raises:
        AuthenticationError: the peer's proof is wrong.
        TimeoutError: the peer sent no whole proof by ``deadline``.
        OSError: the connection failed or closed.
    """
    reply = bytearray(NONCE_BYTES + PROOF_BYTES)
    read_into(channel, memoryview(reply), deadline)
    attention_nonce, proof = bytes(reply[:NONCE_BYTES]), bytes(reply[NONCE_BYTES:])
    if not hmac.compare_digest(proof, _proof(secret, b"attention", ffn_nonce, attention_nonce)):
        raise AuthenticationError(
            "its proof of the shared secret is wrong (no secret, another secret, or an exchange "
            "recorded from another connection)"
        )
    channel.sendall(_proof(secret, b"ffn", ffn_nonce, attention_nonce))


def respond(channel: socket.socket, secret: bytes | None) -> None:
    """Attention side: read the FFN side's hello and, where it authenticates, prove the secret
    and check the FFN side's proof (each read within the channel's timeout).

    Raises:
        AFDConnectionError: the other end is not an AFD FFN worker of this protocol, or one of
            the two has a secret and the other none.
        AuthenticationError: the FFN side closed the channel at our proof (another secret) or
            proved a different secret.
        TimeoutError, OSError: as :func:`~afd_models.connectors.p2p.wire.read_into`.
    """
    hello = bytearray(HELLO.size)
    read_into(channel, memoryview(hello))
    magic, authenticates, ffn_nonce = HELLO.unpack(hello)
    if magic != MAGIC:
        raise AFDConnectionError(
            f"it opened the step channel with {bytes(hello[:8])!r}, not {MAGIC!r} (is it an AFD "
            "FFN worker of the same vllm-afd-overlay version?)"
        )
    if authenticates and secret is None:
        raise AFDConnectionError(
            "it requires the deployment's shared secret, and this engine has none: set the same "
            f"secret on both roles ({SECRET_SOURCES})"
        )
    if not authenticates and secret is not None:
        raise AFDConnectionError(
            "it does not authenticate its peers, but this engine has a shared secret: an FFN "
            "side without it could be anyone; set the same secret on the FFN engine "
            f"({SECRET_SOURCES})"
        )
    if secret is None:
        return
    attention_nonce = secrets.token_bytes(NONCE_BYTES)
    channel.sendall(attention_nonce + _proof(secret, b"attention", ffn_nonce, attention_nonce))
    proof = bytearray(PROOF_BYTES)
    try:
        read_into(channel, memoryview(proof))
    except ConnectionError:
        raise AuthenticationError(
            "it closed the step channel at this engine's proof of the shared secret: the two "
            f"roles have different secrets ({SECRET_SOURCES})"
        ) from None
    if not hmac.compare_digest(bytes(proof), _proof(secret, b"ffn", ffn_nonce, attention_nonce)):
        raise AuthenticationError(
            "its proof of the shared secret is wrong: it has another secret, or is not the "
            "deployment's FFN worker"
        )
