"""torchrun helpers shared by both trainers: join the job, agree on a flag, share rank 0's decision."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


@dataclass
class Dist:
    """This process's place in a ``torchrun`` job (rank 0 of 1 when run plainly)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def uses_nccl(self) -> bool:
        """Whether this job's CUDA tensors go through NCCL (every rank has a GPU: see :func:`init_distributed`)."""
        return self.world_size > 1 and "nccl" in dist.get_backend()


def init_distributed() -> Dist:
    """Join the torchrun job if there is one: NCCL for CUDA tensors when every rank has a GPU, gloo otherwise.

    With GPUs the process group is ``cpu:gloo,cuda:nccl``: NCCL moves only CUDA tensors, and the small host
    tensors the trainers agree on (a stop flag, metric sums) go through gloo. A plain ``nccl`` group fails on them.

    Collectives time out after ``HRM_DIST_TIMEOUT_MIN`` minutes (default 30; rank 0 alone evaluates CAPE
    while the others wait), so a crashed peer
    becomes an error on the survivors instead of a hang.
    """
    if "LOCAL_RANK" not in os.environ or int(os.environ.get("WORLD_SIZE", "1")) == 1:
        return Dist()
    local_rank = int(os.environ["LOCAL_RANK"])
    gpu = torch.cuda.is_available() and torch.cuda.device_count() > local_rank
    backend = "cpu:gloo,cuda:nccl" if gpu else "gloo"
    if gpu:
        torch.cuda.set_device(local_rank)
    timeout = timedelta(minutes=int(os.environ.get("HRM_DIST_TIMEOUT_MIN", "30")))
    # The store torchrun's agent keeps outlives a worker group it restarts (--max-restarts): keys under this group's
    # own prefix, so a restarted group never reads the addresses its dead predecessor left there (it would connect to
    # them and time out: gloo's "connectFullMesh failed ... Connection refused").
    store, rank, world_size = next(dist.rendezvous("env://", timeout=timeout))
    store = dist.PrefixStore(f"worker-group-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", store)
    dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    return Dist(dist.get_rank(), dist.get_world_size(), local_rank)


def any_rank(flag: bool, rank: Dist) -> bool:
    """True on every rank when ``flag`` is true on at least one (a rank must never act alone: peers would hang)."""
    return any_ranks([flag], rank)[0]


def any_ranks(flags: list[bool], rank: Dist) -> list[bool]:
    """:func:`any_rank` of several flags in one collective: each true on every rank when it is on at least one."""
    t = torch.tensor([int(flag) for flag in flags], dtype=torch.int32)
    if rank.world_size > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return [bool(v) for v in t.tolist()]


def main_decides(value, rank: Dist):
    """Rank 0's ``value`` on every rank (any picklable object).

    A branch that leads to a collective (a checkpoint barrier, an early stop) must be taken by all
    ranks or none; deciding it on rank 0 and sharing the decision keeps ranks from diverging when
    their local views differ (e.g. a validation score only rank 0 computed).
    """
    if rank.world_size == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]
