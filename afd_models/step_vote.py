"""How the workers of one engine that run every step together agree on a step lost to a restart.

With ``peer_restart_timeout_s``, a step whose peer role went away is held and run again once a
restarted peer connected. Alone, a worker decides that by itself. Workers with partners cannot:
TP partners meet in collectives at every layer, and the DP ranks of one Attention engine send
every step to the same FFN rank, so a worker that ran a step again alone would meet its partners
at the wrong layer, or keep its FFN rank waiting for a partner that never reconnects. So each
worker finishes the step (a lost exchange gives zeros, :meth:`AFDConnector.holding_lost_steps`)
and the partners then vote (docs/design.md, "Restarts beyond one lane"); every decision is the
worst verdict any of them gave, so all of them take it together.
"""

from __future__ import annotations

import enum

import torch
import torch.distributed as dist


class Verdict(enum.IntEnum):
    """One worker's view of a step, ordered by how much it costs the partners: the worst wins."""

    #: the step ran, or the connection is up
    RAN = 0
    #: the peer role went away during it: reconnect and run it again
    AGAIN = 1
    #: no restarted peer connected in time: fail the step
    GIVE_UP = 2


class StepVote:
    """The partners' vote over a gloo group (vLLM's world group of the engine, on the CPU).

    Every partner calls :meth:`tally` equally often and in the same order; the callers guarantee
    that by voting once per step and once per retry, whatever they saw.
    """

    def __init__(self, group: dist.ProcessGroup):
        self._group = group
        self._ballot = torch.zeros(1, dtype=torch.int32)

    def tally(self, verdict: Verdict) -> Verdict:
        """The worst of every partner's ``verdict`` (blocks until all of them voted)."""
        self._ballot[0] = int(verdict)
        dist.all_reduce(self._ballot, op=dist.ReduceOp.MAX, group=self._group)
        return Verdict(int(self._ballot[0]))


def engine_vote(restart_s: float) -> StepVote | None:
    """The vote of this worker's engine (vLLM's world group: its TP and DP ranks) when steps are
    held across restarts and the worker has partners; None otherwise."""
    if not restart_s:
        return None
    from vllm.distributed.parallel_state import get_world_group

    world = get_world_group()
    return StepVote(world.cpu_group) if world.world_size > 1 else None
