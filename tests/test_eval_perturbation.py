"""The eval's bf16-KV floor: the patch with codec none and `kv_dtype=torch.bfloat16` (keys and values
rounded to bf16 as they enter the KV cache, nothing else changed) on a tiny real AAR, and the row
`reference (bf16 KV)` it gives the runner: on by default in the CLI with the other floor, off with --no-floor,
resumable."""

import json

import pytest
from test_eval_runner import (
    FakeConditioner,
    FakePipe,
    fake_compressed_kv,
    fake_generate,
    fake_teacher_forced,
    make_clips,
)

from octopus_audio.eval.backends import AARBackend, LazyBackend
from octopus_audio.eval.records import FLOOR, KV_FLOOR, REFERENCE, EvalConfig, Job
from octopus_audio.eval.runner import evaluate
from octopus_audio.eval.sources import list_folder

torch = pytest.importorskip("torch")
F = torch.nn.functional

PATCH_NUMS = (1, 2, 4, 8)
SEED = 3


@pytest.fixture(autouse=True)
def one_thread():
    """The tiny model's ops are too small for intra-op threads; on a busy 2-core machine they only spin."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def tiny_pipe(bf16_cache: bool = False):
    """A random 2-layer AAR (head dim 32) and tokenizer, 2560 samples a clip. `bf16_cache`: every key is 0
    (zero key weights) and every value its layer's bias rounded to bf16 (zero value weights), so whatever
    enters the cache is already bf16-representable."""
    from octopus_audio.aar_patch import AARPipeline
    from octopus_audio.aar_patch.aar import AAR, AARConfig
    from octopus_audio.aar_patch.sat import SAT, SATConfig

    torch.manual_seed(0)
    aar = AAR(AARConfig(depth=2, embed_dim=64, num_heads=2, vocab_size=256, latent_dim=8,
                        patch_nums=PATCH_NUMS))
    aar.init_weights(seed=0)
    sat = SAT(SATConfig(n_filters=4, ratios=(8, 5, 4, 2), lstm_layers=1, dimension=8, latent_dim=8,
                        codebook_size=256, patch_nums=PATCH_NUMS, num_phi=2, phi_kernel=3))
    pipe = AARPipeline(aar, sat).eval()
    if bf16_cache:
        with torch.no_grad():
            for block in aar.blocks:
                attn = block.attn
                C = attn.mat_qkv.weight.shape[1]
                attn.mat_qkv.weight[C:] = 0.0  # the key and value rows
                attn.v_bias.copy_(torch.randn(C).bfloat16().float())
    return pipe


def bf16_kv(pipe, dtype=None):
    """The floor's cache, as the runner puts it under the model: the patch, codec none, K/V rounded."""
    from octopus_audio.aar_patch import compressed_kv
    from octopus_audio.codecs import UNCOMPRESSED

    return compressed_kv(pipe, UNCOMPRESSED, 16, kv_dtype=torch.bfloat16 if dtype is None else dtype)


def patched(module):
    """Whether the patch is on `module` (it installs its `forward` as an instance attribute)."""
    return "forward" in module.__dict__


def cond():
    return torch.randn(1, 512, generator=torch.Generator().manual_seed(7))


def run_both(pipe):
    """Generation (seed SEED) and teacher forcing on its tokens, without and with the rounded cache."""
    from octopus_audio.aar_patch import generate
    from octopus_audio.eval.fidelity import teacher_forced_probs

    with torch.inference_mode():
        ref = generate(pipe, cond(), seed=SEED)
        probs_ref = teacher_forced_probs(pipe, cond(), ref.tokens)
        with bf16_kv(pipe):
            got = generate(pipe, cond(), seed=SEED)
            probs_got = teacher_forced_probs(pipe, cond(), ref.tokens)
    return ref, got, probs_ref, probs_got


def bf16_exact(x):
    return torch.equal(x, x.bfloat16().float())


# --- the rounding itself -----------------------------------------------------------------------------------

