"""What a decode kind is to the kernels (`DecodeKind`), and the registry a codec names its kind in.

A decode kind is how a codec's key codes turn back into a score: a centroid per rotated coordinate
("scalar"), recursive polar angles ("polar"), an octahedral direction and a norm per triplet ("triplet"). Each
is one module of this package holding its host-side record (a `DecodeKind`), its @triton.jit helpers and its
launch table, and registers the record (`register_kind`). A codec declares its kind by name
(`kernel_decode`); the kernels read everything else from the record, so every implementation takes a kind as
a compile-time parameter: its @triton.jit helpers are handed to the kernels as tl.constexpr functions.

Each helper has the signature the implementation calls it with (the QJL side-car, common to the kinds, is
octopus_audio/kernels/qjl.py), its compile-time parameters one named tuple `K` (fields read as `K.D`):
- split-K attention (octopus_audio/kernels/impls/flash.py): `queries(q_pro, qmap, qn, rot_scale, K) -> (qa,
  qb, qc)`, the query operands; `scores(s, qa, qb, qc, k_rows, n_ok, gamma, tab_a_ptr, tab_b_ptr, K) -> s`,
  s plus the scores of a tile of keys; K an `AttentionConstants`;
- key encode (impls/encode.py), optional: `KindEncode.codes`, the signature of
  `octopus_audio.kernels.kinds.scalar.encode_codes`, K an `EncodeConstants`;
- one-row score tables (impls/score_tables.py), optional: `KindTables.step`, the signature of
  `octopus_audio.kernels.tables.sum_step`, plus a host function that builds the tables.
The kernels forward the compile-time parameters LP, B_DIR, B_RHO, DIR_TABLE (attention) and B_DIR, B_RHO,
SEARCH_K, LUT_SCALE, HALF, RHO_SCALE, LP (encode) to these helpers unread: a kind fills those it reads
(`constants`, `KindEncode.constants`), the others keep `ATTENTION_PARAMS` / `ENCODE_PARAMS`' defaults.
tests/test_kinds.py adds a made-up kind from its own file and runs it through every implementation.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import NamedTuple

# the kind parameters the kernels forward, and their values for a kind that reads none of them
ATTENTION_PARAMS = {"LP": 16, "B_DIR": 0, "B_RHO": 0, "DIR_TABLE": 0}
ENCODE_PARAMS = {"B_DIR": 0, "B_RHO": 0, "SEARCH_K": 0, "LUT_SCALE": 0, "HALF": 0, "RHO_SCALE": 0, "LP": 16}


class AttentionConstants(NamedTuple):
    """The split-K attention kernel's compile-time parameters that a kind's `queries` and `scores` read (one
    tuple argument K, built in the kernel): a tile of BLOCK_N keys of D coordinates (LOG2D its log2), LP the
    triplet lanes, the key codes (K_BITS bits, K_CODES of them in K_WORDS words; word tiles K_WP wide, K_WP2
    for half a key's; TILE: codes cut from word tiles), the kind's B_DIR, B_RHO, DIR_TABLE, and the dots:
    HALVES (d-wide ones as two of d/2), USE_DOT, PREC (scores) and PREC_Q (query projections), operand dtype
    OPD, RNE_BY_HAND."""

    BLOCK_N: int
    D: int
    LP: int
    LOG2D: int
    K_BITS: int
    K_CODES: int
    K_WORDS: int
    B_DIR: int
    B_RHO: int
    DIR_TABLE: int
    K_WP: int
    K_WP2: int
    TILE: bool
    HALVES: bool
    USE_DOT: bool
    PREC: object
    PREC_Q: object
    OPD: object
    RNE_BY_HAND: bool


class EncodeConstants(NamedTuple):
    """The key kernel's compile-time parameters that a kind's key encode reads (one tuple argument K, built
    in the kernel; impls/encode.py says what each is): head dim D (LOG2D), the codes (K_BITS bits, K_CODES of
    them, packed into word tiles WP wide of KP codes), the kind's ENCODE_PARAMS, HAS_QJL, DOT_NATIVE, SPLIT,
    EXACT and the rows a program, BLOCK_T."""

    D: int
    LOG2D: int
    K_BITS: int
    K_CODES: int
    WP: int
    KP: int
    B_DIR: int
    B_RHO: int
    SEARCH_K: int
    LUT_SCALE: float
    HALF: int
    RHO_SCALE: float
    LP: int
    HAS_QJL: bool
    DOT_NATIVE: bool
    SPLIT: bool
    EXACT: int
    BLOCK_T: int


def _no_constants(kc) -> dict:
    return {}


def _rotation_block(kc, rot):
    return rot


def _never(kc) -> bool:
    return False


@dataclasses.dataclass(frozen=True, eq=False)
class KindEncode:
    """A kind's key encode (impls/encode.py): `codes` the @triton.jit helper that turns a tile of keys into
    code words; `constants(kc)`: its compile-time parameters (ENCODE_PARAMS' names); `tables(kc, dtype)`: its
    four table arguments (hadt, xib, aux, dir; None: unused); `launch`: rows per program, warps and register
    cap (None: none) of the key kernel by (head-dim class 64 or 128, QJL side-car); `launch_bits`: the same
    at a code width, keyed (head-dim class, QJL, code bits); `unit_caps`: the fused unit encode's register
    cap where it differs (0: none), keyed as launch_bits; `near_rows`: the encode flags groups of this many
    rows holding a choice that may differ from the reference's, and a second launch redoes them (EXACT 1,
    then 2; 0: one launch, EXACT 0)."""

    codes: object
    launch: dict[tuple[int, bool], tuple[int, int, int | None]]
    constants: Callable[[object], dict] = _no_constants
    tables: Callable[[object, object], tuple] = lambda kc, dtype: (None, None, None, None)
    launch_bits: dict[tuple[int, bool, int], tuple[int, int, int | None]] = dataclasses.field(
        default_factory=dict)
    unit_caps: dict[tuple[int, bool, int], int] = dataclasses.field(default_factory=dict)
    near_rows: int = 0


@dataclasses.dataclass(frozen=True, eq=False)
class KindTables:
    """A kind's per-query score tables (impls/score_tables.py): `layout(kc, group)` the TableLayout
    (octopus_audio.kernels.tables) of its keys' table codes; `build(q, kc, lay, h, qk_scale)` -> (lut, qlut)
    the tables of the query rows (one launch of the kind's own kernel); `step`: the @triton.jit score step
    of the attention loop; `aux(kc)`: the table the step reads beside them (its `rho_ptr`); `capped(kc, lay)`:
    its key loop fits under the register cap (score_tables.MAX_REGISTERS); `wide_launch`: its launch at
    d >= 128 where it differs from score_tables.TABLE_LAUNCH's; `groups`: it takes attention_adc's `group`
    (coordinates a table code); `what`: what its table is called in messages."""

    layout: Callable
    build: Callable
    step: object
    aux: Callable
    capped: Callable = lambda kc, lay: False
    wide_launch: tuple[int, int, int, int, int] | None = None
    groups: bool = False
    what: str = "a table"


@dataclasses.dataclass(frozen=True, eq=False)
class DecodeKind:
    """A decode kind as the kernels see it. `name`: what a codec's `kernel_decode` says; `tables(kc)`: the
    shapes of the float32 tables it reads, by name (KernelCodec checks them); `attention_tables(kc)`: the two
    table pointers of the split-K attention kernel; `constants(kc)`: its parameters there (ATTENTION_PARAMS'
    names); `queries`, `scores`: its @triton.jit helpers there (the module docstring gives their
    signatures); `query_block(kc, rot)`: the columns of the rotation block of the query map (rot [H, d, d] ->
    [H, d, NQ]); `halves`: at d >= 128 its d-wide score dots run as two of d/2; `gathers(kc)`: query blocks
    load one code a gather, not word tiles; `encode`, `score_tables`: its key encode and one-row score
    tables (None: its codecs encode in the library; one query row runs split-K). `id`: its number in the
    registry (registration order), given by `register_kind`: the sm_90 kernel's compile-time codec ids
    derive from it."""

    name: str
    tables: Callable[[object], dict[str, tuple[int, ...]]]
    attention_tables: Callable
    queries: object
    scores: object
    constants: Callable[[object], dict] = _no_constants
    query_block: Callable = _rotation_block
    halves: bool = True
    gathers: Callable[[object], bool] = _never
    encode: KindEncode | None = None
    score_tables: KindTables | None = None
    id: int = -1

    def __repr__(self) -> str:
        return f"DecodeKind({self.name!r})"


_KINDS: dict[str, DecodeKind] = {}


def _home(kind: DecodeKind) -> str:
    """The module that defines a kind's helpers."""
    return getattr(kind.scores, "fn", kind.scores).__module__


def register_kind(kind: DecodeKind) -> DecodeKind:
    """Add a decode kind to the registry (its `id`: the next number); returns it. ValueError for a name
    another module's kind has (the same module registering again, as `importlib.reload` does, replaces its
    kind under the same id)."""
    if not isinstance(kind, DecodeKind) or not kind.name:
        raise ValueError(f"register_kind takes a DecodeKind with a name, got {kind!r}")
    old = _KINDS.get(kind.name)
    if old is not None and _home(old) != _home(kind):
        raise ValueError(f"decode kind {kind.name!r} is registered already (by {_home(old)})")
    new_id = old.id if old is not None else max((k.id for k in _KINDS.values()), default=-1) + 1
    object.__setattr__(kind, "id", new_id)
    _KINDS[kind.name] = kind
    return kind


def unregister_kind(name: str) -> None:
    """Remove a decode kind (KeyError when it is not registered)."""
    del _KINDS[name]


def kind_named(name: str) -> DecodeKind:
    """The registered kind `name`; ValueError naming the kinds there are otherwise."""
    if name not in _KINDS:
        raise ValueError(f"no kernel decode kind {name!r}; the kernels have {', '.join(_KINDS)}")
    return _KINDS[name]


def kinds() -> Sequence[DecodeKind]:
    """The registered kinds in registration order."""
    return tuple(_KINDS.values())
