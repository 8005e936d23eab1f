"""Plain PyTorch reference of the kernels, with the same arguments as the launchers in ops.py (formats.md)."""

from __future__ import annotations

import math

import torch

from .spec import V_GROUP, KernelCodec, PackedKeys, PackedValues


def pack(codes: torch.Tensor, n: int) -> torch.Tensor:
    """Codes [..., L] (ints in [0, 2**n)) -> little-endian int32 words [..., ceil(L*n/32)]."""
    length = codes.shape[-1]
    bits = (codes.long()[..., None] >> torch.arange(n, device=codes.device)) & 1  # [..., L, n]
    bits = bits.reshape(*codes.shape[:-1], length * n)
    words = -(-length * n // 32)
    bits = torch.nn.functional.pad(bits, (0, words * 32 - length * n)).reshape(*codes.shape[:-1], words, 32)
    value = (bits << torch.arange(32, device=codes.device)).sum(-1)  # int64, < 2**32
    return torch.where(value >= 2**31, value - 2**32, value).to(torch.int32)


def unpack(words: torch.Tensor, n: int, length: int) -> torch.Tensor:
    """Int32 words [..., W] -> codes [..., length] (int64)."""
    bits = (words.long()[..., None] >> torch.arange(32, device=words.device)) & 1
    bits = bits.reshape(*words.shape[:-1], -1)[..., : length * n].reshape(*words.shape[:-1], length, n)
    return (bits << torch.arange(n, device=words.device)).sum(-1)


def hadamard(d: int, device=None) -> torch.Tensor:
    """Sylvester Hadamard matrix H_d (+-1, float32)."""
    h = torch.ones(1, 1, device=device)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def rotate(x_BHTD: torch.Tensor, signs_HD: torch.Tensor) -> torch.Tensor:
    """R x per head with R = H diag(s) / sqrt(d) (float32); x [B, H, T, d], signs [H, d]."""
    d = x_BHTD.shape[-1]
    r_HDD = hadamard(d, x_BHTD.device) * signs_HD[:, None, :] / math.sqrt(d)
    return torch.einsum("bhtj,hij->bhti", x_BHTD.float(), r_HDD)


def _bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16)


def _index(x: torch.Tensor, boundaries: torch.Tensor) -> torch.Tensor:
    """#{i : x > beta_i}."""
    return torch.searchsorted(boundaries.contiguous(), x.contiguous(), right=False)


def _fold(n: torch.Tensor) -> torch.Tensor:
    """Octahedral map of unit directions [..., 3] -> (xi, eta) [..., 2], sign(0) = +1."""
    def sgn(t):
        return torch.where(t < 0, -1.0, 1.0)
    l1 = n.abs().sum(-1)
    px, py = n[..., 0] / l1, n[..., 1] / l1
    lower = n[..., 2] < 0
    xi = torch.where(lower, sgn(px) * (1 - py.abs()), px)
    eta = torch.where(lower, sgn(py) * (1 - px.abs()), py)
    return torch.stack([xi, eta], -1)


def _octopus_codes(u: torch.Tensor, codec: KernelCodec) -> tuple[torch.Tensor, torch.Tensor]:
    """Joint local3x3 rounding of the triplets of u [..., d] -> codes [..., L] and t_hat [..., L, 3]."""
    d, length = codec.head_dim, codec.num_codes
    t = torch.nn.functional.pad(u, (0, 3 * length - d)).reshape(*u.shape[:-1], length, 3)
    rho = (t * t).sum(-1).sqrt()
    n = torch.where(rho[..., None] > 0, t / rho.clamp_min(1e-38)[..., None], torch.tensor([0.0, 0.0, 1.0]))
    seeds = _index(_fold(n), codec.table("xi_boundaries"))
    m = 2**codec.param("b_dir")
    best_cost = torch.full(rho.shape, math.inf)
    best_dir = torch.zeros(rho.shape, dtype=torch.long)
    best_rho = torch.zeros(rho.shape, dtype=torch.long)
    for dx in (-1, 0, 1):
        for dy in (-1, 0, 1):
            i_xi = (seeds[..., 0] + dx).clamp(0, m - 1)
            i_eta = (seeds[..., 1] + dy).clamp(0, m - 1)
            flat = i_xi * m + i_eta
            s = (t * codec.table("directions")[flat]).sum(-1)
            i_rho = _index(s, codec.table("boundaries"))
            rho_hat = codec.table("centroids")[i_rho]
            cost = ((t * t).sum(-1) - 2 * rho_hat * s) + rho_hat * rho_hat
            better = (cost < best_cost) | ((cost == best_cost) & (flat < best_dir))
            best_cost = torch.where(better, cost, best_cost)
            best_dir = torch.where(better, flat, best_dir)
            best_rho = torch.where(better, i_rho, best_rho)
    zero = rho == 0  # placeholder direction (its seeds) and the rho index of 0
    best_dir = torch.where(zero, seeds[..., 0] * m + seeds[..., 1], best_dir)
    best_rho = torch.where(zero, _index(rho, codec.table("boundaries")), best_rho)
    codes = (best_dir << codec.param("b_rho")) | best_rho
    t_hat = codec.table("centroids")[best_rho][..., None] * codec.table("directions")[best_dir]
    return codes, t_hat


