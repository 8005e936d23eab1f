"""Matmul operands shared by the split-K attention and the kinds' score helpers: a tile product on the tensor
cores or as FMAs (one query row), operands rounded as the GPU rounds them, and query projections through a
head's query map."""

import triton
import triton.language as tl


@triton.jit
def mm_nt(a, b, acc, USE_DOT: tl.constexpr, PREC: tl.constexpr):
    """acc + a [M, K] @ b [N, K]^T -> [M, N] fp32: tensor cores for M >= 16, else (M == 1) FMAs and a row
    sum."""
    if USE_DOT:
        return tl.dot(a, tl.trans(b), acc, input_precision=PREC)
    else:
        return acc + tl.sum(a * b, axis=1)[None, :]


@triton.jit
def mm_nn(a, b, USE_DOT: tl.constexpr, PREC: tl.constexpr):
    """a [M, N] @ b [N, D] -> [M, D] fp32 (M == 1 without tensor cores: a column sum)."""
    if USE_DOT:
        return tl.dot(a, b, input_precision=PREC)
    else:
        return tl.sum(tl.reshape(a, (b.shape[0], 1)) * b, axis=0)[None, :]


@triton.jit
def operand(x, OPD: tl.constexpr, RNE_BY_HAND: tl.constexpr):
    """x as a matmul operand of dtype OPD. RNE_BY_HAND (the CPU interpreter, whose fp32 -> bf16 cast
    truncates): round to nearest even on the fp32 bits first, as the GPU's cast does."""
    if OPD == tl.bfloat16 and RNE_BY_HAND:  # bits.bf16_value inlined (a jit call costs in the interpreter)
        b = x.to(tl.float32).to(tl.int32, bitcast=True)
        x = ((b + 0x7FFF + ((b >> 16) & 1)) & -65536).to(tl.float32, bitcast=True)
    return x.to(OPD)


@triton.jit
def project(q_pro, qmap, cols, scale, USE_DOT: tl.constexpr, PREC_Q: tl.constexpr, OPD: tl.constexpr,
             RNE_BY_HAND: tl.constexpr):
    """Columns `cols` [1, C] of the query rows' projection q @ M_h (qmap: the head's map rows), times
    `scale`, as a matmul operand [M, C] of dtype OPD."""
    return operand(mm_nn(q_pro, tl.load(qmap + cols), USE_DOT, PREC_Q) * scale, OPD, RNE_BY_HAND)


@triton.jit
def rotated_queries(q_pro, qmap, qn, rot_scale, K):
    """A kind's `queries` (kinds/kind.py: the scalar kind's) where the map's first D columns are R q: R q as
    one operand [M, D], or (K.HALVES) its first and second halves; and qn, a third operand the kind does not
    use."""
    return _rotated_queries(q_pro, qmap, qn, rot_scale, K, False)


@triton.jit
def interleaved_queries(q_pro, qmap, qn, rot_scale, K):
    """`rotated_queries` with (K.HALVES) the even and odd coordinates of R q for its halves (the polar
    kind's)."""
    return _rotated_queries(q_pro, qmap, qn, rot_scale, K, True)


@triton.jit
def _rotated_queries(q_pro, qmap, qn, rot_scale, K, INTERLEAVED: tl.constexpr):
    if K.HALVES:
        hcol = tl.arange(0, K.D // 2)[None, :]
        c0 = 2 * hcol if INTERLEAVED else hcol
        qa = project(q_pro, qmap, c0, rot_scale, K.USE_DOT, K.PREC_Q, K.OPD, K.RNE_BY_HAND)
        c1 = c0 + (1 if INTERLEAVED else K.D // 2)
        qb = project(q_pro, qmap, c1, rot_scale, K.USE_DOT, K.PREC_Q, K.OPD, K.RNE_BY_HAND)
    else:
        qa = project(q_pro, qmap, tl.arange(0, K.D)[None, :], rot_scale, K.USE_DOT, K.PREC_Q, K.OPD,
                     K.RNE_BY_HAND)
        qb = qa
    return qa, qb, qn
