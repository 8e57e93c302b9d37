"""The memory a run needs per device, computed from its config before anything is allocated.

`plan_memory(cfg, device_type, precision, world_size, shard)` returns a `MemoryPlan`: bytes per device of the
weights, gradients, optimizer states, bf16 weight copies, saved activations, the loss, the transients of backward
and of the optimizer step, and the probe, then the peak of each phase of a step. No model is built; only shapes are
used. training/memory_fit.py compares the plan with the device (`--plan` prints it; a CUDA run that cannot fit is
refused, naming options that would fit).
The activation model (the tensors autograd keeps per token and block) and how close the plan comes to what a step
holds (tests/training/test_memory.py): docs/memory.md.
"""
from __future__ import annotations

from dataclasses import dataclass

from configs.config import ModelConfig, RunConfig, TrainConfig
from models.loss import default_chunk_elements
from optimizers.muon import Muon

GIB = 2 ** 30
MUON_MAX_BATCH_NUMEL = Muon.max_batch_numel
PROBE_BLOCK = 64  # research.probing.metrics.attention_metrics' block_size
HEADROOM = 0.10  # CUDA: the caching allocator's fragmentation and library workspaces, on top of the plan


@dataclass(frozen=True)
class Params:
    """Parameter counts by optimizer, and the block matrices' shapes, of a ModelConfig (and a TrainConfig's split)."""

    embed: int  # tied embedding / LM head (AdamW)
    gains: int  # trainable 1-D norm gains (AdamW)
    frozen: int  # frozen q/k norm gains (no optimizer)
    block_matrices: tuple[tuple[int, int], ...]  # one block's weight matrices [rows, cols]
    n_layers: int
    adamw_matrices: tuple[tuple[int, int], ...] = ()  # those of block_matrices that AdamW updates (qk_optimizer)

    @property
    def muon_matrices(self) -> tuple[tuple[int, int], ...]:
        """One block's Muon matrices: block_matrices less adamw_matrices."""
        rest = list(self.block_matrices)
        for shape in self.adamw_matrices:
            rest.remove(shape)
        return tuple(rest)

    @property
    def muon(self) -> int:
        return self.n_layers * sum(r * c for r, c in self.muon_matrices)

    @property
    def adamw_block(self) -> int:
        """AdamW's block matrices, all layers."""
        return self.n_layers * sum(r * c for r, c in self.adamw_matrices)

    @property
    def per_block_matmul(self) -> int:
        return sum(r * c for r, c in self.block_matrices)

    @property
    def adamw(self) -> int:
        return self.embed + self.gains + self.adamw_block

    @property
    def trainable(self) -> int:
        return self.muon + self.adamw

    @property
    def total(self) -> int:
        return self.trainable + self.frozen


def gate_width(m: ModelConfig) -> int:
    """Rows of the attention gate's matrix wg (attn_gate): H x D (elementwise), H (headwise), 0 (none)."""
    return {"none": 0, "elementwise": m.n_heads * m.d_head, "headwise": m.n_heads}[m.attn_gate]


def param_counts(m: ModelConfig, t: TrainConfig | None = None) -> Params:
    """The counts of model m; t (default: the default TrainConfig) decides which optimizer holds W_q and W_k."""
    kv = m.n_kv_heads * m.d_head
    d, F, L = m.d_model, m.d_ff, m.n_layers
    qk_gains = 2 * m.d_head if m.qk_norm_scope == "head" else d + kv  # full scope: gains over whole projections
    qk = {"learned": (qk_gains, 0), "frozen": (0, qk_gains), "none": (0, 0)}[m.qk_norm]
    gate = ((gate_width(m), d),) if m.attn_gate != "none" else ()
    wq_wk = ((d, d), (kv, d))
    return Params(embed=m.vocab_size * d, gains=L * (2 * d + qk[0]) + d, frozen=L * qk[1],
                  block_matrices=(*wq_wk, (kv, d), (d, d), (F, d), (d, F), *gate), n_layers=L,
                  adamw_matrices=wq_wk if t is not None and t.qk_optimizer == "adamw" else ())


