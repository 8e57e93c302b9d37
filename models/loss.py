"""The LM head and its cross-entropy in one pass: mean CE of (h @ W^T) against targets.

`linear_cross_entropy(h_Nd, W_Vd, y_N)` equals `F.cross_entropy(F.linear(h, W).float(), y)` (the model's unfused
loss) up to float rounding, but never holds the [N, V] logits, their log-softmax and their gradient at once: rows
are taken in chunks, and each chunk's gradients with respect to h and W are computed in the forward pass (softmax
minus one-hot) while its logits are still in cache; the backward only scales them by the incoming gradient.
Precision follows autocast as the unfused loss would. What it saves: docs/speed.md, "On a CPU".
"""
from __future__ import annotations

import torch

CHUNK_ELEMENTS = 2 ** 22  # logits per chunk on CPU: 16 MB of float32, so a chunk stays in a large cache
CUDA_CHUNK_ELEMENTS = 2 ** 27  # on CUDA: 512 MB of float32, few large matmuls (7 chunks of the 1b preset's 16,384 rows)


def _compute_dtype(h: torch.Tensor) -> torch.dtype:
    device = h.device.type
    return torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else h.dtype


class LinearCrossEntropy(torch.autograd.Function):
    """(mean CE + z * mean lse^2, mean CE, mean lse^2): the objective, differentiable, and its two parts, not
    differentiable (what is logged). With z = 0 the objective is the mean CE, computed as
    without the z-loss, bit for bit."""

    @staticmethod
    def forward(ctx, h_Nd: torch.Tensor, W_Vd: torch.Tensor, y_N: torch.Tensor, dtype: torch.dtype,
                chunk: int, z: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
        need_grad = ctx.needs_input_grad[0] or ctx.needs_input_grad[1]
        N = h_Nd.shape[0]
        hc, Wc = h_Nd.to(dtype), W_Vd.to(dtype)
        total = torch.zeros((), dtype=torch.float32, device=h_Nd.device)
        lse_sq = torch.zeros((), dtype=torch.float32, device=h_Nd.device)   # sum of lse^2 (z-loss only)
        gh = torch.empty_like(h_Nd) if need_grad else None
        gW = torch.zeros_like(W_Vd, dtype=torch.float32) if need_grad else None
        for s in range(0, N, chunk):
            h_cd, y_c = hc[s:s + chunk], y_N[s:s + chunk]
            logits_cV = (h_cd @ Wc.T).float()
            lse_c = torch.logsumexp(logits_cV, dim=1)
            total += (lse_c - logits_cV.gather(1, y_c[:, None]).squeeze(1)).sum()
            if z:
                lse_sq += lse_c.square().sum()
            if need_grad:
                # d(sum of CE)/d logits = softmax - one_hot(y), built in place of the logits;
                # the z-loss adds d(z lse^2)/d logits = 2 z lse softmax
                p_cV = logits_cV.sub_(lse_c[:, None]).exp_()
                if z:
                    p_cV.mul_((1 + 2 * z * lse_c)[:, None])
                p_cV[torch.arange(y_c.shape[0], device=y_c.device), y_c] -= 1
                p_cV = p_cV.to(dtype)
                gh[s:s + chunk] = p_cV @ Wc
                if dtype == torch.float32:
                    gW.addmm_(p_cV.T, h_cd)
                else:  # bf16 products, accumulated over chunks in float32
                    gW += (p_cV.T @ h_cd).float()
        if need_grad:
            ctx.save_for_backward(gh, gW.to(W_Vd.dtype))
        ctx.N = N
        ce, lse_sq = total / N, lse_sq / N
        ctx.mark_non_differentiable(ce, lse_sq)
        return (total / N + z * lse_sq if z else total / N), ce, lse_sq

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor, _grad_ce, _grad_lse_sq):
        gh, gW = ctx.saved_tensors
        scale = grad_out / ctx.N
        return gh * scale, gW * scale, None, None, None, None


def default_chunk_elements(device_type: str) -> int:
    """Logits per chunk on this kind of device (training.memory plans with the same)."""
    return CUDA_CHUNK_ELEMENTS if device_type == "cuda" else CHUNK_ELEMENTS


def linear_cross_entropy(h_Nd: torch.Tensor, W_Vd: torch.Tensor, y_N: torch.Tensor,
                         chunk_elements: int | None = None) -> torch.Tensor:
    """Mean cross-entropy (float32 scalar) of the logits h @ W^T against the target ids y."""
    return linear_cross_entropy_z(h_Nd, W_Vd, y_N, 0.0, chunk_elements)[0]


def linear_cross_entropy_z(h_Nd: torch.Tensor, W_Vd: torch.Tensor, y_N: torch.Tensor, z: float,
                           chunk_elements: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(objective, mean cross-entropy, z-loss term), float32 scalars, of the logits h @ W^T against the target ids
    y, with the z-loss of PaLM: objective = CE + z-loss term, z-loss term = z * mean over rows of
    logsumexp(logits)^2, taken from the chunks' logsumexp (the logits are never held whole, in the backward
    neither). Only the objective is differentiable; the other two are for the log."""
    if chunk_elements is None:
        chunk_elements = default_chunk_elements(h_Nd.device.type)
    chunk = max(1, chunk_elements // W_Vd.shape[0])
    dtype = _compute_dtype(h_Nd)  # read before autocast is switched off for the explicit casts inside
    with torch.autocast(h_Nd.device.type, enabled=False):
        objective, ce, lse_sq = LinearCrossEntropy.apply(h_Nd, W_Vd, y_N, dtype, chunk, float(z))
    return objective, ce, z * lse_sq
