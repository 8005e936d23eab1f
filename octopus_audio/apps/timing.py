"""Timing for the benchmarks: a call's median time (triton's do_bench, L2 flushed between runs), a call
captured in a CUDA graph, the copy bandwidth, and the SDPA backends torch offers as bf16 baselines."""

from __future__ import annotations


def bench_ms(fn, rep_ms: float) -> float:
    import triton

    return float(triton.testing.do_bench(fn, warmup=max(5, rep_ms // 4), rep=rep_ms, return_mode="median"))


def graphed(fn):
    """`fn` captured in a CUDA graph (after one warm call on a side stream): a callable replaying it.
    Timing the replay gives the GPU time of a call without the host's launch work, which is what a captured
    generation (the patch's `GraphedGenerator`) pays."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def copy_bandwidth(rep_ms: float) -> float:
    """Device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written (1 GiB copied)."""
    import torch

    src = torch.empty(2**29, dtype=torch.int16, device="cuda").random_()
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src), rep_ms)
    return 2 * src.numel() * src.element_size() / (ms * 1e-3) / 1e9


SDPA_BACKENDS = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION", "MATH")


def sdpa_backends(q, k, v) -> dict:
    """{backend name: a callable running bf16 SDPA(q, k, v) on that torch backend} for each of SDPA_BACKENDS
    that takes these inputs here (a backend that refuses them, or is not built, is left out): the baselines
    the strongest of which each attention row is compared with."""
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    calls = {}
    for name in SDPA_BACKENDS:
        backend = getattr(SDPBackend, name)

        def call(backend=backend):
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v)

        try:
            call()
        except RuntimeError:  # "No available kernel": this backend does not take these inputs
            continue
        calls[name.removesuffix("_ATTENTION").lower()] = call
    return calls


def backend_graph_ms(calls: dict, rep_ms: float) -> dict:
    """{backend: graph ms} of the SDPA backends whose call a CUDA graph captures (one that cannot be captured
    is left out: the rows compare graph times)."""
    out = {}
    for name, call in calls.items():
        try:
            out[name] = bench_ms(graphed(call), rep_ms)
        except RuntimeError:
            continue
    return out
