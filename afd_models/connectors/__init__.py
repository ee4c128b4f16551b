"""Connectors between the Attention and FFN roles: the interface (:mod:`.base`), the connector
table (:mod:`.specs`), the factory (:mod:`.factory`), the point-to-point protocol (:mod:`.p2p`) over
gloo (CPU), NCCL (CUDA) and CAM (Ascend NPU), and an in-process loopback."""
