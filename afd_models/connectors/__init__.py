"""Connectors between the Attention and FFN roles, as transports: the interface (:mod:`.base`),
the connector table (:mod:`.specs`), what a builder is handed (:mod:`.build`), and the
point-to-point protocol (:mod:`.p2p`) over gloo (CPU), NCCL (CUDA) and CAM (Ascend NPU).

Transports import no worker, model or FFN server (``tests/unit/test_import_graph.py``): what
connects a worker's model to its connector, and the in-process loopback connector built around an
FFN model, is the floor above (:mod:`afd_models.wiring`)."""
