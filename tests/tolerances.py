"""Numeric tolerances derived from the precision a test computes in, so one suite holds on every host.

A host with native bf16 (AVX512-BF16 or AMX) and one without run the same fp32 arithmetic through different
kernels (oneDNN picks AVX512 or AVX2 code paths), and bf16 is native on one and emulated on the other. A
tolerance measured on one CPU is therefore no tolerance: each one here is a multiple of the precision's
machine epsilon, and each use says which precision each side ran in and why the multiple is what it is.

EPS[p] is torch.finfo(p).eps, the gap between 1.0 and the next number p can hold; round-to-nearest makes a
relative error of at most EPS / 2 per operation (the unit roundoff):
    fp64 2.2e-16, fp32 1.19e-7, bf16 7.8e-3 (8 significant bits).
"""
from __future__ import annotations

import math

EPS = {"fp64": 2.0 ** -52, "fp32": 2.0 ** -23, "bf16": 2.0 ** -7}


def unit_roundoff(precision: str) -> float:
    """Largest relative error of one rounding to nearest in `precision`: EPS / 2."""
    return EPS[precision] / 2


def sum_rel_tol(precision: str, n: int, margin: float = 4.0) -> float:
    """Relative tolerance for a sum or dot product of n terms of one sign computed in `precision` against an
    exact (or float64) reference. Each of the log2(n) levels of a pairwise or blocked reduction (what BLAS
    and torch's reductions do) adds at most one rounding, so the error is at most log2(n) * u relative to
    the sum of |terms| (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., section 4.2);
    `margin` covers the final rounding of the result and the conversions in and out."""
    return margin * max(1.0, math.log2(max(n, 2))) * unit_roundoff(precision)


def ulps(precision: str, k: float) -> float:
    """k machine epsilons of `precision`: a relative tolerance stated in units of the format's spacing."""
    return k * EPS[precision]



def ortho_rounding(precision: str, n: int, steps: int = 5) -> float:
    """Rounding error of `steps` Muon quintic steps (Polar Express, Newton-Schulz) computed in `precision`,
    relative to the output's spectral norm (~1): each step is 3 matmuls (X X^T, A A, B X) of at most n terms,
    accumulated in fp32 (bf16 matmuls too) and rounded once to `precision`. A first-order count (the polynomials'
    slopes aside): measured errors are 3x (bf16) to 100x (fp32) below it."""
    return 3 * steps * (unit_roundoff(precision) + sum_rel_tol("fp32", n))


def forward_rel_tol(n_layers: int, d_model: int, precision: str = "fp32") -> float:
    """Two forwards of one model in `precision` that sum in other orders (another kernel, SDPA against eager, the
    project's model against its Hugging Face export): each of the n_layers blocks and the LM head sums d_model
    terms, each adding at most sum_rel_tol(precision, d_model), relative to the output's scale."""
    return (n_layers + 1) * sum_rel_tol(precision, d_model)


def logit_atol(ref, n_layers: int, d_model: int, precision: str = "fp32") -> float:
    """forward_rel_tol of the logits' scale, max |ref|: absolute, since a logit near 0 errs as much as a large
    one (an elementwise relative bound would be wrong there)."""
    return forward_rel_tol(n_layers, d_model, precision) * float(ref.abs().max())


def pr_rel_tol(delta, d: int, pr):
    """Relative change of a participation ratio PR = (sum s^2)^2 / sum s^4 of d-dimensional keys when every
    component moves by at most `delta` relative: by Weyl's inequality each singular value moves by at most
    delta |K|_F, which moves PR by at most 2 delta (d / sqrt(PR) + sqrt(PR)). pr: a float or a tensor of them."""
    return 2 * delta * (d / pr ** 0.5 + pr ** 0.5)

# Two runs of the same training that differ only in the order of floating-point sums (DDP or FSDP against
# one process, compiled against eager kernels) start from equal weights, so their first losses differ by the
# rounding of the loss sum alone; each step then moves the weights by an update computed from slightly
# different gradients. In fp32 every part of the step is fp32 and the curves stay within a few ulps of the
# loss: FSDP against one process differed by at most 4.8e-7 at losses near 6.3 (0.64 EPS), both on a CPU
# with native bf16 (2-core AMD EPYC, AVX512-BF16) and, when this test was written, on one without; 8 EPS
# leaves room for other kernels. In bf16 the matmuls and Muon's orthogonalization round to 8 bits, so two
# orders of summation can land on neighbouring bf16 values and the losses may differ by up to one bf16
# spacing of the loss itself (EPS_bf16 relative). That is below what one early step moves the loss (0.14
# nats from step 1 to step 2 of the debug preset, 3 such spacings), so a wrong update still shows by step 2;
# measured on the same CPU: at most 3.3e-4 at losses near 6 (5.5e-5 relative, 1/140 of the tolerance).
CURVE_REL_TOL = {"fp32": ulps("fp32", 8), "bf16": ulps("bf16", 1)}
