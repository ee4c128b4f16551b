"""The scheduler class operators name on the Attention engine's command line with
``peer_restart_timeout_s`` (``--scheduler-cls afd_models.scheduler.AFDScheduler``): past the
timeout it fails the requests of the step the FFN role did not come back for, and the engine
stays up (docs/user-guide.md, "Restarting a role").

It is generated from ``overlay/vllm/v1/core/sched/scheduler.py``; this module only names it.
"""

from afd_models.freshness import check_generated_code

# before the generated import: a stale checkout fails here with the command that fixes it
check_generated_code()

from afd_models._generated.vllm.v1.core.sched.scheduler import AFDScheduler  # noqa: E402

#: the dotted path of :class:`AFDScheduler`, as ``--scheduler-cls`` takes it
SCHEDULER_CLS = f"{__name__}.AFDScheduler"

__all__ = ["SCHEDULER_CLS", "AFDScheduler"]
