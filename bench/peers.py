"""Peers that need other frameworks, for ``python -m cukern.lab bench`` in a repository checkout.

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


def host_calls():
    """The peers' host-cost records beside cukern's: ``(op, impl, shape, make, dtype)``, ``make()`` giving
    ``(fn, args, kwargs)`` on fresh inputs (``cukern.lab.pipeline.HostCall``): torch's ``F.rms_norm`` on a
    decode step's [1, 4096] bfloat16 (``host_overhead``), its rotation and QK-norm + rotation of one token as
    PyTorch users write them (eager and compiled), and ``torch.sum``, ``torch.argmax`` and ``torch.cumsum``
    of 4096 floats."""
    torch = _torch()
    if torch is None:
        return []
    hidden = 4096

    def rms_norm():
        x = torch.randn((1, hidden), device="cuda", dtype=torch.bfloat16)
        w = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
        return torch.nn.functional.rms_norm, (x, (hidden,), w, 1e-6), {}

    def small(fn):
        def make():
            return fn, (torch.randn(hidden, device="cuda", dtype=torch.float32),), {}
        return make

    calls = [("host_overhead", "torch", (1, hidden), rms_norm, "bfloat16"),
             ("host_overhead_sum", "torch", (hidden,), small(torch.sum), "float32"),
             ("host_overhead_argmax", "torch", (hidden,), small(torch.argmax), "float32"),
             ("host_overhead_cumsum", "torch", (hidden,), small(lambda x: torch.cumsum(x, 0)), "float32")]
    for op, builder in (("host_overhead_rotary", _torch_rope), ("host_overhead_qk_norm_rope", _torch_qk_norm_rope)):
        token = _DecodeCase(op.removeprefix("host_overhead_").replace("rotary", "rotary_embedding"))
        for impl, fn in _quiet(builder, torch, token, torch.bfloat16):
            calls.append((op, impl, token.shape, lambda fn=fn: (fn, (), {}), "bfloat16"))
    return calls


class _DecodeCase:
    """A benchmark case's fields for one decode token: 32 query and 8 key heads of 128 (NeoX)."""

    def __init__(self, op):
        self.op, self.shape, self.dtype, self.params = op, (1, 32, 128), "bfloat16", (("kv_heads", 8),)


def _quiet(builder, torch, case, dt):
    """``builder``'s peers, or none where torch.compile cannot build them here."""
    try:
        return builder(torch, case, dt)
    except Exception as err:  # a framework that cannot build the peer is reported, not fatal
        print(f"  host-cost peers of {case.op} unavailable: {type(err).__name__}: {err}")
        return []


def peers(case):
    """(impl name, callable) pairs for a benchmark case; empty where no framework is there."""
    torch = _torch()
    if torch is None:
        return []
    dt = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32,
          "float64": torch.float64}[case.dtype]
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
    elif case.op in ("layer_norm", "fused_add_layer_norm", "layer_norm_backward"):
        out += _quiet(_torch_layer_norm, torch, case, dt)
    elif case.op in ("rms_norm_fp8", "fused_add_rms_norm_fp8"):
        out += _torch_rms_norm_fp8(torch, case, dt)
    elif case.op == "rms_norm_backward":
        out += _torch_rms_norm_backward(torch, case, dt)
    elif case.op.startswith("rotary_embedding"):
        out += _torch_rope(torch, case, dt)
    elif case.op == "qk_norm_rope":
        out += _torch_qk_norm_rope(torch, case, dt)
    elif case.op.startswith("sum"):
        x = torch.randn(case.shape, device="cuda", dtype=dt)
        axis = dict(case.params).get("axis")
        out.append(("torch", (lambda: torch.sum(x)) if axis is None else (lambda: torch.sum(x, dim=axis))))
    elif case.op in ("var", "var_rows", "logsumexp_rows", "nansum"):
        x = torch.randn(case.shape, device="cuda", dtype=dt)
        axis = dict(case.params).get("axis")
        if case.op == "nansum":
            out.append(("torch", lambda: torch.nansum(x)))
        elif case.op == "logsumexp_rows":
            out.append(("torch", lambda: torch.logsumexp(x, dim=axis)))
        else:  # NumPy's var: ddof 0
            out.append(("torch", (lambda: torch.var(x, correction=0)) if axis is None
                        else (lambda: torch.var(x, dim=axis, correction=0))))
    elif case.op == "argmax":
        x = torch.randn(case.shape, device="cuda", dtype=dt)
        out.append(("torch", lambda: torch.argmax(x)))
    elif case.op == "cumsum":
        x = torch.rand(case.shape, device="cuda", dtype=dt) + 0.5
        out.append(("torch", lambda: torch.cumsum(x, dim=0)))
    elif case.op == "segment_sum":
        x = torch.randn(case.shape, device="cuda", dtype=dt)
        rows, segments = case.shape[0], dict(case.params)["segments"]
        cuts = torch.sort(torch.randint(0, rows + 1, (segments - 1,), device="cuda")).values
        offsets = torch.cat([cuts.new_zeros(1), cuts, cuts.new_full((1,), rows)])
        out.append(("torch", lambda: torch.segment_reduce(x, "sum", offsets=offsets, axis=0, unsafe=True)))
    return out


