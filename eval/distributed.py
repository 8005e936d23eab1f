"""Scale-out of the eval under torchrun: the rank layout, each rank's device, and the process group (gloo on
CPU, nccl on GPUs; a no-op for one process)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

from octopus_audio.errors import UsageError


@dataclass(frozen=True)
class DistInfo:
    rank: int
    world: int
    local_rank: int

    @classmethod
    def from_env(cls) -> DistInfo:
        return cls(int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1")),
                   int(os.environ.get("LOCAL_RANK", "0")))


def resolve_device(spec: str, local_rank: int) -> str:
    """`auto` is cuda:<local rank> when a GPU is visible, else cpu; `cuda` gets the local rank's index."""
    import torch

    if spec == "auto":
        spec = "cuda" if torch.cuda.is_available() else "cpu"
    if spec == "cuda":
        return f"cuda:{local_rank}"
    if spec != "cpu" and not spec.startswith("cuda:"):
        raise UsageError(f"unknown --device {spec!r}; accepted: auto, cpu, cuda, cuda:N")
    return spec


class ProcessGroup:
    """The process group when WORLD_SIZE > 1 (gloo on CPU, nccl on GPUs); a no-op otherwise."""

    def __init__(self, info: DistInfo, device: str) -> None:
        self.info = info
        self.device = device
        if info.world > 1:
            import torch
            import torch.distributed as dist

            use_nccl = device.startswith("cuda")
            if use_nccl:
                torch.cuda.set_device(torch.device(device))
            # long shards: a rank may wait at the barrier for hours while another finishes its clips
            dist.init_process_group("nccl" if use_nccl else "gloo", timeout=timedelta(days=2))

    def barrier(self) -> None:
        if self.info.world > 1:
            import torch
            import torch.distributed as dist

            if self.device.startswith("cuda"):
                dist.barrier(device_ids=[torch.device(self.device).index])
            else:
                dist.barrier()

    def close(self) -> None:
        if self.info.world > 1:
            import torch.distributed as dist

            dist.destroy_process_group()
