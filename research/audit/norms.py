"""An RMS norm as it runs, measured from its own input and output: the gain in use, fitted per element by least
squares against the input divided by its RMS over the span the norm normalizes (the input's last dim: a head, or the
whole projection), and how far the output divided by that gain is from RMS 1 (docs/audit.md, "QK-norm").

    m = measure_norm(x_in, y_out, eps)    # {"gain": [span], "rms": float, "expected_rms": float, "fit_error": float}
"""
from __future__ import annotations

import torch


def measure_norm(x: torch.Tensor, y: torch.Tensor, eps: float) -> dict:
    """x, y [..., span]: the norm's input and output. gain g minimises sum (y - g x_hat)^2 over the tokens, x_hat =
    x / sqrt(mean(x^2) + eps); rms: the RMS of y / g, and expected_rms: that of x_hat (what an RMS norm with that eps
    gives, sqrt(ms / (ms + eps)) over the whole span), both over the elements whose gain is readable (|g| over 1e-3
    of the largest: a gain of 0 leaves nothing to divide); fit_error: max |y - g x_hat| / max |y|."""
    x, y = x.double().flatten(0, -2), y.double().flatten(0, -2)                   # [tokens, span]
    ms = x.square().mean(-1, keepdim=True)
    x_hat = x / (ms + eps).sqrt()
    g = (y * x_hat).sum(0) / x_hat.square().sum(0).clamp_min(1e-300)
    keep = g.abs() > 1e-3 * g.abs().amax().clamp_min(1e-300)
    rms = float((y[:, keep] / g[keep]).square().mean().sqrt())
    expected = float(x_hat[:, keep].square().mean().sqrt())
    fit = float((y - g * x_hat).abs().amax() / y.abs().amax().clamp_min(1e-300))
    return {"gain": g, "rms": rms, "expected_rms": expected, "fit_error": fit}