def _liger_layer_norm():
    try:
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction
    except ImportError:
        return None
    return LigerLayerNormFunction


def _torch_layer_norm(torch, case, dt):
    """LayerNorm as PyTorch users run it: eager (``F.layer_norm``; the backward aten's own kernel, given the
    forward's statistics), ``torch.compile`` of the same forward and of the backward's formula, and
    Liger-Kernel's Triton forward and backward (through autograd) where it is installed."""
    hidden, eps = case.shape[-1], 1e-5
    x = torch.randn(case.shape, device="cuda", dtype=dt)
    w = torch.randn(hidden, device="cuda", dtype=dt)
    b = torch.randn(hidden, device="cuda", dtype=dt)
    F = torch.nn.functional
    out = []
    if case.op == "layer_norm":
        out.append(("torch", lambda: F.layer_norm(x, (hidden,), w, b, eps)))
        compiled = torch.compile(lambda x, w, b: F.layer_norm(x, (hidden,), w, b, eps))
        out.append(("torch.compile", lambda: compiled(x, w, b)))
        liger = _liger_layer_norm()
        if liger is not None:
            out.append(("liger", lambda: liger.apply(x, w, b, eps)))
    elif case.op == "fused_add_layer_norm":
        r = torch.randn(case.shape, device="cuda", dtype=dt)

        def fused():
            r.add_(x)
            return F.layer_norm(r, (hidden,), w, b, eps)

        out.append(("torch", fused))
    else:
        dy = torch.randn(case.shape, device="cuda", dtype=dt)
        _, mean, rstd = torch.ops.aten.native_layer_norm(x, (hidden,), w, b, eps)
        out.append(("torch", lambda: torch.ops.aten.native_layer_norm_backward(
            dy, x, (hidden,), mean, rstd, w, b, [True, True, True])))

        def formula(dy, x, w, mean, rstd):
            xf, g = x.float(), dy.float() * w.float()
            xhat = (xf - mean) * rstd
            dx = rstd * (g - g.mean(-1, keepdim=True) - xhat * (g * xhat).mean(-1, keepdim=True))
            return dx.to(dt), (dy.float() * xhat).sum(0).to(dt), dy.float().sum(0).to(dt)

        compiled = torch.compile(formula)
        out.append(("torch.compile", lambda: compiled(dy, x, w, mean, rstd)))
        liger = _liger_layer_norm()
        if liger is not None:
            xg, wg, bg = (t.clone().requires_grad_() for t in (x, w, b))
            y = liger.apply(xg, wg, bg, eps)
            out.append(("liger", lambda: torch.autograd.grad(y, (xg, wg, bg), dy, retain_graph=True)))
    return out


