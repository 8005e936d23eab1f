"""Scale-out of the eval under torchrun: the rank layout, each rank's device, and the process group (gloo on
CPU, nccl on GPUs; a no-op for one process)."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import timedelta
from itertools import zip_longest
from typing import Any

from octopus_audio.errors import UsageError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world: int
    local_rank: int

    @classmethod
    def from_env(cls) -> DistInfo:
        return cls(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")),
                   int(os.environ.get("LOCAL_RANK", "0")))


def resolve_device(spec: str, info: DistInfo) -> str:
    """`auto` is cuda:<local rank> when a GPU is visible, else cpu; `cuda` gets the local rank's index.

    Refused (UsageError): an unknown spec, CUDA where no GPU is visible, a GPU index past the visible ones
    (more torchrun processes on a node than GPUs) and `cuda:N` under torchrun (every process on one GPU)."""
    import torch

    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    if spec == "cpu":
        return spec
    if spec == "cuda":
        spec = f"cuda:{info.local_rank}"
    elif not spec.startswith("cuda:") or not spec[5:].isdigit():
        raise UsageError(f"unknown --device {spec!r}; accepted: auto, cpu, cuda, cuda:N")
    elif info.world > 1:
        raise UsageError(f"--device {spec} would put all {info.world} torchrun processes on one GPU; pass "
                         f"--device cuda (or auto: each process takes its local rank's GPU) or cpu")
    if not torch.cuda.is_available():
        raise UsageError(f"--device {spec}: no CUDA GPU is visible; pass --device cpu (or auto)")
    index, count = int(spec[5:]), torch.cuda.device_count()
    if index >= count:
        why = (f"local rank {info.local_rank} would take GPU {index}" if info.world > 1
               else f"--device {spec} names GPU {index}")
        raise UsageError(f"{why} but {count} GPU{'s are' if count != 1 else ' is'} visible; pass "
                         f"--nproc_per_node at most {count} under torchrun, or a visible GPU")
    return spec


def use_device(device: str) -> None:
    """Make a CUDA `device` this process's current GPU, before any CUDA work: kernels launched with the
    current device (Triton's, cache set-up with an index-less device) and NCCL's object collectives use it,
    and a process that touches GPU 0 first holds a context there."""
    if device.startswith("cuda"):
        import torch

        if torch.device(device).index is not None:  # a bare `cuda` is the current GPU already
            torch.cuda.set_device(torch.device(device))


class ProcessGroup:
    """The process group when WORLD_SIZE > 1 (gloo on CPU, nccl on GPUs); a no-op otherwise."""

    def __init__(self, info: DistInfo, device: str) -> None:
        self.info = info
        self.device = device
        use_device(device)
        if info.world > 1:
            import torch.distributed as dist

            backend = "nccl" if device.startswith("cuda") else "gloo"
            # long shards: a rank may wait at the barrier for hours while another finishes its clips
            dist.init_process_group(backend, timeout=timedelta(days=2))
            if info.rank == 0:
                log.info("eval over %d processes, process group %s (%s per rank)", info.world, backend,
                         "the local rank's GPU" if backend == "nccl" else "cpu")

    def barrier(self) -> None:
        if self.info.world > 1:
            import torch
            import torch.distributed as dist

            if self.device.startswith("cuda"):  # this process's GPU (use_device made it the current one)
                dist.barrier(device_ids=[torch.cuda.current_device()])
            else:
                dist.barrier()

    def all_gather(self, value: Any) -> list[Any]:
        """Every rank's `value` (picklable), in rank order, on every rank; it waits for all, as a barrier."""
        if self.info.world == 1:
            return [value]
        import torch.distributed as dist

        out: list[Any] = [None] * self.info.world
        dist.all_gather_object(out, value)
        return out

    def start_together(self, problem: str | None, fingerprint: dict, clips: list[tuple[str, Any]]) -> None:
        """After rank 0 claimed the output folder (`problem`: the text of its refusal, else None), every rank
        raises the same UsageError when rank 0 refused, or when the processes disagree on the run's
        `fingerprint` or on `clips` ((clip id, audio hash) in order: each process lists and shards them
        itself); otherwise this is a barrier. No rank is left waiting for another that gave up."""
        views = self.all_gather((problem, fingerprint, clips))
        if views[0][0] is not None:
            raise UsageError(views[0][0])
        _, fingerprint0, clips0 = views[0]
        for rank, (_, fp, listed) in enumerate(views[1:], 1):
            if fp != fingerprint0:
                from octopus_audio.eval.run_folder import differ

                diff = sorted(k for k in set(fp) | set(fingerprint0) if fp.get(k) != fingerprint0.get(k))
                raise UsageError(f"torchrun process {rank} computes another run fingerprint than process 0 "
                                 f"({differ(diff)}); every process must load the same model, conditioner "
                                 f"and settings")
            if listed != clips0:
                first = next(i for i, (a, b) in enumerate(zip_longest(listed, clips0)) if a != b)
                raise UsageError(f"torchrun process {rank} lists {len(listed)} clips and process 0 "
                                 f"{len(clips0)}, differing from clip {first + 1} on (a name or its audio); "
                                 f"every process must read the same --clips")

    def close(self) -> None:
        if self.info.world > 1:
            import torch.distributed as dist

            dist.destroy_process_group()
