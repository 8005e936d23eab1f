"""Work beside the main thread: the eval's row finishing (host metrics, embeddings, WAV writes, emits) on
worker threads while the main thread drives the GPU, or in line where the host has no spare cores."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor


class Beside:
    """Runs the rows' finishing work (metrics on the host, WAV writes, emits): on `threads` worker threads
    while the caller goes on to the next job's generation (`beside` True: a GPU run, whose host waits on the
    device meanwhile), or at once in the caller (False: on the CPU the model already uses every core). Work
    submitted later may finish first. Leaving the block waits for the workers and re-raises the first error
    their work raised (in the order of submission)."""

    def __init__(self, beside: bool, threads: int = 1) -> None:
        self._pool = ThreadPoolExecutor(threads, thread_name_prefix="eval-rows") if beside else None
        self._futures: list = []

    def __enter__(self) -> Beside:
        return self

    def submit(self, fn: Callable, *args) -> None:
        if self._pool is None:
            fn(*args)
        else:
            self._futures.append(self._pool.submit(fn, *args))

    def __exit__(self, *exc) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            for future in self._futures:
                future.result()