def _polar_codes(u: torch.Tensor, codec: KernelCodec) -> torch.Tensor:
    """Recursive polar angles of u [..., d] -> codes [..., d-1] (level 1 first)."""
    out, r, level = [], u, 0
    while r.shape[-1] > 1:
        a, b = r[..., 0::2], r[..., 1::2]
        psi = torch.atan2(b, a)
        if level == 0:
            psi = torch.where(psi < 0, psi + 2 * math.pi, psi)
        out.append(_index(psi, codec.table("boundaries")[level]))
        r = torch.sqrt(a * a + b * b)
        level += 1
    return torch.cat(out, -1)


def _polar_decode(codes: torch.Tensor, codec: KernelCodec) -> torch.Tensor:
    d = codec.head_dim
    levels = int(math.log2(d))
    r = torch.ones(*codes.shape[:-1], 1)
    for level in range(levels - 1, -1, -1):
        start = d - (d >> level)
        idx = codes[..., start:start + (d >> (level + 1))]
        psi = codec.table("centroids")[level][idx]
        r = torch.stack([r * torch.cos(psi), r * torch.sin(psi)], -1).reshape(*codes.shape[:-1], -1)
    return r


def decode_unit(keys: PackedKeys, codec: KernelCodec) -> torch.Tensor:
    """u_hat [B, H, T, d] (rotated frame, unit scale) from the codes field."""
    d, n, length = codec.head_dim, codec.code_bits, codec.num_codes
    shape = keys.codes.shape[:-1]
    if n == 0:
        return torch.zeros(*shape, d)
    codes = unpack(keys.codes.cpu(), n, length)
    if codec.decode == "triplet":
        rho_hat = codec.table("centroids")[codes & (2**codec.param("b_rho") - 1)]
        t_hat = rho_hat[..., None] * codec.table("directions")[codes >> codec.param("b_rho")]
        return t_hat.reshape(*shape, -1)[..., :d]
    if codec.decode == "polar":
        return _polar_decode(codes, codec)
    return codec.table("centroids")[codes]


def encode_keys(k_BHTD: torch.Tensor, codec: KernelCodec) -> PackedKeys:
    """K [B, H, T, d] (any float dtype) -> PackedKeys, computed on the CPU in float32."""
    codec = codec.to("cpu")
    kf = k_BHTD.detach().cpu().float()
    peak = kf.abs().amax(-1, keepdim=True)
    gamma = (kf / torch.where(peak > 0, peak, torch.ones_like(peak))).norm(dim=-1) * peak.squeeze(-1)
    u = rotate(kf, codec.rotation_signs) / gamma.clamp_min(1e-30)[..., None]
    n = codec.code_bits
    if codec.decode == "triplet":
        codes, t_hat = _octopus_codes(u, codec)
        u_hat = t_hat.reshape(*u.shape[:-1], -1)[..., : codec.head_dim]
    elif codec.decode == "polar":
        codes, u_hat = _polar_codes(u, codec), None
    elif n > 0:
        codes = _index(u, codec.table("boundaries"))
        u_hat = codec.table("centroids")[codes]
    else:
        codes, u_hat = torch.zeros(*u.shape[:-1], 0, dtype=torch.long), torch.zeros_like(u)
    packed = pack(codes, max(n, 1)) if n > 0 else torch.zeros(*u.shape[:-1], 0, dtype=torch.int32)
    signs = gamma_r = None
    if codec.has_qjl:
        r = u - u_hat
        proj = rotate(r, codec.qjl_signs)
        signs = pack((proj >= 0).long(), 1)
        gamma_r = _bf16(r.norm(dim=-1))
    dev = k_BHTD.device
    return PackedKeys(packed.to(dev), _bf16(gamma).to(dev), None if signs is None else signs.to(dev),
                      None if gamma_r is None else gamma_r.to(dev))


