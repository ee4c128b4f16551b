"""Connectors between the Attention and FFN roles: the contract (:mod:`.base`), gloo (CPU) and an in-process loopback."""
