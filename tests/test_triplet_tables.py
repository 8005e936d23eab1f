"""The key encode's triplet search tables (kernels/kinds/triplet_search.py) against the library's local3x3."""

import pytest
import torch

from octopus_audio.codebooks import get_codebook
from octopus_audio.kernels.kinds import triplet_search as tt
from octopus_audio.octahedral import direction_table, round_triplets


def _tables(b_dir: int, b_rho: int = 3, d: int = 64) -> tt.TripletSearchTables:
    xi = get_codebook("xi", None, b_dir)
    rho = get_codebook("rho", d, b_rho)
    return tt.search_tables(direction_table(b_dir), xi.centroids, xi.boundaries, rho.boundaries)


def _triplets(n: int, seed: int) -> torch.Tensor:
    """Random directions at norms 0.05..1.05 (a unit key's triplets), with rows on the symmetry planes, on the
    octahedron's equator and poles, and exact zeros."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(n, 3, generator=g)
    t[:50] = 0.0
    t[50:100, 0] = 0.0
    t[100:150, 1] = t[100:150, 0]
    t[150:200, 1] = -t[150:200, 0]
    t[200:250, 2] = 0.0
    t[250:300, :2] = 0.0
    norm = t.norm(dim=1, keepdim=True).clamp_min(1e-30)
    return t / norm * (0.05 + torch.rand(n, 1, generator=g))


def _thresholds(b_dir: int, half: bool) -> torch.Tensor:
    xi = get_codebook("xi", None, b_dir)
    return torch.sort(torch.cat([xi.boundaries, xi.centroids])).values if half else xi.boundaries


@pytest.mark.parametrize("b_dir", [1, 2, 3, 4, 5, 6, 7])
def test_table_search_is_local3x3(b_dir):
    """The best listed candidate of each triplet's region is the reference's local3x3 choice (pruned regions
    up to PRUNE_MAX_DIR_BITS, whole 3x3 rows beyond), but within fp32 rounding of a tie (the kernel re-decides
    those: its near-tie test is checked here too)."""
    tables = _tables(b_dir)
    assert tables.half == (b_dir <= tt.PRUNE_MAX_DIR_BITS)
    assert tables.k == (4 if tables.half else 9)
    t = _triplets(200_000 if b_dir <= 5 else 50_000, seed=b_dir)
    i_xi, i_eta, _ = round_triplets(t, b_dir, 3, d=64)
    want = i_xi * 2**b_dir + i_eta
    got = tt.search_reference(t, tables)
    differ = got != want
    if differ.any():  # only ties within rounding: the two directions' scores within NEAR (4e-7 relative)
        dirs = direction_table(b_dir)
        s = [(t[differ] * dirs[f[differ]]).sum(1) for f in (got, want)]
        assert torch.all((s[0] - s[1]).abs() <= 4e-7 * s[0].abs()), "a difference that is not a near tie"
    assert differ.float().mean() < 1e-4


def test_zero_triplet_takes_the_placeholder_seeds():
    """A zero triplet searches as (0, 0, 1): the reference's placeholder, seeds (M/2 - 1, M/2 - 1)."""
    for b_dir in (1, 3, 5, 6):
        m = 2**b_dir
        got = tt.search_reference(torch.zeros(3, 3), _tables(b_dir))
        assert torch.equal(got, torch.full((3,), (m // 2 - 1) * m + m // 2 - 1))


@pytest.mark.parametrize("b_dir,half", [(1, True), (3, True), (5, True), (6, False), (8, False)])
def test_region_lookup_counts_thresholds_below(b_dir, half):
    """The lookup table's region of x is #{thresholds < x}, exactly: on every threshold, one ulp either side,
    on and beside every lookup cell edge, at +-1, +-0 and random x."""
    thr = _thresholds(b_dir, half)
    lut, scale = tt._lookup(thr.double().numpy())  # (every xi codebook has one)
    edges = torch.arange(2 * scale + 1, dtype=torch.float32) / scale - 1
    probes = torch.cat([thr, edges, torch.tensor([1.0, -1.0, 0.0, -0.0]), torch.rand(20_000) * 2 - 1])
    up, down = torch.full_like(probes, 2.0), torch.full_like(probes, -2.0)
    x = torch.cat([probes, torch.nextafter(probes, up), torch.nextafter(probes, down)]).clamp(-1, 1)
    want = torch.searchsorted(thr, x.contiguous(), right=False)
    assert torch.equal(tt.region(x, lut, scale), want)


def test_rho_lookup_only_from_three_bits():
    """The rho index goes through its lookup rows from RHO_LOOKUP_BITS rho bits where a lookup table exists;
    they count the boundaries below a score like the reference's searchsorted, scores of both signs
    included."""
    assert _tables(3, b_rho=2).rho_scale == 0
    assert _tables(3, b_rho=8).rho_scale == 0  # 8 bits at d=64: a boundary just below a dyadic cell edge
    for b_rho in (3, 4, 5, 6, 7):
        tables = _tables(3, b_rho=b_rho)
        assert tables.rho_scale > 0
        bnd = get_codebook("rho", 64, b_rho).boundaries
        rows = tables.lut[2 * tables.lut_scale + 1:]
        s = torch.cat([bnd, torch.nextafter(bnd, torch.ones_like(bnd)), torch.rand(20_000) * 2 - 1])
        assert torch.equal(tt.region(s, rows, tables.rho_scale), torch.searchsorted(bnd, s, right=False))


@pytest.mark.parametrize("b_dir", [3, 4, 6])
def test_candidate_rows_are_ordered_and_padded(b_dir):
    """Each row: distinct candidates in increasing flat index (the reference's tie rule) from the seed's 3x3,
    then padding (M*M) only; the direction rows are the direction table's vectors bit for bit, then a NaN
    row. b_dir = 3, 4, 6: 8-bit fields one word a row, 16-bit fields two words, 16-bit fields five words
    (nine candidates, unpruned)."""
    m = 2**b_dir
    tables, dirs = _tables(b_dir), direction_table(b_dir)
    assert tt.field_bits(b_dir) == (8 if b_dir <= 3 else 16)
    rows = tables.rows()
    assert rows.shape == (tables.regions**2, tables.k)
    for r, row in enumerate(rows):
        real = row != m * m
        n = int(real.sum())
        assert n >= 1 and bool(real[:n].all())
        flat = row[:n]
        assert torch.all(flat[1:] > flat[:-1])
        ix, iy = (r // tables.regions) >> int(tables.half), (r % tables.regions) >> int(tables.half)
        assert torch.all(((flat // m) - ix).abs() <= 1) and torch.all(((flat % m) - iy).abs() <= 1)
    table = tables.directions()
    assert table.shape == (m * m + 1, 4)
    assert torch.equal(table[: m * m, :3], dirs) and bool(torch.all(table[: m * m, 3] == 0))
    assert bool(table[m * m].isnan().all())
    assert tables.table.numel() == tt.dir_offset(tables.regions, tables.k, b_dir) + 4 * (m * m + 1)


def test_tables_reject_a_mismatched_grid():
    xi = get_codebook("xi", None, 3)
    with pytest.raises(ValueError, match="direction table"):
        tt.search_tables(direction_table(2), xi.centroids, xi.boundaries, torch.tensor([0.2]))
