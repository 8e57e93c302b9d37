"""Muon: momentum SGD whose update for each weight matrix is replaced by its orthogonal polar factor.

Two orthogonalizers (ORTHOGONALIZERS), both pure functions of a matrix or a batch of matrices [..., m, n] that
approximate polar(G) = U V^T for G = U S V^T: `polar_express` (Amsel, Persson, Musco & Gower 2025,
arXiv:2505.16932) and `newton_schulz` (the classic Muon quintic). Neither converges exactly in 5 steps: the
singular values of the output are only near 1 (tests/optimizers/test_muon.py asserts the measured errors).
The recipe, the orthogonalizers and the update scales: docs/training.md, "The write-ups' recipe, and where the
defaults differ".
"""
from __future__ import annotations

import functools
import math
from collections import defaultdict
from typing import Callable, Iterable

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, Shard

# Polar Express degree-5 coefficients (a, b, c) for p(x) = a x + b x^3 + c x^5, from Algorithm 1 of
# the paper (optimal for an initial spectrum in [1e-3, 1]). From the 8th iteration on the optimal
# polynomial is numerically the fixed (1.875, -1.25, 0.375), the degree-5 Newton-Schulz/Pade map.
_PE_RAW = (
    (8.28721201814563, -23.595886519098837, 17.300387312530933),
    (4.107059111542203, -2.9478499167379106, 0.5448431082926601),
    (3.9486908534822946, -2.908902115962949, 0.5518191394370137),
    (3.3184196573706015, -2.488488024314874, 0.51004894012372),
    (2.300652019954817, -1.6689039845747493, 0.4188073119525673),
    (1.891301407787398, -1.2679958271945868, 0.37680408948524835),
    (1.8750014808534479, -1.2500016453999487, 0.3750001645474248),
)
_PE_LAST = (1.875, -1.25, 0.375)
# The paper's safety factor: each polynomial p(x) is replaced by p(x / 1.01), so singular values
# pushed slightly above 1 by round-off are not blown up by the next (steep) polynomial.
_PE_SAFETY = 1.01
POLAR_EXPRESS_COEFFS = tuple((a / _PE_SAFETY, b / _PE_SAFETY ** 3, c / _PE_SAFETY ** 5)
                             for a, b, c in _PE_RAW) + (_PE_LAST,)

NEWTON_SCHULZ_COEFFS = (3.4445, -4.7750, 2.0315)


def _iterate_quintic(G: torch.Tensor, coeffs: Iterable[tuple[float, float, float]], safety: float,
                     dtype: torch.dtype) -> torch.Tensor:
    """X <- a X + b (X X^T) X + c (X X^T)^2 X for each (a, b, c), on X = G / (safety * ||G||_F).

    Works on the wide orientation (rows <= cols) so that X X^T is the smaller Gram matrix.
    Returns a tensor of G's dtype and shape.
    """
    if G.ndim < 2:
        raise ValueError(f"expected a matrix or a batch of matrices [..., m, n], got shape {tuple(G.shape)}")
    tall = G.size(-2) > G.size(-1)
    X = G.mT if tall else G
    batch_shape, (m, n) = X.shape[:-2], X.shape[-2:]
    X = X.reshape(-1, m, n)  # [B, m, n], m <= n
    # Frobenius normalisation bounds the spectral norm by 1 (by 1/safety); the eps keeps a zero
    # matrix at zero instead of NaN. Norm and scaling in float32, then one cast to the compute dtype.
    norm = torch.linalg.vector_norm(X, dim=(-2, -1), keepdim=True, dtype=torch.float32)
    X = (X / (norm * safety + 1e-7)).to(dtype)
    for a, b, c in coeffs:
        A = torch.bmm(X, X.mT)  # [B, m, m]
        B = torch.baddbmm(A, A, A, beta=b, alpha=c)  # b A + c A^2
        X = torch.baddbmm(X, B, X, beta=a)  # a X + B X
    X = X.reshape(*batch_shape, m, n)
    if tall:
        X = X.mT
    return X.to(G.dtype)


