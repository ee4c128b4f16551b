"""AFD edits to vLLM's scheduler (``vllm/v1/core/sched/scheduler.py``).

With ``peer_restart_timeout_s``, the Attention engine is launched with ``--scheduler-cls
afd_models.scheduler.AFDScheduler``. When its FFN peer stayed away past the timeout, the Attention
runner returns a failed step (:class:`afd_models.step_failures.FailedStepOutput`) in place of the
step's output; this scheduler finishes its requests with an error through vLLM's own error path,
the one that fails requests whose grammar did not compile, takes the blocks the step wrote out of
the prefix cache, and the engine keeps serving.
"""

from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutputs
from vllm.v1.outputs import ModelRunnerOutput

from afd_models.step_failures import failed_requests, kv_blocks
from codegen.markers import contract, override, subclass


@subclass(
    feature="failing the requests of a step the FFN role did not come back for "
    "(peer_restart_timeout_s)",
    relies_on={
        "update_from_output": (
            contract(
                """
                error_req_ids = set(self.grammar_compile_error_reqs)
                self.grammar_compile_error_reqs.clear()
                """,
                id="error-requests-collected",
                if_broken="the requests of a failed AFD step would not be finished, and their "
                "clients would wait for tokens that never come",
            ),
            contract(
                "error_reqs = self.finish_requests(error_req_ids, RequestStatus.FINISHED_ERROR)",
                id="error-requests-finished-with-error",
                if_broken="the requests of a failed AFD step would not end with an error finish",
            ),
        )
    },
)
class AFDScheduler(Scheduler):
    """vLLM's scheduler, failing the requests of a step the AFD Attention runner gave up on."""

    @override
    def update_from_output(
        self,
        scheduler_output: SchedulerOutput,
        model_runner_output: ModelRunnerOutput,
    ) -> dict[int, EngineCoreOutputs]:
        failed = failed_requests(model_runner_output)
        if failed:
            # upstream cached the step's full blocks when it scheduled it, but the lost step
            # wrote their KV cache only up to the layer it lost: no later request may hit them
            self.kv_cache_manager.evict_blocks(kv_blocks(self.kv_cache_manager, failed))
            # upstream finishes the requests of this set with FINISHED_ERROR once it processed
            # the step (a failed step sampled no token for them)
            self.grammar_compile_error_reqs.update(failed)
        return super().update_from_output(scheduler_output, model_runner_output)
