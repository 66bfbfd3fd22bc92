"""Peers that need other frameworks, for ``python -m cukern bench`` in a repository checkout.

Imported only by the benchmark, and each framework only when it imports; nothing in ``cukern/`` depends on
this file. Each peer builds its own inputs in its own framework (same shape, dtype and distribution as
cukern's) and returns a zero-argument callable that launches on the legacy default stream, which the CUDA
events of ``cukern.timing`` also use.
"""

from __future__ import annotations


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def _triton():
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None
    return triton, tl


_triton_kernels: dict = {}


def _triton_rms_norm():
    """A one-row-per-program Triton RMSNorm, the structure of vLLM's and the seed lesson's kernel."""
    if "rms" in _triton_kernels:
        return _triton_kernels["rms"]
    triton, tl = _triton()

    @triton.jit
    def rms_norm_kernel(x_ptr, w_ptr, y_ptr, n_cols, eps, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        offs = tl.arange(0, BLOCK)
        mask = offs < n_cols
        x = tl.load(x_ptr + row * n_cols + offs, mask=mask, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / n_cols + eps)
        w = tl.load(w_ptr + offs, mask=mask).to(tl.float32)
        tl.store(y_ptr + row * n_cols + offs, (x * rstd * w).to(y_ptr.dtype.element_ty), mask=mask)

    _triton_kernels["rms"] = (triton, rms_norm_kernel)
    return _triton_kernels["rms"]


def peers(case):
    """(impl name, callable) pairs for a benchmark case; empty where no framework is there."""
    torch = _torch()
    if torch is None:
        return []
    dt = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[case.dtype]
    out = []
    if case.op in ("rms_norm", "fused_add_rms_norm"):
        hidden = case.shape[-1]
        x = torch.randn(case.shape, device="cuda", dtype=dt)
        w = torch.randn(hidden, device="cuda", dtype=dt)
        if case.op == "rms_norm":
            out.append(("torch", lambda: torch.nn.functional.rms_norm(x, (hidden,), w, 1e-6)))
            if _triton() is not None:
                triton, kernel = _triton_rms_norm()
                y = torch.empty_like(x)
                rows = x.numel() // hidden
                block = triton.next_power_of_2(hidden)
                warps = min(max(block // 256, 1), 16)
                out.append(("triton", lambda: kernel[(rows,)](x, w, y, hidden, 1e-6, BLOCK=block, num_warps=warps)))
        else:
            r = torch.randn(case.shape, device="cuda", dtype=dt)

            def fused():
                r.add_(x)
                return torch.nn.functional.rms_norm(r, (hidden,), w, 1e-6)

            out.append(("torch", fused))
    elif case.op.startswith("rotary_embedding"):
        out += _torch_rope(torch, case, dt)
    elif case.op.startswith("sum"):
        x = torch.randn(case.shape, device="cuda", dtype=dt)
        axis = dict(case.params).get("axis")
        out.append(("torch", (lambda: torch.sum(x)) if axis is None else (lambda: torch.sum(x, dim=axis))))
    return out


def _torch_rope(torch, case, dt):
    """Rotary embedding as PyTorch users write it (vLLM's native path): eager, and through torch.compile."""
    params = dict(case.params)
    tokens, nh, hd = case.shape
    nkv = params["kv_heads"]
    neox = params.get("neox", True)
    q = torch.randn(tokens, nh, hd, device="cuda", dtype=dt)
    k = torch.randn(tokens, nkv, hd, device="cuda", dtype=dt)
    pos = torch.randint(0, 8192, (tokens,), device="cuda")
    inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, device="cuda", dtype=torch.float32) / hd))
    freqs = torch.outer(torch.arange(8192, device="cuda", dtype=torch.float32), inv)
    cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1)

    def rope(pos, q, k):
        cos, sin = cache[pos].chunk(2, dim=-1)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        outs = []
        for t in (q, k):
            x = t.float()
            if neox:
                x1, x2 = x.chunk(2, dim=-1)
                y = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
            else:
                x1, x2 = x[..., 0::2], x[..., 1::2]
                y = torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
            t.copy_(y.to(t.dtype))
            outs.append(t)
        return outs

    peers = [("torch", lambda: rope(pos, q, k))]
    try:
        compiled = torch.compile(rope)
        compiled(pos, q, k)
        peers.append(("torch.compile", lambda: compiled(pos, q, k)))
    except Exception as err:  # torch.compile needs a working Triton/inductor toolchain
        print(f"  torch.compile unavailable: {type(err).__name__}: {err}")
    return peers