def block_activation_bytes(m: ModelConfig, e: int, n: int, seq_len: int = 0) -> int:
    """Bytes autograd saves per token in one block (the table in the module docstring); seq_len T counts the
    scores a soft-capped attention keeps (attn_softcap > 0: its row of T logits per head, twice, in float32)."""
    d, F, kv, Hq, Hkv = m.d_model, m.d_ff, m.n_kv_heads * m.d_head, m.n_heads, m.n_kv_heads
    norms = 2 * (4 * d + 4 + n * 4 * d)
    proj_in = (4 * d if e == 4 else 3 * 2 * d) + (2 * d if e == 2 and m.attn_gate != "none" else 0)
    rms = 4 * (Hq + Hkv) if m.qk_norm_scope == "head" else 8
    qk = {"learned": 4 * (d + kv) + rms + n * 4 * (d + kv),
          "frozen": 4 * (d + kv) + rms, "none": 0}[m.qk_norm]
    if m.attn_softcap:  # float32 q and repeated k, tanh and softmax outputs [T] per head, the probabilities and
        # repeated v in v's dtype
        sdpa = e * (d + 2 * kv) + e * d + 4 * 2 * d + Hq * seq_len * (8 + (2 if e == 2 else 0)) + e * d
    else:
        sdpa = e * (d + 2 * kv) + e * d + 4 * Hq
    gate = e * gate_width(m) + e * d if m.attn_gate != "none" else 0  # the sigmoid, and the gated output (wo's input)
    ffn = e * d + 2 * e * F
    return norms + proj_in + qk + sdpa + gate + ffn


def block_backward_bytes(m: ModelConfig, e: int) -> int:
    """Transient bytes per token while one block runs backward: gradients of the FFN hidden (relu
    output, square, down's input) and of the residual stream in flight (measured shape of the peak)."""
    return 3 * e * m.d_ff + 3 * 4 * m.d_model