def test_a_cache_already_in_bf16_gives_the_reference_bit_for_bit():
    ref, got, probs_ref, probs_got = run_both(tiny_pipe(bf16_cache=True))
    assert all(torch.equal(a, b) for a, b in zip(ref.tokens, got.tokens, strict=True))
    assert torch.equal(ref.fhat, got.fhat) and torch.equal(ref.audio, got.audio)
    assert all(torch.equal(a, b) for a, b in zip(probs_ref, probs_got, strict=True))

    # the same model with its key and value weights left random: the rounding moves the distributions
    _, _, probs_ref, probs_got = run_both(tiny_pipe())
    assert max(float((a - b).abs().max()) for a, b in zip(probs_ref, probs_got, strict=True)) > 1e-7


def test_cached_keys_and_values_are_the_references_rounded_and_queries_are_not():
    """Teacher forcing feeds layer 0 the same inputs in both runs, so its cache must be exactly the
    reference's keys and values rounded, and its output the attention of the unrounded queries over them
    (through the scale loop, where the cache exists; the one pass is checked against it in
    test_eval_fidelity)."""
    from octopus_audio.eval.fidelity import teacher_forced_probs

    pipe = tiny_pipe()
    first, last = pipe.aar.blocks[0].attn, pipe.aar.blocks[-1].attn
    seen, patch = {}, {}

    def record(name, layer):
        def hook(module, args, output):
            if module.caching:  # the model's own cache, or under the patch the layer's cache as it holds it
                k, v = ((module.cached_k, module.cached_v) if "handle" not in patch
                        else patch["handle"].caches[layer].decoded_kv())
                seen[name] = (args[0].clone(), output.clone(), k.clone(), v.clone())
        return hook

    handles = [first.register_forward_hook(record("first", 0)),
               last.register_forward_hook(record("last", len(pipe.aar.blocks) - 1))]
    try:
        with torch.inference_mode():
            tokens = [torch.randint(0, 256, (1, pn), generator=torch.Generator().manual_seed(pn))
                      for pn in PATCH_NUMS]
            teacher_forced_probs(pipe, cond(), tokens, scale_loop=True)
            x_ref, _, k_ref, v_ref = seen["first"]
            assert not bf16_exact(k_ref) and not bf16_exact(v_ref)  # the reference's cache is fp32
            with bf16_kv(pipe) as patch["handle"]:
                teacher_forced_probs(pipe, cond(), tokens, scale_loop=True)
    finally:
        for h in handles:
            h.remove()
    x, out, k, v = seen["first"]  # the last scale of layer 0
    assert torch.equal(x, x_ref)
    assert torch.equal(k, k_ref.bfloat16().float()) and torch.equal(v, v_ref.bfloat16().float())
    with torch.inference_mode():
        q, _, _ = type(first)._qkv(first, x)  # the class's own projection: unrounded
        expected = first._project(F.scaled_dot_product_attention(q, k, v, scale=1.0))
        rounded_q = first._project(F.scaled_dot_product_attention(q.bfloat16().float(), k, v, scale=1.0))
    assert torch.equal(out, expected)
    assert not torch.equal(out, rounded_q)
    _, _, k_last, v_last = seen["last"]
    assert bf16_exact(k_last) and bf16_exact(v_last)  # deeper layers: inputs differ, cache still bf16


def test_leaving_the_block_restores_the_model_even_after_an_error():
    from octopus_audio.aar_patch import generate

    pipe = tiny_pipe()
    attns = [b.attn for b in pipe.aar.blocks]
    with torch.inference_mode():
        before = generate(pipe, cond(), seed=SEED, top_k=0, top_p=0.0)
        with pytest.raises(KeyError), bf16_kv(pipe) as handle:
            assert handle.num_layers == len(attns) and all(patched(m) for m in attns)
            raise KeyError("inside")
        assert not handle.active and not any(patched(m) for m in attns)
        after = generate(pipe, cond(), seed=SEED, top_k=0, top_p=0.0)
    assert torch.equal(before.fhat, after.fhat)


