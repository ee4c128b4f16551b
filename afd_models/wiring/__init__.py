"""How a worker's model meets its connector: the floor above the transports
(:mod:`afd_models.connectors`), the models (:mod:`afd_models.models`), the FFN server and the
worker checks, which it may all import; the transports import none of them.

* :mod:`~afd_models.wiring.connect`: each worker's connect step, from its config, its place in
  the topology and its loaded model (whose fingerprint the connector presents);
* :mod:`~afd_models.wiring.loopback`: the in-process loopback connector, whose "FFN peer" is an
  FFN-role model built in the Attention worker.
"""
