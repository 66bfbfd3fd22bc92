"""PyTorch autograd for cukern's norms and rotary embeddings: ``torch.autograd.Function`` wrappers whose forward
and backward are cukern's kernels, the same bits in training as in inference and gradients that do not change
with the batch or the GPU (:func:`cukern.rms_norm_backward`).

Tensors go to the kernels through DLPack and come back the same way, with no copy; the kernels run on
PyTorch's current stream of the tensors' device. This module is the only one of cukern that imports torch
(``pip install cukern[torch]``); ``import cukern`` never does.

The LayerNorm wrappers call ``cukern.layer_norm``, ``cukern.fused_add_layer_norm`` and
``cukern.layer_norm_backward``, looked up when called. torch itself is imported by the first call, not by
``import cukern.torch``, and the ``Function`` classes are made then (:func:`_functions`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from types import SimpleNamespace
from typing import Any, TypeAlias

import cukern
from cukern._launch import cupy as _cupy

Tensor: TypeAlias = Any  # a torch.Tensor: torch is not imported for the annotations either


def _torch() -> Any:
    """The torch module, imported by the first call that needs it."""
    return importlib.import_module("torch")


@contextlib.contextmanager
def _torch_stream(t: Tensor):
    """CuPy's current device and stream set to ``t``'s device and PyTorch's current stream there, so cukern's
    launches are ordered with PyTorch's work (DLPack's hand-over is then the same stream: no wait)."""
    cp, torch = _cupy(), _torch()
    device = t.device.index if t.device.index is not None else torch.cuda.current_device()
    stream = torch.cuda.current_stream(device)
    with cp.cuda.Device(device), cp.cuda.ExternalStream(stream.cuda_stream, device):
        yield


def _d(*ts):
    """Tensors as the kernels take them: detached (DLPack refuses a tensor that requires grad; a detached alias
    shares the memory, so an in-place op still writes the caller's tensor), None kept."""
    return tuple(None if t is None else t.detach() for t in ts)


def _tensor(a):
    """A CuPy result as a tensor sharing its memory (None stays None)."""
    return None if a is None else _torch().from_dlpack(a)


def _grad(g: Tensor | None, like: Tensor) -> Tensor:
    """An output's gradient as the kernels take it: zeros where autograd passes none, and a unit last stride
    (autograd may hand an expanded view; contiguous() copies only then)."""
    if g is None:
        return _torch().zeros_like(like)
    return g if g.stride(-1) == 1 or g.shape[-1] <= 1 else g.contiguous()


@functools.cache
def _functions() -> SimpleNamespace:
    """The ``torch.autograd.Function`` classes of the wrappers, made once, at the first call (defining
    them needs torch): ``RMSNorm``, ``FusedAddRMSNorm``, ``LayerNorm``, ``FusedAddLayerNorm``,
    ``RotaryEmbedding``, ``QkNormRope``."""
    torch = _torch()
    Function: Any = torch.autograd.Function

    class RMSNorm(Function):
        """:func:`cukern.rms_norm` with :func:`cukern.rms_norm_backward`; rstd kept from the forward."""

        @staticmethod
        def forward(ctx, x, weight, eps, offset):
            with _torch_stream(x):
                y, rstd = cukern.rms_norm(*_d(x, weight), eps, offset=offset, return_rstd=True)
                y, rstd = _tensor(y), _tensor(rstd)
            ctx.save_for_backward(x, weight, rstd)
            ctx.eps, ctx.offset = eps, offset
            return y

        @staticmethod
        def backward(ctx, dy):
            x, weight, rstd = ctx.saved_tensors
            with _torch_stream(x):
                dx, dw = cukern.rms_norm_backward(*_d(_grad(dy, x), x, weight), eps=ctx.eps, offset=ctx.offset,
                                                  rstd=rstd)
                return _tensor(dx), _tensor(dw), None, None


    class FusedAddRMSNorm(Function):
        """:func:`cukern.fused_add_rms_norm`, residual updated in place (marked dirty and returned); the backward
        adds the residual output's gradient into dx, the gradient of both x and the residual input."""

        @staticmethod
        def forward(ctx, x, residual, weight, eps, offset):
            with _torch_stream(x):
                y, rstd = cukern.fused_add_rms_norm(*_d(x, residual, weight), eps, offset=offset, return_rstd=True)
                y, rstd = _tensor(y), _tensor(rstd)
            ctx.mark_dirty(residual)
            ctx.save_for_backward(residual, weight, rstd)
            ctx.eps, ctx.offset = eps, offset
            return y, residual

        @staticmethod
        def backward(ctx, dy, dresidual):
            residual, weight, rstd = ctx.saved_tensors
            with _torch_stream(residual):
                dres = None if dresidual is None else _grad(dresidual, residual)
                dx, dw = cukern.rms_norm_backward(*_d(_grad(dy, residual), residual, weight), eps=ctx.eps,
                                                  offset=ctx.offset, rstd=rstd, dresidual=_d(dres)[0])
                dx = _tensor(dx)
                return dx, dx, _tensor(dw), None, None


    class LayerNorm(Function):
        """``cukern.layer_norm`` with ``cukern.layer_norm_backward``; mean and rstd kept from the forward."""

        @staticmethod
        def forward(ctx, x, weight, bias, eps):
            with _torch_stream(x):
                stats = cukern.layer_norm(*_d(x, weight, bias), eps=eps, return_stats=True)
                y, mean, rstd = (_tensor(a) for a in stats)
            ctx.save_for_backward(x, weight, mean, rstd)
            ctx.eps, ctx.has_bias = eps, bias is not None
            return y

        @staticmethod
        def backward(ctx, dy):
            x, weight, mean, rstd = ctx.saved_tensors
            with _torch_stream(x):
                dx, dw, db = cukern.layer_norm_backward(*_d(_grad(dy, x), x, weight), eps=ctx.eps, mean=mean, rstd=rstd)
                return _tensor(dx), _tensor(dw), _tensor(db) if ctx.has_bias else None, None


    class FusedAddLayerNorm(Function):
        """``cukern.fused_add_layer_norm``, residual updated in place (marked dirty and returned); the backward
        recomputes the statistics of the updated residual (the fused forward returns none)."""

        @staticmethod
        def forward(ctx, x, residual, weight, bias, eps):
            with _torch_stream(x):
                y = _tensor(cukern.fused_add_layer_norm(*_d(x, residual, weight, bias), eps=eps))
            ctx.mark_dirty(residual)
            ctx.save_for_backward(residual, weight)
            ctx.eps, ctx.has_bias = eps, bias is not None
            return y, residual

        @staticmethod
        def backward(ctx, dy, dresidual):
            residual, weight = ctx.saved_tensors
            with _torch_stream(residual):
                dres = None if dresidual is None else _grad(dresidual, residual)
                dx, dw, db = cukern.layer_norm_backward(*_d(_grad(dy, residual), residual, weight), eps=ctx.eps,
                                                        dresidual=_d(dres)[0])
                dx = _tensor(dx)
                return dx, dx, _tensor(dw), _tensor(db) if ctx.has_bias else None, None


    class RotaryEmbedding(Function):
        """:func:`cukern.rotary_embedding` in place on query and key (marked dirty and returned); the backward is
        the same kernel with ``inverse=True`` on copies of the gradients (the rotation's transpose). No gradient
        for positions or the cache."""

        @staticmethod
        def forward(ctx, positions, query, key, cos_sin_cache, is_neox, rotary_dim):
            with _torch_stream(query):
                cukern.rotary_embedding(*_d(positions, query, key, cos_sin_cache), is_neox=is_neox,
                                        rotary_dim=rotary_dim)
            ctx.mark_dirty(*(t for t in (query, key) if t is not None))
            ctx.save_for_backward(positions, cos_sin_cache)
            ctx.is_neox, ctx.rotary_dim = is_neox, rotary_dim
            ctx.like = [None if t is None else (t.shape, t.dtype, t.device) for t in (query, key)]
            return query, key

        @staticmethod
        def backward(ctx, dq, dk):
            positions, cache = ctx.saved_tensors
            gq, gk = (None if like is None else torch.zeros(like[0], dtype=like[1], device=like[2]) if g is None
                      else g.clone(memory_format=torch.contiguous_format) for g, like in zip((dq, dk), ctx.like))
            with _torch_stream(gq):
                cukern.rotary_embedding(*_d(positions, gq, gk, cache), is_neox=ctx.is_neox, rotary_dim=ctx.rotary_dim,
                                        inverse=True, check_positions=False)
            return None, gq, gk, None, None, None


    class QkNormRope(Function):
        """:func:`cukern.qk_norm_rope` on copies of query and key (the backward needs them as they were), with
        :func:`cukern.qk_norm_rope_backward`."""

        @staticmethod
        def forward(ctx, positions, query, key, q_weight, k_weight, cos_sin_cache, eps, offset, is_neox, rotary_dim):
            q, k = (None if t is None else t.detach().clone(memory_format=torch.contiguous_format)
                    for t in (query, key))
            with _torch_stream(query):
                cukern.qk_norm_rope(*_d(positions), q, k, *_d(q_weight, k_weight, cos_sin_cache), eps=eps,
                                    offset=offset, is_neox=is_neox, rotary_dim=rotary_dim)
            ctx.save_for_backward(positions, query, key, q_weight, k_weight, cos_sin_cache)
            ctx.args = (eps, offset, is_neox, rotary_dim)
            return q, k

        @staticmethod
        def backward(ctx, dq, dk):
            positions, query, key, q_weight, k_weight, cache = ctx.saved_tensors
            eps, offset, is_neox, rotary_dim = ctx.args
            with _torch_stream(query):
                dk = None if key is None else _grad(dk, key)
                inputs = _d(positions, _grad(dq, query), dk, query, key, q_weight, k_weight, cache)
                grads = cukern.qk_norm_rope_backward(*inputs, eps=eps, offset=offset, is_neox=is_neox,
                                                     rotary_dim=rotary_dim)
                dquery, dkey, dqw, dkw = (_tensor(g) for g in grads)
            return None, dquery, dkey, dqw, dkw, None, None, None, None, None

    return SimpleNamespace(RMSNorm=RMSNorm, FusedAddRMSNorm=FusedAddRMSNorm, LayerNorm=LayerNorm,
                           FusedAddLayerNorm=FusedAddLayerNorm, RotaryEmbedding=RotaryEmbedding, QkNormRope=QkNormRope)


def rms_norm(x: Tensor, weight: Tensor | None = None, eps: float = 1e-6, *,
             offset: float = 0.0) -> Tensor:
    """``x / sqrt(mean(x**2, -1) + eps) * (offset + weight)`` with cukern's forward and backward.

    Parameters
    ----------
    x : torch.Tensor on a CUDA device, float32, float16 or bfloat16, last stride 1.
    weight : torch.Tensor ``[hidden]`` of x's dtype or float32, optional.
    eps, offset : float
        As :func:`cukern.rms_norm`'s (``offset=1.0``: Gemma).

    Returns
    -------
    torch.Tensor like x; its gradients come from :func:`cukern.rms_norm_backward`.

    Examples
    --------
    >>> import torch, cukern.torch as ct
    >>> x = torch.randn(4, 64, device="cuda", requires_grad=True)
    >>> ct.rms_norm(x).sum().backward()
    >>> x.grad.shape
    torch.Size([4, 64])
    """
    return _functions().RMSNorm.apply(x, weight, eps, offset)


def fused_add_rms_norm(x: Tensor, residual: Tensor, weight: Tensor | None = None,
                       eps: float = 1e-6, *, offset: float = 0.0) -> tuple:
    """``residual += x`` in place, then ``rms_norm(residual)``: returns ``(out, residual)``, residual the same
    tensor, updated (PyTorch's in-place rules apply to it), with cukern's backward.

    Examples
    --------
    >>> import torch, cukern.torch as ct
    >>> x, r = (torch.randn(4, 64, device="cuda") for _ in range(2))
    >>> out, r2 = ct.fused_add_rms_norm(x, r)
    >>> r2 is r
    True
    """
    return _functions().FusedAddRMSNorm.apply(x, residual, weight, eps, offset)


def layer_norm(x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None, *,
               eps: float = 1e-5) -> Tensor:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over the last axis with ``cukern.layer_norm`` and
    ``cukern.layer_norm_backward``.

    Examples
    --------
    >>> import torch, cukern.torch as ct
    >>> x = torch.randn(4, 64, device="cuda", requires_grad=True)
    >>> ct.layer_norm(x).sum().backward()
    """
    return _functions().LayerNorm.apply(x, weight, bias, eps)


def fused_add_layer_norm(x: Tensor, residual: Tensor, weight: Tensor | None = None,
                         bias: Tensor | None = None, *, eps: float = 1e-5) -> tuple:
    """``residual += x`` in place, then ``layer_norm(residual)``: returns ``(out, residual)``.

    Examples
    --------
    >>> import torch, cukern.torch as ct
    >>> x, r = (torch.randn(4, 64, device="cuda") for _ in range(2))
    >>> out, r2 = ct.fused_add_layer_norm(x, r)
    """
    return _functions().FusedAddLayerNorm.apply(x, residual, weight, bias, eps)


def rotary_embedding(positions: Tensor, query: Tensor, key: Tensor | None,
                     cos_sin_cache: Tensor, *, is_neox: bool = True, rotary_dim: int | None = None) -> tuple:
    """:func:`cukern.rotary_embedding` in place on query and key, returned as ``(query, key)``; the gradient is
    the rotation by -theta (``inverse=True``), the forward's transpose.

    Examples
    --------
    >>> import torch, cukern, cukern.torch as ct
    >>> cache = torch.from_dlpack(cukern.rope_cache(16, 64))
    >>> q = torch.randn(4, 2, 64, device="cuda")
    >>> q2, _ = ct.rotary_embedding(torch.arange(4, device="cuda"), q, None, cache)
    """
    return _functions().RotaryEmbedding.apply(positions, query, key, cos_sin_cache, is_neox, rotary_dim)


def qk_norm_rope(positions: Tensor, query: Tensor, key: Tensor | None,
                 q_weight: Tensor | None, k_weight: Tensor | None, cos_sin_cache: Tensor, *,
                 eps: float = 1e-6, offset: float = 0.0, is_neox: bool = True, rotary_dim: int | None = None) -> tuple:
    """Per-head RMSNorm then RoPE (:func:`cukern.qk_norm_rope`) into new tensors ``(q, k)`` (query and key are
    kept for the backward, :func:`cukern.qk_norm_rope_backward`).

    Examples
    --------
    >>> import torch, cukern, cukern.torch as ct
    >>> cache = torch.from_dlpack(cukern.rope_cache(16, 64))
    >>> q = torch.randn(4, 2, 64, device="cuda", requires_grad=True)
    >>> qn, _ = ct.qk_norm_rope(torch.arange(4, device="cuda"), q, None, None, None, cache)
    """
    return _functions().QkNormRope.apply(positions, query, key, q_weight, k_weight, cos_sin_cache, eps, offset,
                                        is_neox, rotary_dim)