def _torch_rms_norm_fp8(torch, case, dt):
    """RMSNorm with float8 e4m3fn outputs and per-token scales as PyTorch users write it (the composition
    vLLM's native path uses): float32 RMSNorm, row amax / 448 (at least 2^-126), divide, clamp, cast; eager,
    and through torch.compile."""
    hidden = case.shape[-1]
    fused = case.op == "fused_add_rms_norm_fp8"
    x = torch.randn(case.shape, device="cuda", dtype=dt)
    w = torch.randn(hidden, device="cuda", dtype=dt)
    r = torch.randn(case.shape, device="cuda", dtype=dt) if fused else None

    def quant(x, r, w):
        if r is not None:
            r.add_(x)
            x = r
        y = torch.nn.functional.rms_norm(x.float(), (hidden,), w.float(), 1e-6)
        s = (y.abs().amax(dim=-1, keepdim=True) / 448.0).clamp(min=2.0**-126)
        return (y / s).clamp(-448.0, 448.0).to(torch.float8_e4m3fn), s

    peers = [("torch", lambda: quant(x, r, w))]
    try:
        compiled = torch.compile(quant)
        compiled(x, r, w)
        peers.append(("torch.compile", lambda: compiled(x, r, w)))
    except Exception as err:  # torch.compile needs a working Triton/inductor toolchain
        print(f"  torch.compile unavailable: {type(err).__name__}: {err}")
    return peers


def _torch_rms_norm_backward(torch, case, dt):
    """The backward alone of ``F.rms_norm`` (dx and dweight from one forward kept for it) in eager PyTorch, the
    same formula compiled by ``torch.compile``, and Liger-Kernel's backward where it imports."""
    hidden = case.shape[-1]
    x = torch.randn(case.shape, device="cuda", dtype=dt, requires_grad=True)
    w = torch.randn(hidden, device="cuda", dtype=dt, requires_grad=True)
    dy = torch.randn(case.shape, device="cuda", dtype=dt)
    y = torch.nn.functional.rms_norm(x, (hidden,), w, 1e-6)
    out = [("torch", lambda: torch.autograd.grad(y, (x, w), dy, retain_graph=True))]

    def formula(dy, x, w):
        xf = x.float()
        r = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)
        xhat, g = xf * r, dy.float() * w.float()
        dx = r * (g - xhat * (g * xhat).mean(-1, keepdim=True))
        return dx.to(x.dtype), (dy.float() * xhat).reshape(-1, hidden).sum(0).to(w.dtype)

    compiled = torch.compile(formula)
    xd, wd = x.detach(), w.detach()
    out.append(("torch.compile", lambda: compiled(dy, xd, wd)))
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
    except ImportError:
        return out
    ly = LigerRMSNormFunction.apply(x, w, 1e-6, 0.0, "llama", False)
    out.append(("liger", lambda: torch.autograd.grad(ly, (x, w), dy, retain_graph=True)))
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


def _torch_qk_norm_rope(torch, case, dt):
    """Qwen3's QK-norm then NeoX rotation as PyTorch users write it: ``F.rms_norm`` over each head (rounded to
    the dtype, as the model's RMSNorm returns it), the rotation in float32, written back in place; eager, and
    through torch.compile."""
    tokens, nh, hd = case.shape
    nkv = dict(case.params)["kv_heads"]
    q = torch.randn(tokens, nh, hd, device="cuda", dtype=dt)
    k = torch.randn(tokens, nkv, hd, device="cuda", dtype=dt)
    qw, kw = (1 + 0.1 * torch.randn(hd, device="cuda")).to(dt), (1 + 0.1 * torch.randn(hd, device="cuda")).to(dt)
    pos = torch.randint(0, 8192, (tokens,), device="cuda")
    inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, device="cuda", dtype=torch.float32) / hd))
    freqs = torch.outer(torch.arange(8192, device="cuda", dtype=torch.float32), inv)
    cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1)

    def qk_norm_rope(pos, q, k):
        cos, sin = cache[pos].chunk(2, dim=-1)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        for t, w in ((q, qw), (k, kw)):
            x = torch.nn.functional.rms_norm(t, (hd,), w, 1e-6).float()
            x1, x2 = x.chunk(2, dim=-1)
            t.copy_(torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(t.dtype))
        return q, k

    peers = [("torch", lambda: qk_norm_rope(pos, q, k))]
    try:
        compiled = torch.compile(qk_norm_rope)
        compiled(pos, q, k)
        peers.append(("torch.compile", lambda: compiled(pos, q, k)))
    except Exception as err:  # torch.compile needs a working Triton/inductor toolchain
        print(f"  torch.compile unavailable: {type(err).__name__}: {err}")
    return peers
