"""FlashAttention 2's two torch.library ops, registered under flash_attn's own names and signatures, for a machine
without the flash_attn package (hf_workloads.py's `flash_ops` workload uses the package itself when it imports).

What a trace reader sees of `flash_attn.flash_attn_func` is these two ops — `flash_attn::_flash_attn_forward` and
`flash_attn::_flash_attn_backward`, custom ops since flash_attn 2.6.3 (flash_attn/flash_attn_interface.py) — with
their arguments as the profiler records them, and the kernels launched directly under them. The signatures here
are flash_attn's (the same names, types and order, so torch.library derives the same schemas); the bodies are our
own Triton kernels (the FlashAttention 2 algorithm: online softmax forward, a key-block and a query-block backward),
with flash_attn's masks: causal and sliding windows aligned to the bottom right (query i sees keys
i + Lk − Lq − left … i + Lk − Lq + right; −1 is no limit; causal is right = 0). Dropout, softcap and ALiBi are not
implemented (the workload passes 0, 0 and None). Layout as flash_attn's: (batch, seqlen, heads, head dim).

`check()` compares them with torch's SDPA on a boolean mask (fp32), forward and backward."""

import torch
import triton
import triton.language as tl


@triton.jit
def _keep(qpos, kpos, offset, left, right):
    d = kpos[None, :] - (qpos[:, None] + offset)  # the key's distance from the query's diagonal
    return ((d <= right) | (right < 0)) & ((d >= -left) | (left < 0))


