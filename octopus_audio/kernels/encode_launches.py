"""The key encode's launch tables (H200 sweeps): rows per program, warps and register caps of the key kernel
per decode section and code width, and the fused unit encode's own caps. encode.py's launchers read them."""

# (rows per program, warps, register cap or None) of the key kernel per (decode section, QJL side-car): the
# H200 sweep of the encode launches (each row checked against the library on the GPU) where the kernel has not
# changed since (scalar, polar), else the fewest SASS instructions per key without spills
# (benchmarks/lab/count_sass_encode.py; the triplet section since its table search). Head dims above 64 take
# the d=128 row, 256 with half its rows. The triplet section at d=128 (H200, triton 3.6, 32 heads x 8k keys,
# b=2): 2048 elements of a key tile a warp (64 rows x 4 warps, 128 x 8) fault in the rotation dot
# (compute-sanitizer: out-of-range shared or local address), so it takes 1024: octopus 64 x 8 under the 128
# cap 0.589 ms (uncapped 0.668, 32 x 4 0.871), octopus-qjl 32 x 4 0.955 (16 x 4 1.118); test_kernels_encode's
# full-size launches run each row unhalved on the GPU.
KEY_LAUNCH = {
    64: {("scalar", False): (64, 4, None), ("scalar", True): (64, 4, None), ("polar", False): (64, 4, None),
         ("triplet", False): (64, 4, None), ("triplet", True): (64, 4, None)},
    128: {("scalar", False): (64, 4, 128), ("scalar", True): (64, 4, None), ("polar", False): (64, 8, 128),
          ("triplet", False): (64, 8, 128), ("triplet", True): (32, 4, None)},
}

# KEY_LAUNCH overridden at a code width. The register caps: more blocks an SM (the encode waits on
# latency, not on issue: benchmarks/results/kernels.md), paid for with a few spilled words; H200 through
# encode_keys at 64k tokens x 16 heads (benchmarks/lab/sweep_encode_caps.py; every field equal to the previous
# launch's), ms before -> now: turboquant-qjl b=2 0.2014 -> 0.1782, b=3 0.2120 -> 0.1905,
# b=4 (cap 128 before) 0.2242 -> 0.2188; turboquant-mse b=2 0.1042 -> 0.1027 (two runs), b=3 0.1419 -> 0.1290;
# polarquant b=4 0.2967 -> 0.2831; octopus-qjl b=2 0.5786 -> 0.4590, b=3 0.6393 -> 0.5220, b=4 0.7365 ->
# 0.6169. Other caps and widths were no faster (within 3%, or one run) or slower (octopus: 0.3822 -> 0.3886 at
# b=3 under 96).
# At d=128 (64k tokens x 16 heads), the same sweep: KEY_LAUNCH's polarquant and turboquant-mse rows take a
# 128 cap, faster at every width timed: polarquant b=1 / 2 / 3 / 4 / 5 / 8 0.6169 / 0.6874 / 1.0844 / 1.0225
# / 1.5542 / 1.8499 -> 0.4359 / 0.5160 / 0.8568 / 0.7974 / 1.2816 / 1.6281 (130 registers uncapped at b=2:
# one 8-warp block an SM, two capped); turboquant-mse b=1 / 2 / 3 / 4 / 5 / 8 0.2263 / 0.2469 / 0.3204 /
# 0.3307 / 0.6159 / 0.7215 -> 0.2086 / 0.2297 / 0.3018 / 0.3143 / 0.5583 / 0.6658 (b = 6, 7 take the row
# untimed). turboquant-qjl b=2 / 3 / 4 0.5099 / 0.5334 / 0.6201 -> 0.4666 / 0.4752 / 0.5848 under 168 (254
# registers uncapped; 128: 0.4842 / - / 0.6627); b=5 0.6766 -> 0.6863, uncapped. Slower capped at d=128:
# octopus-qjl (2.1507 -> 2.3790 at 168), octopus (0.9104 -> 0.9683 at 80). Head dims above 128 take the
# d=128 caps untimed.
# Keyed by (head dim, decode section, QJL side-car, code bits): turboquant-qjl at b bits codes b - 1 a
# coordinate, octopus(-qjl) b = 2, 3, 4 code 7, 10, 13 bits a triplet.
KEY_LAUNCH_BITS = {(64, "scalar", False, 2): (64, 4, 72), (64, "scalar", False, 3): (128, 4, 96),
                   (64, "scalar", True, 1): (64, 4, 96), (64, "scalar", True, 2): (64, 4, 96),
                   (64, "scalar", True, 3): (64, 4, 96), (64, "polar", False, 2): (128, 4, None),
                   (64, "polar", False, 4): (64, 4, 80), (64, "triplet", True, 7): (64, 4, 128),
                   (64, "triplet", True, 10): (64, 4, 128), (64, "triplet", True, 13): (64, 4, 168),
                   (128, "scalar", True, 1): (64, 4, 168), (128, "scalar", True, 2): (64, 4, 168),
                   (128, "scalar", True, 3): (64, 4, 168)}

# the fused unit encode's register cap where it differs from its key launch's (0: none), keyed as
# KEY_LAUNCH_BITS: its key programs re-decide near ties inline and its value programs share
# the launch, so its best cap is its own (the same sweep, keys and 2-bit values into a store, graph-timed):
# octopus b=2 / 3 / 4 0.5175 / 0.5857 / 0.6999 -> 0.4175 / 0.5020 / 0.5970 ms under 112 registers, where
# encode_keys is no faster capped; polarquant b=2 (the Triton key programs) 0.2609 -> 0.2390 under 128.
UNIT_CAPS: dict[tuple[int, str, bool, int], int] = {
    (64, "triplet", False, 7): 112, (64, "triplet", False, 10): 112, (64, "triplet", False, 13): 112,
    (64, "polar", False, 2): 128}


def launch_key(head_dim: int, decode: str, has_qjl: bool, code_bits: int) -> tuple[int, str, bool, int]:
    """The key of KEY_LAUNCH_BITS and UNIT_CAPS: head dims up to 64 share the d=64 entries, larger ones
    d=128's."""
    return (64 if head_dim <= 64 else 128, decode, has_qjl, code_bits)