def polar_express(G: torch.Tensor, steps: int = 5, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Approximate polar factor U V^T of G (or of each matrix of a batch [..., m, n]) by Polar Express.

    steps iterations of the paper's optimal quintics; past the 8th, the last polynomial repeats.
    dtype: compute dtype of the iteration (float32 unless asked: the same on every host; a bf16 run
    asks for bfloat16, see optimizers.split.build_optimizers). The result has G's dtype.
    """
    coeffs = POLAR_EXPRESS_COEFFS[:steps] + (_PE_LAST,) * max(0, steps - len(POLAR_EXPRESS_COEFFS))
    return _iterate_quintic(G, coeffs, _PE_SAFETY, dtype)


def newton_schulz(G: torch.Tensor, steps: int = 5, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Approximate polar factor of G with the classic Muon quintic (3.4445, -4.7750, 2.0315).

    Same Frobenius normalisation (without the Polar Express safety factor, as in the original
    Muon) and transposition handling as polar_express. The fixed point is not 1: singular values
    of the output oscillate in roughly [0.7, 1.2].
    """
    return _iterate_quintic(G, (NEWTON_SCHULZ_COEFFS,) * steps, 1.0, dtype)


ORTHOGONALIZERS: dict[str, Callable[..., torch.Tensor]] = {
    "polar_express": polar_express,
    "newton_schulz": newton_schulz,
}


UPDATE_SCALES = ("none", "match_rms_adamw")  # configs.config.MUON_UPDATE_SCALES lists the same


def update_scale(rows: int, cols: int, mode: str = "none") -> float:
    """The factor on a [rows, cols] matrix's orthogonalized update (whose singular values are near 1).

    none: sqrt(max(1, rows / cols)) (Keller Jordan's Muon; torch.optim.Muon's adjust_lr_fn "original"): a tall
    matrix's update gets the per-entry RMS of a square one's.
    match_rms_adamw: 0.2 sqrt(max(rows, cols)) (Moonlight, Liu et al. 2025, arXiv 2502.16982; torch's
    "match_rms_adamw"): an orthogonal [rows, cols] matrix has RMS 1 / sqrt(max(rows, cols)), so the update's
    RMS becomes 0.2, about AdamW's, and the learning rate and weight decay tuned for AdamW carry over.
    """
    if mode == "none":
        return math.sqrt(max(1.0, rows / cols))
    if mode == "match_rms_adamw":
        return 0.2 * math.sqrt(max(rows, cols))
    raise ValueError(f"update_scale={mode!r}: choose one of {', '.join(UPDATE_SCALES)}")


class Muon(torch.optim.Optimizer):
    """MomentUm Orthogonalized by Newton-Schulz (here by default: by Polar Express).

    Which parameters belong here: the 2-D hidden weight matrices of the transformer
    (attention wq/wk/wv/wo, feed-forward up/down). Everything else goes to AdamW: the token
    embedding (tied to the LM head, so it is an input/output layer, not a hidden map) and all
    1-D parameters (norm gains). `optimizers.split.build_optimizers` makes that split.

    Per parameter W [rows, cols] with gradient G, each step:
        buf = momentum * buf + G
        g   = G + momentum * buf        (nesterov)   or   buf   (otherwise)
        O   = orthogonalize(g) * update_scale(rows, cols, group["update_scale"])
        W   = W * (1 - lr * weight_decay) - lr * O
    update_scale "none" (the default), sqrt(max(1, rows/cols)), gives tall matrices (more outputs than inputs)
    an update of the same per-entry RMS as a square one; "match_rms_adamw" is Moonlight's 0.2 sqrt(max(rows,
    cols)) (see update_scale). The momentum buffer sums gradients (buf = momentum * buf + G), where
    torch.optim.Muon keeps their average (lerp: (1 - momentum) times this buffer); the orthogonalization
    divides the scale out, so the two updates agree (tests/optimizers/test_muon_torch.py).

    Matrices of the same shape (after turning tall ones wide) are orthogonalized together in one
    batched iteration (at most max_batch_numel elements per batch, to bound the extra memory).
    With a process group of several ranks (DDP, FSDP) every rank must call step(): each orthogonalizes
    its share of every batch and the results are all-gathered (`orthogonalize_shared`), so every rank
    applies every update having computed 1 / world_size of them. Under FSDP2 (parameters are DTensors
    sharded by rows) the momentum stays sharded; each update is gathered whole (DTensor.full_tensor),
    orthogonalized, and each rank applies its own rows of the result.
    ortho_dtype: compute dtype of the orthogonalization, float32 unless asked; the trainer asks for
    bfloat16 when the run trains in bf16 (optimizers.split.build_optimizers), so a run's --precision
    alone decides its arithmetic, whatever CPU it runs on. The update is applied in the parameter's dtype.
    State per parameter: `momentum_buffer` (checkpointable via state_dict).
    Each param group keeps its peak learning rate in group["base_lr"]; LR schedules set
    group["lr"] = group["base_lr"] * factor.
    """

    max_batch_numel = 2 ** 26  # 64M elements: 256 MB of float32 per stacked batch

    def __init__(self, params, lr: float = 0.02, momentum: float = 0.95, nesterov: bool = True,
                 weight_decay: float = 0.0, orthogonalizer: str = "polar_express", ortho_steps: int = 5,
                 ortho_dtype: torch.dtype = torch.float32, update_scale: str = "none"):
        if lr <= 0:
            raise ValueError(f"lr={lr} must be positive")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum={momentum} must be in [0, 1)")
        if weight_decay < 0:
            raise ValueError(f"weight_decay={weight_decay} must be >= 0")
        if orthogonalizer not in ORTHOGONALIZERS:
            raise ValueError(f"orthogonalizer={orthogonalizer!r}: choose one of {', '.join(ORTHOGONALIZERS)}")
        if ortho_steps < 1:
            raise ValueError(f"ortho_steps={ortho_steps} must be >= 1")
        defaults = dict(lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay,
                        orthogonalizer=orthogonalizer, ortho_steps=ortho_steps, update_scale=update_scale)
        self.ortho_dtype = ortho_dtype
        super().__init__(params, defaults)

    def add_param_group(self, param_group: dict) -> None:
        super().add_param_group(param_group)
        group = self.param_groups[-1]
        group.setdefault("base_lr", group["lr"])
        if group["orthogonalizer"] not in ORTHOGONALIZERS:
            raise ValueError(f"orthogonalizer={group['orthogonalizer']!r}: "
                             f"choose one of {', '.join(ORTHOGONALIZERS)}")
        if group["update_scale"] not in UPDATE_SCALES:
            raise ValueError(f"update_scale={group['update_scale']!r}: choose one of {', '.join(UPDATE_SCALES)}")
        for p in group["params"]:
            if p.ndim != 2:
                raise ValueError(f"Muon only takes 2-D weight matrices; got a parameter of shape "
                                 f"{tuple(p.shape)} (give 1-D gains and embeddings to AdamW)")

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        for group in self.param_groups:  # a state dict saved before update_scale existed scaled as "none"
            group.setdefault("update_scale", "none")

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if params:
                self._step_group(group, params)
        return loss

    def _step_group(self, group: dict, params: list[torch.Tensor]) -> None:
        lr, wd, mom, mode = group["lr"], group["weight_decay"], group["momentum"], group["update_scale"]
        grads = [_local(p.grad) for p in params]
        bufs = []
        for p in params:
            state = self.state[p]
            if "momentum_buffer" not in state:  # a DTensor like p under FSDP (checkpoints gather it)
                state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            bufs.append(_local(state["momentum_buffer"]))
        torch._foreach_mul_(bufs, mom)
        torch._foreach_add_(bufs, grads)
        updates = torch._foreach_add(grads, bufs, alpha=mom) if group["nesterov"] else bufs
        ortho = functools.partial(ORTHOGONALIZERS[group["orthogonalizer"]], steps=group["ortho_steps"],
                                  dtype=self.ortho_dtype)
        first = 0  # matrix k of the step is orthogonalized on rank k % world_size
        for idx in self._chunks(params, grads):
            full = [_full(updates[i], params[i]) for i in idx]  # gathered from the shards under FSDP
            results, first = orthogonalize_shared(full, ortho, first), first + len(idx)
            for i, o in zip(idx, results):
                p = params[i]
                r, c = p.shape
                local = _local(p)
                if wd != 0:
                    local.mul_(1.0 - lr * wd)
                local.add_(local_rows(o, p), alpha=-lr * update_scale(r, c, mode))

    def _chunks(self, params: list[torch.Tensor], grads: list[torch.Tensor]) -> list[list[int]]:
        """Indices of params in same-shape batches: a tall [r, c] matrix joins the [c, r] bucket (it is
        orthogonalized transposed), at most max_batch_numel elements per batch."""
        buckets: dict[tuple, list[int]] = defaultdict(list)
        for i, p in enumerate(params):
            r, c = p.shape
            buckets[(min(r, c), max(r, c), grads[i].dtype, grads[i].device)].append(i)
        chunks = []
        for (r, c, _, _), idx in buckets.items():
            per = max(1, self.max_batch_numel // (r * c))
            chunks += [idx[k:k + per] for k in range(0, len(idx), per)]
        return chunks


# ---------------------------------------------------------------- sharing the work over ranks
def _world() -> tuple[int, int]:
    """(rank, world size) of the default process group; (0, 1) without one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def orthogonalize_shared(updates: list[torch.Tensor], ortho: Callable[[torch.Tensor], torch.Tensor],
                         first: int = 0) -> list[torch.Tensor]:
    """ortho of each matrix of `updates` (all [r, c] or [c, r], full, the same on every rank), the work shared
    over the ranks of the default process group: matrix j goes to rank (first + j) % world_size, in one
    batch with that rank's other matrices, and the results are all-gathered. Alone (no process group or
    one rank) this is one batched call. Returns the results in the order and orientation of `updates`."""
    rank, world = _world()
    wide = [u.mT if u.size(0) > u.size(1) else u for u in updates]
    owner = [(first + j) % world for j in range(len(wide))]
    slot = [owner[:j].count(owner[j]) for j in range(len(wide))]  # place of matrix j in its owner's batch
    mine = [w for w, q in zip(wide, owner) if q == rank]
    out = ortho(torch.stack(mine)) if mine else wide[0].new_empty((0, *wide[0].shape))
    if world > 1:
        per_rank = max(slot) + 1  # every rank sends the same count: padded with zeros
        padded = torch.cat([out, out.new_zeros((per_rank - len(mine), *wide[0].shape))])
        gathered = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(gathered, padded)
        out = [gathered[q][k] for q, k in zip(owner, slot)]
    return [o.mT if u.size(0) > u.size(1) else o for o, u in zip(out, updates)]


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of a tensor: the local shard of an FSDP DTensor (same storage), else the tensor."""
    return t.to_local() if isinstance(t, DTensor) else t


def _full(local: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The whole matrix of which `local` is this rank's shard, laid out as `like` (a collective under FSDP)."""
    if not isinstance(like, DTensor):
        return local
    return DTensor.from_local(local, like.device_mesh, like.placements, shape=like.shape,
                              stride=like.stride()).full_tensor()


def local_rows(full: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """This rank's rows of `full` where `like` is an FSDP DTensor sharded on dim 0 (torch.chunk's split:
    ceil(rows / world) per rank, the last ones shorter or empty), else `full`."""
    if not isinstance(like, DTensor):
        return full
    if len(like.placements) != 1 or not isinstance(like.placements[0], Shard) or like.placements[0].dim != 0:
        raise NotImplementedError(f"Muon supports FSDP's row sharding (Shard(0)) only; got {like.placements}")
    mesh = like.device_mesh
    start = mesh.get_local_rank() * -(-full.size(0) // mesh.size())
    return full[start:start + like.to_local().size(0)]