@triton.jit
def _key_range(m0, offset, left, right, LK, BM: tl.constexpr, BN: tl.constexpr):
    """The keys a block of queries m0 … m0 + BM − 1 may see, as whole key blocks: [lo, hi)."""
    lo = tl.where(left >= 0, tl.maximum(m0 + offset - left, 0) // BN * BN, 0)
    hi = tl.where(right >= 0, tl.minimum(m0 + BM + offset + right, LK), LK)
    return lo, hi


@triton.jit
def _fwd(
    Q,
    K,
    V,
    OUT,
    LSE,
    scale,
    H,
    LQ,
    LK,
    left,
    right,
    sqb,
    sqs,
    sqh,
    skb,
    sks,
    skh,
    sob,
    sos,
    soh,
    BM: tl.constexpr,
    BN: tl.constexpr,
    D: tl.constexpr,
):
    m0 = tl.program_id(0) * BM
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    qpos = m0 + tl.arange(0, BM)
    d = tl.arange(0, D)
    q = tl.load(Q + b * sqb + h * sqh + qpos[:, None] * sqs + d[None, :])
    m = tl.full([BM], -1e30, tl.float32)
    s_sum = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    offset = LK - LQ
    lo, hi = _key_range(m0, offset, left, right, LK, BM, BN)
    for n0 in range(lo, hi, BN):
        kpos = n0 + tl.arange(0, BN)
        k = tl.load(K + b * skb + h * skh + kpos[:, None] * sks + d[None, :])
        v = tl.load(V + b * skb + h * skh + kpos[:, None] * sks + d[None, :])
        s = tl.dot(q, tl.trans(k)) * scale
        s = tl.where(_keep(qpos, kpos, offset, left, right), s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m - m_new)
        s_sum = s_sum * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    acc = acc / s_sum[:, None]
    tl.store(OUT + b * sob + h * soh + qpos[:, None] * sos + d[None, :], acc.to(OUT.dtype.element_ty))
    tl.store(LSE + bh * LQ + qpos, m + tl.log(s_sum))


@triton.jit
def _bwd_pre(OUT, DO, DELTA, H, LQ, sob, sos, soh, BM: tl.constexpr, D: tl.constexpr):
    m0 = tl.program_id(0) * BM
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    qpos = m0 + tl.arange(0, BM)
    d = tl.arange(0, D)
    at = b * sob + h * soh + qpos[:, None] * sos + d[None, :]
    o = tl.load(OUT + at).to(tl.float32)
    do = tl.load(DO + at).to(tl.float32)
    tl.store(DELTA + bh * LQ + qpos, tl.sum(o * do, 1))


@triton.jit
def _p_ds(q, k, v, do, lse, delta, qpos, kpos, offset, left, right, scale):
    """The backward's inner step, shared by both passes: P recomputed from the log-sum-exp, dS = P ∘ (dP − Δ)."""
    s = tl.dot(q, tl.trans(k)) * scale
    p = tl.where(_keep(qpos, kpos, offset, left, right), tl.exp(s - lse[:, None]), 0.0)
    dp = tl.dot(do, tl.trans(v))
    return p, p * (dp - delta[:, None])


@triton.jit
def _bwd_dkdv(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DK,
    DV,
    scale,
    H,
    LQ,
    LK,
    left,
    right,
    sqb,
    sqs,
    sqh,
    skb,
    sks,
    skh,
    BM: tl.constexpr,
    BN: tl.constexpr,
    D: tl.constexpr,
):
    n0 = tl.program_id(0) * BN
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    kpos = n0 + tl.arange(0, BN)
    d = tl.arange(0, D)
    kat = b * skb + h * skh + kpos[:, None] * sks + d[None, :]
    k = tl.load(K + kat)
    v = tl.load(V + kat)
    dk = tl.zeros([BN, D], tl.float32)
    dv = tl.zeros([BN, D], tl.float32)
    offset = LK - LQ
    # the queries that may see this key block: kpos − offset − right … kpos − offset + left
    lo = tl.where(right >= 0, tl.maximum(n0 - offset - right, 0) // BM * BM, 0)
    hi = tl.where(left >= 0, tl.minimum(n0 + BN - offset + left, LQ), LQ)
    for m0 in range(lo, hi, BM):
        qpos = m0 + tl.arange(0, BM)
        qat = b * sqb + h * sqh + qpos[:, None] * sqs + d[None, :]
        q = tl.load(Q + qat)
        do = tl.load(DO + qat)
        lse = tl.load(LSE + bh * LQ + qpos)
        delta = tl.load(DELTA + bh * LQ + qpos)
        p, ds = _p_ds(q, k, v, do, lse, delta, qpos, kpos, offset, left, right, scale)
        dv += tl.dot(tl.trans(p.to(do.dtype)), do)
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q)
    tl.store(DK + kat, (dk * scale).to(DK.dtype.element_ty))
    tl.store(DV + kat, dv.to(DV.dtype.element_ty))


@triton.jit
def _bwd_dq(
    Q,
    K,
    V,
    DO,
    LSE,
    DELTA,
    DQ,
    scale,
    H,
    LQ,
    LK,
    left,
    right,
    sqb,
    sqs,
    sqh,
    skb,
    sks,
    skh,
    BM: tl.constexpr,
    BN: tl.constexpr,
    D: tl.constexpr,
):
    m0 = tl.program_id(0) * BM
    bh = tl.program_id(1)
    b, h = bh // H, bh % H
    qpos = m0 + tl.arange(0, BM)
    d = tl.arange(0, D)
    qat = b * sqb + h * sqh + qpos[:, None] * sqs + d[None, :]
    q = tl.load(Q + qat)
    do = tl.load(DO + qat)
    lse = tl.load(LSE + bh * LQ + qpos)
    delta = tl.load(DELTA + bh * LQ + qpos)
    dq = tl.zeros([BM, D], tl.float32)
    offset = LK - LQ
    lo, hi = _key_range(m0, offset, left, right, LK, BM, BN)
    for n0 in range(lo, hi, BN):
        kpos = n0 + tl.arange(0, BN)
        kat = b * skb + h * skh + kpos[:, None] * sks + d[None, :]
        k = tl.load(K + kat)
        v = tl.load(V + kat)
        _, ds = _p_ds(q, k, v, do, lse, delta, qpos, kpos, offset, left, right, scale)
        dq += tl.dot(ds.to(k.dtype), k)
    tl.store(DQ + qat, (dq * scale).to(DQ.dtype.element_ty))


BM, BN = 64, 64


def _window(causal: bool, left: int, right: int) -> tuple[int, int]:
    return left, 0 if causal else right


def _grid(q: torch.Tensor, block: int) -> tuple[int, int]:
    b, lq, h, _ = q.shape
    assert lq % block == 0, "sequence lengths must be multiples of the block"
    return lq // block, b * h


# flash_attn registers both for "cuda"; no device type here lets TRITON_INTERPRET=1 run them on a CPU (a smoke test)
@torch.library.custom_op("flash_attn::_flash_attn_forward", mutates_args=())
def _flash_attn_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dropout_p: float,
    softmax_scale: float,
    causal: bool,
    window_size_left: int,
    window_size_right: int,
    softcap: float,
    alibi_slopes: torch.Tensor | None,
    return_softmax: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    assert dropout_p == 0 and softcap == 0 and alibi_slopes is None and not return_softmax
    b, lq, h, dim = q.shape
    lk = k.shape[1]
    assert lk % BN == 0 and k.stride() == v.stride()
    left, right = _window(causal, window_size_left, window_size_right)
    out = torch.empty_like(q)
    lse = torch.empty((b, h, lq), dtype=torch.float32, device=q.device)
    _fwd[_grid(q, BM)](
        q,
        k,
        v,
        out,
        lse,
        softmax_scale,
        h,
        lq,
        lk,
        left,
        right,
        q.stride(0),
        q.stride(1),
        q.stride(2),
        k.stride(0),
        k.stride(1),
        k.stride(2),
        out.stride(0),
        out.stride(1),
        out.stride(2),
        BM=BM,
        BN=BN,
        D=dim,
    )
    return out, lse, torch.empty((0,), dtype=q.dtype, device=q.device), torch.zeros((2,), dtype=torch.int64, device=q.device)


@torch.library.custom_op("flash_attn::_flash_attn_backward", mutates_args=("dq", "dk", "dv"))
def _flash_attn_backward(
    dout: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    out: torch.Tensor,
    softmax_lse: torch.Tensor,
    dq: torch.Tensor | None,
    dk: torch.Tensor | None,
    dv: torch.Tensor | None,
    dropout_p: float,
    softmax_scale: float,
    causal: bool,
    window_size_left: int,
    window_size_right: int,
    softcap: float,
    alibi_slopes: torch.Tensor | None,
    deterministic: bool,
    rng_state: torch.Tensor | None = None,
) -> torch.Tensor:
    assert dq is not None and dk is not None and dv is not None and dout.stride() == q.stride() == out.stride()
    b, lq, h, dim = q.shape
    lk = k.shape[1]
    left, right = _window(causal, window_size_left, window_size_right)
    delta = torch.empty((b, h, lq), dtype=torch.float32, device=q.device)
    _bwd_pre[_grid(q, BM)](out, dout, delta, h, lq, out.stride(0), out.stride(1), out.stride(2), BM=BM, D=dim)
    qs, ks = (q.stride(0), q.stride(1), q.stride(2)), (k.stride(0), k.stride(1), k.stride(2))
    _bwd_dkdv[_grid(k, BN)](
        q, k, v, dout, softmax_lse, delta, dk, dv, softmax_scale, h, lq, lk, left, right, *qs, *ks, BM=BM, BN=BN, D=dim
    )
    _bwd_dq[_grid(q, BM)](
        q, k, v, dout, softmax_lse, delta, dq, softmax_scale, h, lq, lk, left, right, *qs, *ks, BM=BM, BN=BN, D=dim
    )
    return delta


class _Attention(torch.autograd.Function):
    """flash_attn.flash_attn_func's shape: the forward op, its output and log-sum-exp saved, the backward op."""

    @staticmethod
    def forward(ctx, q, k, v, causal, window, scale):
        out, lse, _, rng = torch.ops.flash_attn._flash_attn_forward(
            q, k, v, 0.0, scale, causal, window[0], window[1], 0.0, None, False
        )
        ctx.save_for_backward(q, k, v, out, lse, rng)
        ctx.args = (causal, window, scale)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse, rng = ctx.saved_tensors
        causal, window, scale = ctx.args
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        torch.ops.flash_attn._flash_attn_backward(
            dout.contiguous(), q, k, v, out, lse, dq, dk, dv, 0.0, scale, causal, window[0], window[1], 0.0, None, False, rng
        )
        return dq, dk, dv, None, None, None


def flash_attn_func(q, k, v, causal=False, window_size=(-1, -1), softmax_scale=None):
    """flash_attn.flash_attn_func's arguments that the workload uses."""
    scale = q.shape[-1] ** -0.5 if softmax_scale is None else softmax_scale
    return _Attention.apply(q, k, v, causal, tuple(window_size), scale)


def keep_mask(lq: int, lk: int, causal: bool, window: tuple[int, int], device="cpu") -> torch.Tensor:
    """The (query, key) pairs flash_attn's mask keeps, as a boolean [lq, lk] matrix (brute force)."""
    left, right = _window(causal, *window)
    dist = torch.arange(lk, device=device)[None, :] - (torch.arange(lq, device=device)[:, None] + lk - lq)
    keep = torch.ones(lq, lk, dtype=torch.bool, device=device)
    if right >= 0:
        keep &= dist <= right
    if left >= 0:
        keep &= dist >= -left
    return keep


def check(q, k, v, causal, window, fn=flash_attn_func):
    """Largest absolute differences of the output and the three gradients from SDPA on the same mask, in fp32."""
    dout = torch.randn_like(q)
    qkv = [t.detach().requires_grad_() for t in (q, k, v)]
    out = fn(*qkv, causal=causal, window_size=window)
    got = [out, *torch.autograd.grad(out, qkv, dout)]
    ref_in = [t.detach().float().transpose(1, 2).requires_grad_() for t in (q, k, v)]
    mask = keep_mask(q.shape[1], k.shape[1], causal, window, q.device)
    ref = torch.nn.functional.scaled_dot_product_attention(*ref_in, attn_mask=mask)
    want = [ref, *torch.autograd.grad(ref, ref_in, dout.float().transpose(1, 2))]
    return [float((g.float() - w.transpose(1, 2)).abs().max()) for g, w in zip(got, want, strict=True)]
