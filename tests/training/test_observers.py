"""What training reads at the model's hook points (training/observers.py): the telemetry's key norms and the largest
logits of QK-clip and the telemetry, attached from outside the model and removed without a trace."""
import dataclasses

import pytest
import torch

from configs import get_preset
from models import MinimalLLM
from models.layers import causal_max_logit
from tests.helpers import STEP_TOKENS, build_trainer
from training.observers import KeyNorm, LogitMax

CPU = torch.device("cpu")


def model(**over) -> MinimalLLM:
    torch.manual_seed(0)
    return MinimalLLM(dataclasses.replace(get_preset("debug").model, **over)).train()


def ids(B: int, seed: int) -> torch.Tensor:
    return torch.randint(0, 512, (B, 20), generator=torch.Generator().manual_seed(seed))


def hooks(m: MinimalLLM) -> int:
    return sum(len(x._forward_hooks) + len(x._forward_pre_hooks) for x in m.modules())


def test_the_model_holds_no_training_state():
    """The attention's only buffers are RoPE's tables (rebuilt from the config), so checkpoints hold what they did."""
    m = model(qk_norm="none")
    assert [name for name, _ in m.named_buffers()] == ["rotary.cos", "rotary.sin"]
    assert not any("max_logit" in k or "key_norm" in k for k in m.state_dict())


@torch.no_grad()
def test_key_norm_reads_the_keys_of_training_forwards_while_on():
    m = model()
    keys = KeyNorm(m.blocks, CPU, on=True)
    m(ids(3, 1))
    m(ids(2, 2))
    # at init k_norm's gain is 1: every key has RMS 1 over d_head 64, so norm 8, two forwards counted; the eps 1e-6
    # against raw keys' mean squares near 0.05 (weights of std 0.02 over d_model 128) takes about 1e-5 of it
    assert [s.tolist() for s in keys.sums] == [pytest.approx([16.0, 2.0], rel=3e-5)] * 2
    m.eval()
    m(ids(3, 1))  # validation and the probe pass through
    keys.on = False
    m.train()
    m(ids(3, 1))
    assert [s[1].item() for s in keys.sums] == [2.0, 2.0]
    keys.reset()
    assert [s.tolist() for s in keys.sums] == [[0.0, 0.0]] * 2
    keys.remove()
    assert hooks(m) == 0


@torch.no_grad()
@pytest.mark.parametrize("rows", [0, 1])
def test_logit_max_is_the_causal_maximum_of_each_layers_rotated_q_and_k_over_its_rows(rows):
    """The maximum over two forwards of causal_max_logit on the tensors at hook_q_rope and hook_k_rope (read
    by hooks of the test's own), over the first `rows` sequences of each forward (0: all): the same computation,
    so equal bit for bit."""
    m = model(qk_norm="none", n_heads=4, n_kv_heads=2)
    logits = LogitMax(m.blocks, CPU, rows=rows)
    seen: list[dict[str, torch.Tensor]] = [{} for _ in m.blocks]
    for block, own in zip(m.blocks, seen):
        block.attn.hook_q_rope.register_forward_hook(lambda mod, i, o, own=own: own.__setitem__("q", o))
        block.attn.hook_k_rope.register_forward_hook(lambda mod, i, o, own=own: own.__setitem__("k", o))
    expected = [torch.full((4,), -float("inf")) for _ in m.blocks]
    for batch in (ids(3, 1), ids(3, 2)):
        m(batch)
        n = rows or 3
        for i, own in enumerate(seen):
            top = causal_max_logit(own["q"][:n].transpose(1, 2), own["k"][:n].transpose(1, 2))
            expected[i] = torch.maximum(expected[i], top)
    assert all(torch.equal(a, b) for a, b in zip(logits.maxima, expected, strict=True))
    m.eval()
    m(ids(3, 3))  # not in evaluation
    logits.on = False
    m.train()
    m(ids(3, 3))  # nor while off
    assert all(torch.equal(a, b) for a, b in zip(logits.maxima, expected, strict=True))
    logits.reset()
    assert all(bool((t == -float("inf")).all()) for t in logits.maxima)
    logits.remove()
    assert hooks(m) == 2 * len(m.blocks)  # the test's own are left


def test_a_trainer_reads_its_model_through_hooks_it_removes_when_fit_ends(debug_cfg, tmp_path):
    t = build_trainer(debug_cfg(qk_norm="none", qk_clip=1e9, tokens=2 * STEP_TOKENS), tmp_path)
    assert hooks(t.model) == 3 * len(t.model.blocks)  # QK-clip's q and k, the telemetry's keys
    t.fit()
    assert hooks(t.model) == 0