def test_bad_uses_are_refused_before_any_module_is_touched():
    from octopus_audio.aar_patch import compressed_kv

    pipe = tiny_pipe()
    with pytest.raises(ValueError, match="no attention modules"), bf16_kv(torch.nn.Linear(2, 2)):
        pass
    with pytest.raises(ValueError, match="floating torch dtype"), bf16_kv(pipe, dtype=torch.int8):
        pass
    with pytest.raises(ValueError, match="encodes them itself"), \
            compressed_kv(pipe, "octopus", 2, kv_dtype=torch.bfloat16):
        pass
    with bf16_kv(pipe), pytest.raises(RuntimeError, match="already patched"), bf16_kv(pipe):
        pass
    assert not any(patched(b.attn) for b in pipe.aar.blocks)


# --- the eval row ------------------------------------------------------------------------------------------

def rows_of(out):
    return [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]


def run_real(clips, out, pipe, cfg):
    refs = list_folder(clips, n=10, seed=0)

    def make_backend(device):
        return LazyBackend(lambda: AARBackend(pipe, cfg, "tiny-aar", "cpu"), "tiny-aar")

    return evaluate(refs, out, cfg, make_backend, FakeConditioner(), meta={"clips": "test"}, progress=False)


# the metrics of an output equal to the reference (latent cosine to 1 ulp); its tokens never part from the
# reference's: the parting scale is the number of scales + 1
IDENTICAL = {"lsd_db": 0.0, "logmel_mse": 0.0, "snr_db": 120.0, "latent_cos": 1.0,
             "first_parting_scale": len(PATCH_NUMS) + 1, "tf_top1": 1.0, "tf_kl_nats": 0.0}


@pytest.mark.parametrize("bf16_cache", [True, False], ids=["cache-already-bf16", "random-weights"])
def test_the_row_on_a_tiny_model_differs_from_the_reference_only_by_the_rounding(tmp_path, bf16_cache):
    clips = make_clips(tmp_path / "clips", n=1)
    out = tmp_path / "out"
    cfg = EvalConfig(codecs=("none",), seed=SEED, top_k=0, top_p=0.0, floor=False, bf16_floor=True)
    results = run_real(clips, out, tiny_pipe(bf16_cache), cfg)
    ref, row, none = rows_of(out)
    assert ref["codec"] == REFERENCE and ref["metrics"] is None  # the reference's own row
    assert (row["codec"], row["bits"], row["seed"], row["kv"]) == (KV_FLOOR, None, SEED, None)
    assert row["status"] == "ok"
    assert none["metrics"] == pytest.approx(IDENTICAL, abs=1e-15)  # codec none: the reference bit for bit
    if bf16_cache:
        assert row["metrics"] == none["metrics"]
    else:
        # the rounding moves the distributions, a little (in fp32 probabilities a KL this small may be < 0)
        assert row["metrics"]["tf_kl_nats"] != 0.0 and abs(row["metrics"]["tf_kl_nats"]) < 1e-3
    assert (out / "wav" / "clip0__00_reference_bf16_kv.wav").is_file()

    (group,) = [g for g in results["groups"] if g["codec"] == KV_FLOOR]
    assert results["groups"][0] is group and group["ratio"] is None and group["clips_ok"] == 1
    md = (out / "table.md").read_text()
    line = next(ln for ln in md.splitlines() if ln.startswith(f"| {KV_FLOOR} |"))  # the paired table's
    cells = [c.strip() for c in line.strip("|").split("|")]
    # K bits, V bits, sink scales; then K+V bits, KV ratio, K/V bits
    assert cells[:5] == [KV_FLOOR, "-", "-", "-", "1"] and cells[-4:] == ["-"] * 4
    assert all(c != "-" for c in cells[4:-4])  # sampled and teacher-forced metrics
    kl = row["metrics"]["tf_kl_nats"]  # a tiny KL in scientific notation, never a misleading 0.00000
    assert cells[11] == ("0.00000 [0.00000, 0.00000]" if bf16_cache else f"{kl:.2e} [{kl:.2e}, {kl:.2e}]")
    assert "every key and value rounded to bfloat16 as it enters the KV cache" in md
    assert "sampling floor" not in md  # the other floor is off
    page = (out / "index.html").read_text()
    assert f"<b>{KV_FLOOR}</b>" in page and "src='wav/clip0__00_reference_bf16_kv.wav'" in page


