"""The point-to-point connector protocol, over one of several data planes (gloo for CPU tensors,
NCCL for CUDA tensors, CAM kernels on Ascend NPUs): described in docs/design.md, section
"Wire protocol".

One module per job: :mod:`.wire` (the step channel's messages), :mod:`.plane` (a data plane's
transfers), :mod:`.rendezvous` (the group's store and its data plane), :mod:`.attention` and
:mod:`.ffn` (the two sides), :mod:`.watchdog` (the Attention side's watch on a vanished FFN worker).
"""
