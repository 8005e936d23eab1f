"""Per-scale widths against sink scales (issue 36): the first S scales native, the next N scales' keys at HI
bits (and values at VHI bits), the rest at the codec's b, the stores on the codec library's reference path,
the default model and the shipped clips conditioned as `octopus-audio eval` conditions them.

Each configuration `S,HI,N[,VHI]` patches every attention layer with a lab cache (`ScaleWidthCache`: units
leaving the window are encoded by the codec library at their own scale's key and value widths; the first S
units kept native; one fp32 SDPA over everything, as the cache's reference path attends) and gives, over the
clips: teacher-forced KL and top-1 against the unpatched model on the reference's tokens (the eval's
fidelity), the first parting scale and LSD of the sampled output against the uncompressed reference (seed 42,
cfg 4, top-k 200, top-p 0.95, as the eval), and the cache bytes against the first configuration's with the
native tokens counted at bf16 (what a GPU holds).

`--device cuda` runs the model as `octopus-audio eval --device cuda` runs it (`eval.cli.load_model`: fp32
weights on the GPU; the conditioner on the GPU; generation at `generate`'s default for the device, the blocks
under bf16 autocast with the exponential-race draw, per-row seeds; teacher forcing in fp32), so the numbers
compare with the GPU eval grid. The probe's own attention stays what it is on the CPU: one fp32 SDPA (autocast
off) over every held token, the stored ones decoded by the codec library (the stores' encodes also run
outside autocast, on the reference path, on the tensors' device), not the eval's fused kernels; teacher
forcing runs the scale loop (`scale_loop=True`) on every device, for the reference as for each configuration.
`--device cpu` (default) is the fp32 reference path throughout.

`--seconds-budget T`: no configuration starts once T seconds have passed since the start (loading included);
`--out` is rewritten after every configuration, so a run cut short keeps what it finished.

    python benchmarks/lab/scale_widths.py --codec octopus --bits 2 --configs 0,0,0 3,0,0 0,4,6 0,4,6,4 \\
        --out OUT.json
    python benchmarks/lab/scale_widths.py --device cuda --codec octopus --bits 2 --configs 0,0,0 2,4,4,4 \\
        --seconds-budget 500 --out OUT.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

import numpy as np
import torch

from octopus_audio import CompressedKVCache
from octopus_audio.aar_patch import generate, patch_aar
from octopus_audio.cache.backend import reference_backend
from octopus_audio.eval.cli import default_clips_dir, load_model
from octopus_audio.eval.conditioning import CachedConditioner, default_cache_dir, make_conditioner
from octopus_audio.eval.distributed import DistInfo, resolve_device, use_device
from octopus_audio.eval.fidelity import fidelity_rows, teacher_forced_probs
from octopus_audio.eval.metrics import MetricReference
from octopus_audio.eval.parting import first_parting_scale
from octopus_audio.eval.run_folder import precision_settings
from octopus_audio.eval.sources import CLAP_RATE, decode, list_clips, prepare
from octopus_audio.reference import attend

REFERENCE_WHY = "lab scale_widths: per-scale stores decoded by the codec library"


def outside_autocast(device: torch.device | str):
    """Autocast off for `device`'s type (the blocks run under bf16 autocast on CUDA: the probe's encodes and
    its attention stay fp32 there)."""
    kind = torch.device(device).type
    if kind == "cuda" or torch.is_autocast_enabled(kind):
        return torch.autocast(kind, enabled=False)
    return contextlib.nullcontext()


class ScaleWidthCache:
    """A layer's cache for this probe (duck-typed as the patch uses CompressedKVCache): unit u's keys at
    `widths[u][0]` bits and values at `widths[u][1]`, each unit encoded by the codec library as it leaves the
    window (W units native), the first `sinks` units kept native; attention is one fp32 SDPA over every held
    token. The stores (window 0) start their sequences under `reference_backend` and run outside autocast, so
    on CUDA they encode and decode with the codec library on the tensors' device, in fp32, as on the CPU; the
    data checks are theirs (`decoded_kv` runs them), none is deferred to the patch (`deferred_flags` None)."""

    def __init__(self, codec: str, widths: list[tuple[int, int]], head_dim: int, seed: int, sinks: int,
                 window: int = 1) -> None:
        self.widths, self.sinks, self.window = widths, sinks, window
        self.stores = {kv: CompressedKVCache(codec, kv[0], head_dim, window=0, seed=seed, v_bits=kv[1])
                       for kv in sorted(set(widths))}
        self.backend = "reference"
        self.checks_pending = False
        self.reset()

    def reset(self) -> None:
        for s in self.stores.values():
            s.reset()
        self.prefix: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.held: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.units = 0

    def prepare(self, num_heads: int, device) -> None:
        """The stores' codec tables and sign vectors on `device` before the first generation."""
        with reference_backend(REFERENCE_WHY):
            for s in self.stores.values():
                s.prepare(num_heads, device)

    def deferred_flags(self):
        return None

    def check(self) -> None:
        for s in self.stores.values():
            if s.num_tokens:
                s.check()

    def flush_checks(self) -> None:
        pass

    def append(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.held.append((k.clone(), v.clone()))
        self.units += 1
        while len(self.held) > self.window:
            unit = self.units - len(self.held)
            k_u, v_u = self.held.pop(0)
            if unit < self.sinks:
                self.prefix.append((k_u, v_u))
            else:
                with reference_backend(REFERENCE_WHY), outside_autocast(k_u.device):
                    self.stores[self.widths[unit]].append(k_u, v_u)

    def attend(self, q: torch.Tensor, scale: float) -> torch.Tensor:
        with outside_autocast(q.device):
            ks, vs = [], []
            for k, v in self.prefix + self.held:
                ks.append(k.float())
                vs.append(v.float())
            for s in self.stores.values():
                if s.num_tokens:
                    k, v = s.decoded_kv(torch.float32)
                    ks.append(k)
                    vs.append(v)
            return attend(q.float(), torch.cat(ks, 2), torch.cat(vs, 2), scale).to(q.dtype)

    def bytes_breakdown(self) -> dict[str, int]:
        parts = [s.bytes_breakdown() for s in self.stores.values() if s.num_tokens]
        k = self.held[0][0] if self.held else self.prefix[0][0]
        per_token = 2 * k.shape[0] * k.shape[1] * k.shape[3] * k.element_size()
        prefix_tokens = sum(t.shape[2] for t, _ in self.prefix)
        window_tokens = sum(t.shape[2] for t, _ in self.held)
        store_tokens = sum(p["store_tokens"] for p in parts)
        tokens = prefix_tokens + window_tokens + store_tokens
        native = per_token * (prefix_tokens + window_tokens)
        k_bytes, v_bytes = sum(p["k_bytes"] for p in parts), sum(p["v_bytes"] for p in parts)
        rows = k.shape[0] * k.shape[1]
        return {"k_bytes": k_bytes, "v_bytes": v_bytes, "prefix_bytes": per_token * prefix_tokens,
                "window_bytes": per_token * window_tokens, "native_bytes": native,
                "allocated_bytes": k_bytes + v_bytes + native,
                "fp16_bytes": 2 * rows * tokens * k.shape[3] * 2,
                "tokens": tokens, "prefix_tokens": prefix_tokens, "window_tokens": window_tokens,
                "store_tokens": store_tokens, "rows": rows}


def conditions(n: int, seed: int, device: str):
    """The clips' conditions as the eval computes them on `device` (`--clap auto` there, its cache)."""
    refs = list_clips(str(default_clips_dir()), n, seed, None)
    conditioner = CachedConditioner(make_conditioner("auto", device), default_cache_dir())
    cond = np.stack([conditioner.embed(prepare(decode(r), CLAP_RATE)) for r in refs]).astype(np.float32)
    return [r.clip_id for r in refs], torch.from_numpy(cond).to(device), conditioner.name


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def host(gen):
    """A generation's audio, fhat and tokens on the host (fp32 / int64 numpy), as the eval's backend reads
    them."""
    audio = gen.audio.reshape(gen.audio.shape[0], -1).float().cpu().numpy()
    return audio, gen.fhat.float().cpu().numpy(), [t.to(torch.int64).cpu().numpy() for t in gen.tokens]


def run_config(pipe, cond, ref, probs_ref, codec: str, bits: int, sinks: int, hi: int, n_hi: int,
               v_hi: int) -> dict:
    scales = len(pipe.aar.config.patch_nums)
    widths = [(hi, v_hi) if sinks <= u < sinks + n_hi else (bits, bits) for u in range(scales)]
    device = pipe.device
    with patch_aar(pipe, codec, bits) as handle:
        for lp in handle._layers:
            lp.cache = ScaleWidthCache(codec, widths, lp.head_dim, lp.cache.seed, sinks)
            if device.type == "cuda":
                lp.cache.prepare(lp.num_heads, device)
        synchronize(device)
        start = time.perf_counter()
        out = generate(pipe, cond, cfg=4.0, top_k=200, top_p=0.95, seed=[42] * cond.shape[0])
        stats = handle.stats().total
        probs = teacher_forced_probs(pipe, cond, ref.tokens, scale_loop=True)
        synchronize(device)
        seconds = time.perf_counter() - start
    p_hat = list(torch.cat([p.float() for p in probs], 1).unbind(0))
    tf = fidelity_rows(probs_ref, p_hat)
    rate = pipe.sat.config.sample_rate
    ref_audio, ref_fhat, ref_tokens = host(ref)
    out_audio, out_fhat, out_tokens = host(out)
    lsd, parting = [], []
    for i in range(cond.shape[0]):
        m = MetricReference(ref_audio[i], ref_fhat[i], rate)
        lsd.append(m.compare(out_audio[i], out_fhat[i])["lsd_db"])
        parting.append(first_parting_scale([t[i] for t in ref_tokens], [t[i] for t in out_tokens]))
    rows = cond.shape[0] * 2 * pipe.aar.config.num_heads * len(pipe.aar.blocks)  # guidance doubles the rows
    d = pipe.aar.config.embed_dim // pipe.aar.config.num_heads
    native_tokens = stats.prefix_tokens + stats.window_tokens
    bf16_bytes = stats.k_bytes + stats.v_bytes + 2 * rows * native_tokens * d * 2
    return {"config": f"{sinks},{hi},{n_hi},{v_hi}", "sink_scales": sinks, "hi_bits": hi, "hi_scales": n_hi,
            "hi_v_bits": v_hi,
            "widths": widths, "tf_kl_nats": float(np.mean([r["tf_kl_nats"] for r in tf])),
            "tf_top1": float(np.mean([r["tf_top1"] for r in tf])), "lsd_db": float(np.mean(lsd)),
            "first_parting_scale": float(np.mean(parting)), "cache_bytes": stats.nbytes,
            "cache_bytes_bf16_native": bf16_bytes, "ratio": stats.ratio, "seconds": seconds}


def table(results: list[dict]) -> None:
    base = results[0]
    print("| config (S, HI, N, VHI) | TF KL | x base | TF top-1 | first parting | LSD dB | - base dB "
          "| cache bytes (bf16 native) vs base |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in results:
        print(f"| {r['config']} | {r['tf_kl_nats']:.4f} | {r['tf_kl_nats'] / base['tf_kl_nats']:.3f} | "
              f"{r['tf_top1']:.4f} | {r['first_parting_scale']:.2f} | {r['lsd_db']:.3f} | "
              f"{r['lsd_db'] - base['lsd_db']:+.2f} | "
              f"{r['cache_bytes_bf16_native'] / base['cache_bytes_bf16_native'] - 1:+.1%} |")


def main() -> None:
    t0 = time.perf_counter()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--codec", default="octopus")
    p.add_argument("--bits", type=int, default=2)
    p.add_argument("--configs", nargs="+", default=["0,0,0", "3,0,0"],
                   help="S,HI,N[,VHI] each: S sink scales, then N scales' keys at HI bits (values at VHI, "
                        "default b); the first is the baseline")
    p.add_argument("--n", type=int, default=16, help="clips (default 16, the shipped ones)")
    p.add_argument("--device", default="cpu",
                   help="cpu (default, fp32 throughout), cuda or cuda:N (the model as `octopus-audio eval` "
                        "runs it there: bf16-autocast generation, fp32 teacher forcing)")
    p.add_argument("--seconds-budget", type=float, default=None,
                   help="start no configuration once this many seconds have passed since the start "
                        "(default: no limit); --out is written after every configuration")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args()
    specs = []
    for spec in args.configs:
        parts = [int(x) for x in spec.split(",")]
        if len(parts) not in (3, 4):
            p.error(f"--configs: {spec!r} is not S,HI,N[,VHI]")
        specs.append(parts)
    device = resolve_device(args.device, DistInfo.from_env())
    use_device(device)
    torch.manual_seed(0)
    pipe = load_model(None, None, device)
    clips, cond, conditioner = conditions(args.n, 42, device)
    meta = {"codec": args.codec, "bits": args.bits, "clips": clips, "device": device,
            "device_name": torch.cuda.get_device_name(torch.device(device)) if device.startswith("cuda")
            else "cpu", "conditioner": conditioner, **precision_settings(device),
            "probe_attention": "fp32 SDPA over every held token, stores decoded by the codec library",
            "teacher_forced": "scale loop", "seconds_budget": args.seconds_budget}
    results: list[dict] = []

    def write(complete: bool) -> None:
        if args.out:
            args.out.write_text(json.dumps({**meta, "complete": complete,
                                            "elapsed_seconds": time.perf_counter() - t0,
                                            "results": results}, indent=1) + "\n")

    with torch.inference_mode():
        ref = generate(pipe, cond, cfg=4.0, top_k=200, top_p=0.95, seed=[42] * cond.shape[0])
        probs = teacher_forced_probs(pipe, cond, ref.tokens, scale_loop=True)
        probs_ref = list(torch.cat([p.float() for p in probs], 1).unbind(0))
        for i, (sinks, hi, n_hi, *v_hi) in enumerate(specs):
            elapsed = time.perf_counter() - t0
            if args.seconds_budget is not None and elapsed >= args.seconds_budget:
                meta["skipped"] = args.configs[i:]
                print(f"seconds budget {args.seconds_budget:g} s spent ({elapsed:.0f} s): skipped "
                      f"{' '.join(args.configs[i:])}", flush=True)
                break
            r = run_config(pipe, cond, ref, probs_ref, args.codec, args.bits, sinks, hi, n_hi,
                           v_hi[0] if v_hi else args.bits)
            print(json.dumps(r), flush=True)
            results.append(r)
            write(complete=len(results) == len(specs))
    write(complete=len(results) == len(specs))
    if results:
        table(results)


if __name__ == "__main__":
    main()
