"""What a training step computes: FLOPs per token of a model config (research/benchmark.py, research/speed), apart
from the config's own declarations."""
from __future__ import annotations

from configs.config import ModelConfig


def flops_per_token(m: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token: 6 * (non-embedding matmul params + LM head) + attention.

    Forward matmuls cost 2 FLOPs per weight per token; backward twice that. Attention
    scores and the weighted sum add 2 * 2 * T * d_model per layer forward for full
    (non-causal) attention; causal masking halves the useful work, which we count.
    """
    d, kv = m.d_model, m.n_kv_heads * m.d_head
    per_layer = d * d * 2 + d * kv * 2 + 2 * d * m.d_ff  # wq, wo, wk, wv, up, down
    per_layer += d * {"none": 0, "elementwise": m.n_heads * m.d_head, "headwise": m.n_heads}[m.attn_gate]  # wg
    matmul_params = m.n_layers * per_layer + m.vocab_size * d  # + LM head
    attn = m.n_layers * 2 * seq_len * d  # causal: half of 4*T*d per layer, forward
    return 6 * matmul_params + 3 * attn