def muon_transient_bytes(p: Params, e: int, world_size: int, sharded_params: bool) -> int:
    """Largest extra memory of one Muon chunk: the stacked fp32 updates, the normalized fp32 copy and two
    iterates in the compute dtype, the two Gram matrices, and the result; a rank orthogonalizes its
    share of a chunk and gathers the whole chunk's results (fp32). FSDP also gathers the full updates."""
    shapes: dict[tuple[int, int], int] = {}
    for r, c in p.muon_matrices:
        key = (min(r, c), max(r, c))
        shapes[key] = shapes.get(key, 0) + p.n_layers
    worst = 0
    for (rows, cols), count in shapes.items():
        per = max(1, MUON_MAX_BATCH_NUMEL // (rows * cols))
        k = min(count, per * world_size)  # matrices in one round (every rank's share)
        share = -(-k // world_size)
        work = share * rows * cols * (4 + 4 + 2 * e) + 2 * share * rows * rows * e + share * rows * cols * 4
        gathered = k * rows * cols * 4 if world_size > 1 else 0
        full = k * rows * cols * 4 if sharded_params else 0
        worst = max(worst, work + gathered + full)
    return worst


def loss_bytes(m: ModelConfig, tokens: int, e: int, fused: bool, chunk: int) -> tuple[int, int, int]:
    """(saved for backward, forward workspace, backward gradients) of the LM head + cross-entropy."""
    d, V = m.d_model, m.vocab_size
    if fused:
        chunk = min(tokens, max(1, chunk // V)) * V  # logits per chunk
        saved = 4 * tokens * d + 4 * V * d  # dL/dh and dL/dW, computed in the forward
        work = 12 * chunk + 4 * tokens * d  # a chunk's fp32 logits and logsumexp's two temporaries; h
        if e != 4:  # the chunk's bf16 product and probabilities; bf16 h and W; a chunk's bf16 dW and its fp32 cast
            work += 4 * chunk + 2 * tokens * d + 2 * V * d + 6 * V * d
        return saved, work, 4 * tokens * d + 4 * V * d
    saved = e * tokens * d + 4 * tokens * V  # h (cast) and the log-probabilities
    return saved, (e + 4) * tokens * V + 4 * tokens * d, 2 * 4 * tokens * V


def probe_bytes(m: ModelConfig, probe_tokens: int, probe_sequences: int, seq_len: int) -> int:
    """The probe's documented bound (docs/speed.md, "The probe"): one layer's fp32 forward (residual, FFN
    hidden, q/k/v and attention output), the layer's keys in float64 at two sites, and
    attention_metrics' score blocks and float32 copies of q and k."""
    d, F, kv, D, Hq, Hkv = m.d_model, m.d_ff, m.n_kv_heads * m.d_head, m.d_head, m.n_heads, m.n_kv_heads
    layer = 4 * probe_tokens * (d + 2 * F + 2 * d + 2 * kv)
    keys = 2 * 8 * probe_tokens * kv
    attn = 8 * Hq * probe_sequences * PROBE_BLOCK * seq_len + 4 * (Hq + 2 * Hkv) * probe_tokens * D
    if m.attn_softcap:  # the model's own soft-capped attention holds its float32 scores, capped and softmaxed
        attn += 3 * 4 * Hq * probe_sequences * seq_len * seq_len
    return layer + keys + attn


@dataclass(frozen=True)
class MemoryPlan:
    """Bytes per device of one training run. `parts` are the named terms, `phases` the peak of each
    phase of a step (sums of parts), `peak` the largest phase."""

    device_type: str
    precision: str
    world_size: int
    shard: str
    micro_batch: int  # sequences per device per micro-batch
    seq_len: int
    grad_checkpointing: bool
    parts: dict
    phases: dict

    @property
    def peak(self) -> int:
        return max(self.phases.values())

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=self.phases.get)


def plan_memory(cfg: RunConfig, device_type: str, precision: str, world_size: int = 1,
                shard: str | None = None) -> MemoryPlan:
    """The plan of `cfg` on `world_size` devices of `device_type` ("cuda" or "cpu"), training in
    `precision` ("bf16" or "fp32"), sharded by `shard` (default cfg.train.shard). DDP (shard "none")
    replicates weights, gradients and states; FSDP divides them by world_size and gathers the embedding
    and two blocks at a time. The micro-batch per device is batch_size / world_size."""
    m, t = cfg.model, cfg.train
    shard = t.shard if shard is None else shard
    p, L, d, T = param_counts(m, t), m.n_layers, m.d_model, cfg.data.seq_len
    e, n = (2 if precision == "bf16" else 4), (0 if device_type == "cuda" else 1)
    micro = max(1, t.batch_size // world_size)
    N = micro * T
    div = world_size if shard == "fsdp" else 1
    ckpt = t.grad_checkpointing
    bf16_block = 2 * p.per_block_matmul if e == 2 else 0
    per_layer = block_activation_bytes(m, e, n, T) * N
    loss_saved, loss_work, loss_grads = loss_bytes(m, N, e, t.fused_loss, default_chunk_elements(device_type))
    parts = {
        "weights": 4 * p.total // div,
        "gradients": 4 * p.trainable // div,
        "muon_momentum": 4 * p.muon // div,
        "adamw_moments": 8 * p.adamw // div,
        "bf16_weight_copies": L * bf16_block,
        "activations": L * (4 * d * N if ckpt else per_layer) + N * (8 + 4 * d + 4 + n * 4 * d),
        "recomputed_block": per_layer + bf16_block if ckpt else 0,
        "loss_saved": loss_saved,
        "loss_workspace": loss_work,
        "loss_gradients": loss_grads,
        "block_backward": block_backward_bytes(m, e) * N,
        "fsdp_gathered": 2 * 4 * p.embed + 4 * 4 * p.per_block_matmul if shard == "fsdp" else 0,
        "muon_step": muon_transient_bytes(p, e, world_size, shard == "fsdp"),
        # fused on CUDA; on CPU the sqrt of the second moments of one param group at a time (the largest group)
        "adamw_step": 0 if device_type == "cuda" else 4 * max(p.embed, p.adamw_block),
        "ddp_buckets": 4 * p.trainable if world_size > 1 and shard == "none" else 0,  # DDP's gradient buckets
        "probe": probe_bytes(m, cfg.probe.probe_batch * T, cfg.probe.probe_batch, T) if cfg.probe.probe_every else 0,
        # FSDP: rank 0 probes an unsharded copy, filled one gathered tensor at a time (training/sharding.py)
        "probe_full_copy": 4 * (p.total + p.embed) if shard == "fsdp" and cfg.probe.probe_every else 0,
    }
    q = parts
    states = q["weights"] + q["muon_momentum"] + q["adamw_moments"]
    held = q["gradients"] if (t.grad_accum > 1 or world_size > 1) else 0  # else they appear as activations go
    phases = {
        "forward": states + held + q["bf16_weight_copies"] + q["activations"] + q["loss_saved"]
        + q["loss_workspace"] + q["fsdp_gathered"],
        "backward": states + held + (0 if ckpt else q["bf16_weight_copies"]) + q["activations"]
        + q["loss_gradients"] + q["block_backward"] + q["recomputed_block"] + q["fsdp_gathered"] + q["ddp_buckets"],
        "optimizer": states + q["gradients"] + q["ddp_buckets"] + q["muon_step"] + q["adamw_step"],
        "probe": states + q["probe"] + q["probe_full_copy"],
    }
    return MemoryPlan(device_type=device_type, precision=precision, world_size=world_size, shard=shard,
                      micro_batch=micro, seq_len=T, grad_checkpointing=ckpt, parts=parts, phases=phases)


_LABELS = {
    "weights": "weights (fp32 master copy)", "gradients": "gradients (fp32)",
    "muon_momentum": "Muon momentum (fp32)", "adamw_moments": "AdamW moments (2 x fp32)",
    "bf16_weight_copies": "bf16 copies of the block matrices (autocast)",
    "activations": "activations saved for backward", "recomputed_block": "one block recomputed (checkpointing)",
    "loss_saved": "fused loss: dL/dh and dL/dW kept for backward", "loss_workspace": "loss forward workspace",
    "loss_gradients": "loss gradients entering backward", "block_backward": "one block's backward temporaries",
    "fsdp_gathered": "FSDP: embedding and two blocks gathered, with grads", "muon_step": "Muon step (one chunk)",
    "adamw_step": "AdamW step temporaries", "ddp_buckets": "DDP gradient buckets (fp32)",
    "probe": "probe working set (one layer at a time)",
    "probe_full_copy": "FSDP: rank 0's unsharded copy for the probe",
}


def format_plan(plan: MemoryPlan, cfg: RunConfig, available: int | None = None, where: str = "") -> str:
    """The plan as lines for a terminal: every part, every phase, the peak and (if known) what is free."""
    m = cfg.model
    e, n = (2 if plan.precision == "bf16" else 4), (0 if plan.device_type == "cuda" else 1)
    per_tok = block_activation_bytes(m, e, n, cfg.data.seq_len)
    sharding = f", {plan.shard} over {plan.world_size}" if plan.shard != "none" else ""
    checkpointed = "only the block input, 4 x d_model bytes per token, with checkpointing; " \
        if plan.grad_checkpointing else ""
    lines = [f"memory plan per device: preset {cfg.preset}, {param_counts(m).total:,} parameters, "
             f"{plan.device_type} {plan.precision}, {plan.world_size} device(s){sharding}, micro-batch "
             f"{plan.micro_batch} x {plan.seq_len} tokens, gradient checkpointing "
             f"{'on' if plan.grad_checkpointing else 'off'}, probe {'on' if plan.parts['probe'] else 'off'}",
             f"  activation model: {per_tok:,} bytes per token per block saved for backward "
             f"({per_tok * plan.micro_batch * plan.seq_len / GIB:.2f} GiB per block at this micro-batch; "
             f"{checkpointed}training/memory.py lists the tensors)"]
    for key, value in plan.parts.items():
        if value:
            lines.append(f"  {_LABELS[key]:<52} {value / GIB:8.2f} GiB")
    lines.append("  phases: " + ", ".join(f"{k} {v / GIB:.2f} GiB" for k, v in plan.phases.items()))
    need = needed_bytes(plan)
    lines.append(f"  peak {plan.peak / GIB:.2f} GiB ({plan.peak_phase}); with {HEADROOM:.0%} headroom "
                 f"{need / GIB:.2f} GiB")
    if available is not None:
        verdict = "fits" if need <= available else "does NOT fit"
        lines.append(f"  available {available / GIB:.2f} GiB{where}: {verdict}")
    return "\n".join(lines)


def needed_bytes(plan: MemoryPlan) -> int:
    """The peak with HEADROOM added: what must be free on the device."""
    return int(plan.peak * (1 + HEADROOM))