def encode_values(v_BHTD: torch.Tensor, bits: int, group: int = V_GROUP,
                  check_range: bool = True) -> PackedValues:
    """V [B, H, T, d] -> PackedValues (groups of `group` channels, fp16 scale and minimum)."""
    del check_range
    vf = v_BHTD.detach().cpu().float()
    g = vf.reshape(*vf.shape[:-1], -1, group)
    mn, mx = g.amin(-1), g.amax(-1)
    mn16 = mn.half()
    scale16 = ((mx - mn) / (2**bits - 1)).clamp(max=65504.0).half()
    scale16 = torch.where(scale16 == 0, torch.ones_like(scale16), scale16)
    codes = torch.round((g - mn16.float()[..., None]) / scale16.float()[..., None]).clamp(0, 2**bits - 1)
    packed = pack(codes.reshape(vf.shape).long(), bits)
    dev = v_BHTD.device
    return PackedValues(packed.to(dev), scale16.to(dev), mn16.to(dev), bits, group)


def decode_values(values: PackedValues, d: int) -> torch.Tensor:
    codes = unpack(values.codes.cpu(), values.bits, d).float()
    g = codes.reshape(*codes.shape[:-1], -1, values.group)
    v = g * values.scale.cpu().float()[..., None] + values.minimum.cpu().float()[..., None]
    return v.reshape(codes.shape)


def attention(q_BHTD: torch.Tensor, keys: PackedKeys, values: PackedValues, length: int,
              k_window: torch.Tensor | None, v_window: torch.Tensor | None, codec: KernelCodec,
              scale: float | None = None, num_splits: int | None = None,
              octopus_directions: str = "unfold") -> torch.Tensor:
    """softmax(scale * q.[K_hat; K_win]) @ [V_hat; V_win] in float64, output in q's dtype.

    q [B, Hq, Tq, d]; store fields [B, H, Tcap, ...] of which the first `length` tokens count; window
    [B, H, Tw, d]. Hq = G * H: query head h*G + g uses KV head h. `num_splits` and `octopus_directions` are
    accepted for signature parity with ops.attention (the reference always reads the direction table).
    """
    del num_splits, octopus_directions
    codec = codec.to("cpu")
    b, hq, tq, d = q_BHTD.shape
    h = keys.codes.shape[1]
    grp = hq // h
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q = q_BHTD.detach().cpu().double().reshape(b, h, grp * tq, d)
    cut = slice(0, length)
    sel = PackedKeys(keys.codes[:, :, cut].cpu(), keys.gamma[:, :, cut].cpu(),
                     None if keys.signs is None else keys.signs[:, :, cut].cpu(),
                     None if keys.gamma_r is None else keys.gamma_r[:, :, cut].cpu())
    u_hat = decode_unit(sel, codec).double()
    q_rot = rotate(q.float(), codec.rotation_signs).double()
    s_c = q_rot @ u_hat.transpose(-1, -2)
    if codec.has_qjl:
        q_j = rotate(q_rot.float(), codec.qjl_signs).double()
        sigma = unpack(sel.signs, 1, d).double() * 2 - 1
        coef = math.sqrt(math.pi / (2 * d)) * sel.gamma_r.double()
        s_c = s_c + coef[:, :, None, :] * (q_j @ sigma.transpose(-1, -2))
    s_c = s_c * sel.gamma.double()[:, :, None, :]
    v_parts = [decode_values(PackedValues(values.codes[:, :, cut], values.scale[:, :, cut],
                                          values.minimum[:, :, cut], values.bits, values.group), d).double()]
    s_parts = [s_c]
    if k_window is not None and k_window.shape[2] > 0:
        s_parts.append(q @ k_window.detach().cpu().double().transpose(-1, -2))
        v_parts.append(v_window.detach().cpu().double())
    s = torch.cat(s_parts, -1) * scale
    if s.shape[-1] == 0:
        raise ValueError("attention needs at least one key: the store and the window are both empty")
    out = torch.softmax(s, -1) @ torch.cat(v_parts, -2)
    return out.reshape(b, hq, tq, d).to(q_BHTD.dtype).to(q_BHTD.device)
