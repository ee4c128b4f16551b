"""A step the Attention engine failed because its FFN peer stayed away.

With ``peer_restart_timeout_s``, a step whose FFN engine went away waits for a restarted one
(:func:`afd_models.runner_roles.forward_across_restarts`). When none came back in time, the
Attention runner returns a :class:`FailedStepOutput` in place of the step's output: it names
the step's requests and samples no token for them. vLLM's engine core hands it to the scheduler
unsampled (a step whose ``execute_model`` returned an output is not sampled), and the AFD
scheduler (``--scheduler-cls afd_models.scheduler.AFDScheduler``) finishes those requests with
an error through vLLM's own path and takes the blocks they hold out of the prefix cache (the
step wrote some of them only up to the layer it lost). Nothing else stops: the engine serves its next
step once an FFN engine is connected again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm.v1.outputs import ModelRunnerOutput

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput


@dataclass
class FailedStepOutput(ModelRunnerOutput):
    """The output of a step that did not run: no token for any of its requests (the Attention
    worker logged why)."""


def failed_step_output(scheduler_output: SchedulerOutput) -> FailedStepOutput:
    """The failed output of the step ``scheduler_output`` scheduled."""
    req_ids = list(scheduler_output.num_scheduled_tokens)
    return FailedStepOutput(
        req_ids=req_ids, req_id_to_index={req_id: index for index, req_id in enumerate(req_ids)}
    )


def failed_requests(model_runner_output: Any) -> list[str]:
    """The requests of a failed step (none for a step that ran)."""
    if isinstance(model_runner_output, FailedStepOutput):
        req_ids: list[str] = model_runner_output.req_ids
        return req_ids
    return []


def kv_blocks(kv_cache_manager: Any, req_ids: list[str]) -> set[int]:
    """Every KV-cache block the requests ``req_ids`` hold, in every KV-cache group."""
    return {
        block
        for req_id in req_ids
        for group in kv_cache_manager.get_block_ids(req_id)
        for block in group
    }
