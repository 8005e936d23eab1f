"""Is the early encode active in the patched graphed generation, and do its kernels overlap others?"""
import sys
import torch
sys.path.insert(0, "benchmarks")
from bench_aar import build_pipeline
from octopus_audio.aar_patch import GraphedGenerator, patch_aar

pipe = build_pipeline("full", torch.device("cuda"))
B = int(sys.argv[1]) if len(sys.argv) > 1 else 64
cond = torch.nn.functional.normalize(torch.randn(B, 512, generator=torch.Generator().manual_seed(1)), dim=1)
for early in (None, False):
    with patch_aar(pipe, "octopus", 2) as h, torch.inference_mode():
        for c in h.caches:
            c.early_encode = early
        c0 = h.caches[0]
        orig = c0._stage
        seen = []
        def st(orig=orig, c0=c0, seen=seen):
            n = len(c0._seq.staged); orig(); seen.append(len(c0._seq.staged) - n)
        c0._stage = st
        g = GraphedGenerator(pipe, B)
        print("early", early, "layer-0 stages at capture:", sum(seen), "of", len(seen), flush=True)
        g(cond, 42); torch.cuda.synchronize()
        from torch.profiler import profile, ProfilerActivity
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            g(cond, 42); torch.cuda.synchronize()
        ev = [e for e in prof.events() if e.device_type.name == "CUDA"]
        streams = {}
        for e in ev:
            streams.setdefault(getattr(e, "device_resource_id", None), []).append(e)
        for s, es in streams.items():
            tot = sum(e.device_time for e in es) / 1e3
            names = {}
            for e in es:
                names[e.name[:60]] = names.get(e.name[:60], 0) + e.device_time / 1e3
            top = sorted(names.items(), key=lambda x: -x[1])[:3]
            print(f"  stream {s}: {len(es)} kernels, {tot:.1f} ms; top {top}")
        t0 = min(e.time_range.start for e in ev); t1 = max(e.time_range.end for e in ev)
        print(f"  span {(t1 - t0) / 1e3:.1f} ms")
        del g