# --- resume and the CLI, with the runner tests' fake model ----------------------------------------------

def run_fake(clips, out, pipe, cfg):
    refs = list_folder(clips, n=10, seed=0)

    def build():
        return AARBackend(pipe, cfg, "fake-aar", "cpu", generate_fn=fake_generate,
                          compressed_kv_fn=fake_compressed_kv, teacher_forced_fn=fake_teacher_forced)

    return evaluate(refs, out, cfg, lambda device: LazyBackend(build, "fake-aar"), FakeConditioner(),
                    meta={"clips": "test"}, progress=False)


def fake_config(bf16_floor=True):
    return EvalConfig(codecs=("octopus",), bits=(2,), seed=SEED, floor=True, bf16_floor=bf16_floor)


def test_the_row_comes_after_the_sampling_floor_and_a_later_run_adds_only_it(tmp_path):
    clips = make_clips(tmp_path / "clips", n=2)
    out = tmp_path / "out"
    run_fake(clips, out, FakePipe(), fake_config(bf16_floor=False))
    assert KV_FLOOR not in (out / "table.md").read_text()

    pipe = FakePipe()
    results = run_fake(clips, out, pipe, fake_config())
    # per clip: one generation and one teacher-forced pass (the reference's is recomputed from its tokens)
    assert pipe.calls == 2 and [a for a, _ in pipe.forced] == [None, (KV_FLOOR, 16)] * 2
    assert [(r["clip"], r["codec"]) for r in rows_of(out)] == [
        (clip, codec) for clip in ("clip0", "clip1") for codec in (REFERENCE, FLOOR, KV_FLOOR, "octopus")]
    assert [g["codec"] for g in results["groups"]] == [FLOOR, KV_FLOOR, "octopus"]
    kv_rows = [r for r in rows_of(out) if r["codec"] == KV_FLOOR]
    assert all(r["seed"] == SEED and r["kv"] is None and r["metrics"]["tf_kl_nats"] > 0 for r in kv_rows)


@pytest.mark.parametrize("interrupt_at", [3, 7], ids=["during-clip0-row", "during-clip1-row"])
def test_an_interrupted_run_resumes_with_one_row_per_clip(tmp_path, interrupt_at):
    clips = make_clips(tmp_path / "clips", n=2)
    out = tmp_path / "out"
    # generations per clip: reference, other-seed floor, bf16-KV floor, octopus b2; so 3 and 7 are the rows
    with pytest.raises(KeyboardInterrupt):
        run_fake(clips, out, FakePipe(interrupt_at=interrupt_at), fake_config())
    log = out / "rows" / "rank0.jsonl"
    before = [json.loads(line) for line in log.read_text().splitlines()]
    assert len([r for r in before if r["codec"] == KV_FLOOR]) == (interrupt_at - 3) // 4
    run_fake(clips, out, FakePipe(), fake_config())
    pipe = FakePipe()
    run_fake(clips, out, pipe, fake_config())  # nothing left
    assert pipe.calls == 0
    logged = [json.loads(line) for line in log.read_text().splitlines()]
    assert sorted(r["clip"] for r in logged if r["codec"] == KV_FLOOR) == ["clip0", "clip1"]
    assert len(logged) == 8 and all(r["status"] == "ok" for r in logged)


def test_bf16_floor_must_be_a_bool():
    from octopus_audio.errors import UsageError

    with pytest.raises(UsageError, match="bf16_floor must be True or False"):
        EvalConfig(codecs=("octopus",), bf16_floor=1)
    off, on = EvalConfig(codecs=("octopus",)), EvalConfig(codecs=("octopus",), bf16_floor=True)
    from octopus_audio.aar_patch.patch import DEFAULT_SINK_SCALES as S

    assert off.jobs() == [Job(FLOOR), Job("octopus", 2, 2, S, 0), Job("octopus", 3, 3, S, 0),
                          Job("octopus", 4, 4, S, 0)]  # opt-in here
    assert on.jobs()[:2] == [Job(FLOOR), Job(KV_FLOOR)]
    assert off.identity() == on.identity()  # a rerun into the same folder may add the row
