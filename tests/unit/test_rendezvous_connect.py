"""The Attention side's connect to an FFN worker's rendezvous refuses a connection TCP made to
itself: dialling a local port no one listens on can join the socket to itself when the kernel
picks that very port as its ephemeral one, and the FFN worker could then not bind there (seen in
CI: a restarted FFN engine's TP lane 1 failed with "Address already in use")."""

from __future__ import annotations

import socket

from afd_models.connectors.p2p.rendezvous import connected_to_itself


def test_a_socket_joined_to_itself_is_told_apart_from_a_real_connection() -> None:
    with socket.socket() as lonely:
        lonely.bind(("127.0.0.1", 0))
        lonely.connect(lonely.getsockname())  # a simultaneous open with itself
        assert connected_to_itself(lonely)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        with socket.create_connection(listener.getsockname(), timeout=5) as client:
            accepted, _ = listener.accept()
            with accepted:
                assert not connected_to_itself(client)
                assert not connected_to_itself(accepted)
