"""The attention variants of issue 40 (attn_softcap, attn_gate, qk_norm_scope; z_loss in the loss), each against a
value computed by hand on tiny tensors, and their refusals in the config's own validation."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from configs import ConfigError
from configs.config import ModelConfig, TrainConfig
from models.layers import Attention, Rotary
from models.llm import MinimalLLM
from models.loss import linear_cross_entropy, linear_cross_entropy_z
from training.memory import param_counts


def one_head(**kw) -> tuple[ModelConfig, Attention, object]:
    """A 1-head attention of d_model 2 (d_head 2) with no q/k norm and identity projections, and no rotation (the
    positional rotation is passed in; the identity here), so that q = k = v = x."""
    cfg = ModelConfig(vocab_size=8, n_layers=1, d_model=2, n_heads=1, n_kv_heads=1, d_ff=4, max_seq_len=4,
                      qk_norm=kw.pop("qk_norm", "none"), **kw)
    attn = Attention(cfg)
    with torch.no_grad():
        for w in (attn.wq, attn.wk, attn.wv, attn.wo):
            w.weight.copy_(torch.eye(2))
    return cfg, attn, (lambda t: t)


# Two tokens x0 = (2, 0), x1 = (1, 2): q = k = v = x. Logits: s00 = 4/sqrt2, s10 = 2/sqrt2, s11 = 5/sqrt2.
X = torch.tensor([[[2.0, 0.0], [1.0, 2.0]]])


def test_softcap_attention_by_hand():
    cap = 1.0
    _, attn, rotary = one_head(attn_softcap=cap)
    y = attn(X, rotary)[0]
    c = lambda s: cap * math.tanh(s / cap)
    # token 0 sees itself only; token 1 softmaxes its two capped logits
    e0, e1 = math.exp(c(2 / math.sqrt(2))), math.exp(c(5 / math.sqrt(2)))
    p0, p1 = e0 / (e0 + e1), e1 / (e0 + e1)
    expect = torch.tensor([[2.0, 0.0], [p0 * 2 + p1 * 1, p1 * 2]])
    torch.testing.assert_close(y, expect, rtol=1e-6, atol=1e-6)
    _, plain, _ = one_head()  # and the cap changes the answer: without it token 1 attends far more to itself
    assert (plain(X, rotary)[0, 1, 1] - y[1, 1]).item() > 0.1


def test_softcap_with_a_huge_cap_is_sdpa_and_grouped_heads_read_their_kv_head():
    torch.manual_seed(0)
    kw = dict(vocab_size=8, n_layers=1, d_model=32, n_heads=4, n_kv_heads=2, d_ff=8, max_seq_len=16)
    plain, capped = Attention(ModelConfig(**kw)), Attention(ModelConfig(**kw, attn_softcap=1e6))
    capped.load_state_dict(plain.state_dict())
    rotary = Rotary(8, 16, 10000.0)
    x = torch.randn(2, 16, 32)
    torch.testing.assert_close(capped(x, rotary), plain(x, rotary), rtol=1e-5, atol=1e-6)


def test_softcap_logits_stay_within_the_cap():
    """A large cap-free logit (q = k = 10 x) is capped: the softmax sees at most cap."""
    from research.probing.metrics import attention_metrics
    q = torch.full((1, 1, 3, 2), 10.0)
    m = attention_metrics(q, q, softcap=2.0)
    assert m["logit_max"].item() <= 2.0 and m["logit_max_uncapped"].item() == pytest.approx(200 / math.sqrt(2))


def test_gate_by_hand():
    """wg = [[1, 0], [0, -1]] elementwise: token 1's output (y0, y1) is multiplied by sigmoid(x0), sigmoid(-x1);
    headwise wg = [[1, 1]]: by sigmoid(x0 + x1)."""
    _, attn, rotary = one_head(attn_gate="elementwise")
    with torch.no_grad():
        attn.wg.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, -1.0]]))
        ungated = F.scaled_dot_product_attention(X, X, X, is_causal=True)[0]
    y = attn(X, rotary)[0]
    s = torch.sigmoid
    torch.testing.assert_close(y, ungated * torch.stack([s(X[0, :, 0]), s(-X[0, :, 1])], 1))
    _, attn, rotary = one_head(attn_gate="headwise")
    with torch.no_grad():
        attn.wg.weight.copy_(torch.tensor([[1.0, 1.0]]))
    torch.testing.assert_close(attn(X, rotary)[0], ungated * s(X[0].sum(1, keepdim=True)))


def test_full_scope_norm_by_hand():
    """Two heads of d_head 2, q of one token = (3, 4, 0, 0): per head, head 0 is (3, 4) / 5 * sqrt(2) and head 1 is
    zero; over the whole projection, every component is divided by rms = sqrt(25 / 4) = 2.5, times its own gain."""
    cfg = ModelConfig(vocab_size=8, n_layers=1, d_model=4, n_heads=2, n_kv_heads=1, d_ff=4, max_seq_len=4,
                      qk_norm="learned", qk_norm_scope="full", norm_eps=1e-12)
    attn = Attention(cfg)
    assert attn.q_norm.weight.shape == (4,) and attn.k_norm.weight.shape == (2,)
    seen = {}
    attn.hook_q_norm.register_forward_hook(lambda m, i, o: seen.setdefault("q", o))
    with torch.no_grad():
        attn.wq.weight.copy_(torch.eye(4))
        attn.q_norm.weight.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    attn(torch.tensor([[[3.0, 4.0, 0.0, 0.0]]]), lambda t: t)
    torch.testing.assert_close(seen["q"][0, 0], torch.tensor([[3 / 2.5, 2 * 4 / 2.5], [0.0, 0.0]]))


@pytest.mark.parametrize("kw", [dict(attn_gate="elementwise"), dict(attn_gate="headwise", qk_norm="frozen"),
                                dict(qk_norm_scope="full"), dict(qk_norm_scope="full", qk_norm="frozen"),
                                dict(attn_gate="headwise", qk_norm_scope="full", attn_softcap=30.0)])
def test_parameter_counts_with_variants(kw):
    m = MinimalLLM(ModelConfig(vocab_size=64, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, **kw))
    p = param_counts(m.cfg)
    assert (p.total, p.trainable) == (m.num_params(), m.num_params(trainable_only=True))
    from optimizers.split import build_optimizers
    _, split = build_optimizers(m, TrainConfig())
    assert split["muon"]["params"] == p.muon  # the gate matrix goes to Muon, as wq


@pytest.mark.parametrize("kw", [dict(attn_softcap=5.0), dict(attn_gate="elementwise"), dict(qk_norm_scope="full")])
def test_variants_give_the_same_gradients_with_gradient_checkpointing(kw):
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_ff=64, max_seq_len=16, **kw)
    m = MinimalLLM(cfg)
    x = torch.randint(0, 64, (2, 16))
    m(x, x).backward()
    grads = [p.grad.clone() for p in m.parameters() if p.grad is not None]
    m.zero_grad()
    m.grad_checkpointing = True
    m(x, x).backward()
    for a, p in zip(grads, (p for p in m.parameters() if p.grad is not None)):
        torch.testing.assert_close(p.grad, a)


def test_defaults_are_off():
    m, t = ModelConfig(), TrainConfig()
    assert (m.attn_softcap, m.attn_gate, m.qk_norm_scope, t.z_loss) == (0.0, "none", "head", 0.0)


@pytest.mark.parametrize("kw, msg", [
    (dict(qk_norm="none", qk_norm_scope="full"),
     "qk_norm_scope='full' with qk_norm='none': there is no q/k norm to scope; use --qk_norm learned or frozen, or "
     "leave --qk_norm_scope head"),
    (dict(attn_softcap=-1.0), "attn_softcap=-1.0 must be >= 0 (0 disables soft-capping), e.g. 50"),
    (dict(attn_gate="sigmoid"), "attn_gate='sigmoid': choose one of none, elementwise, headwise"),
    (dict(qk_norm_scope="layer"), "qk_norm_scope='layer': choose one of head, full"),
])
def test_impossible_model_variants_are_refused_in_one_line(kw, msg):
    with pytest.raises(ConfigError) as e:
        ModelConfig(**kw)
    assert str(e.value) == msg


def test_negative_z_loss_is_refused():
    with pytest.raises(ConfigError, match=r"^z_loss=-0.1 must be >= 0 \(0 disables it\), e.g. 1e-4$"):
        TrainConfig(z_loss=-0.1)


# ---------------------------------------------------------------------------------------------- z-loss

def test_z_loss_by_hand():
    """h = [[1, 0], [0, 0]], W = [[ln 3, 0], [0, 0]]: logits row 0 = (ln 3, 0), lse = ln 4; row 1 = (0, 0), lse =
    ln 2. Targets (0, 1): CE = (ln 4 - ln 3 + ln 2) / 2; z-term = z (ln^2 4 + ln^2 2) / 2."""
    z = 0.1
    h = torch.tensor([[1.0, 0.0], [0.0, 0.0]], requires_grad=True)
    W = torch.tensor([[math.log(3), 0.0], [0.0, 0.0]], requires_grad=True)
    y = torch.tensor([0, 1])
    objective, ce, term = linear_cross_entropy_z(h, W, y, z, chunk_elements=2)  # one row per chunk
    ce_hand = (math.log(4) - math.log(3) + math.log(2)) / 2
    term_hand = z * (math.log(4) ** 2 + math.log(2) ** 2) / 2
    assert ce.item() == pytest.approx(ce_hand, rel=1e-6) and term.item() == pytest.approx(term_hand, rel=1e-6)
    assert objective.item() == pytest.approx(ce_hand + term_hand, rel=1e-6)
    objective.backward()
    # against autograd of the plain formula
    h2, W2 = h.detach().clone().requires_grad_(), W.detach().clone().requires_grad_()
    logits = h2 @ W2.T
    (F.cross_entropy(logits, y) + z * torch.logsumexp(logits, 1).square().mean()).backward()
    torch.testing.assert_close(h.grad, h2.grad)
    torch.testing.assert_close(W.grad, W2.grad)


def test_z_loss_zero_is_the_plain_fused_loss_bit_for_bit():
    torch.manual_seed(0)
    h, W, y = torch.randn(40, 16), torch.randn(50, 16), torch.randint(0, 50, (40,))
    objective, ce, term = linear_cross_entropy_z(h, W, y, 0.0, chunk_elements=500)
    assert torch.equal(objective, linear_cross_entropy(h, W, y, chunk_elements=500)) and torch.equal(objective, ce)
    assert term.item() == 0.0


def test_fused_and_unfused_objectives_agree_and_log_the_cross_entropy():
    torch.manual_seed(0)
    cfg = ModelConfig(vocab_size=64, n_layers=1, d_model=32, n_heads=2, n_kv_heads=1, d_ff=64, max_seq_len=16)
    m = MinimalLLM(cfg)
    m.z_loss = 1e-2
    x = torch.randint(0, 64, (2, 16))
    out = {}
    for fused in (True, False):
        m.fused_loss = fused
        m.zero_grad()
        objective = m(x, x)
        objective.backward()
        out[fused] = (objective.detach(), dict(m.loss_parts), [p.grad.clone() for p in m.parameters()])
    (o1, p1, g1), (o2, p2, g2) = out[True], out[False]
    torch.testing.assert_close(o1, o2)
    torch.testing.assert_close(p1["loss"], p2["loss"])
    torch.testing.assert_close(p1["z_loss"], p2["z_loss"])
    torch.testing.assert_close(o1, p1["loss"] + p1["z_loss"])
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
    m.eval()  # validation and the probe get the cross-entropy alone
    torch.testing.assert_close(m(x, x), p2["loss"])


# ---------------------------------------------------------------------------------------------- rope_fraction

def test_partial_rotary_leaves_the_other_pairs_exactly_and_rotates_the_first_as_the_full_rotary():
    """D = 16 (8 pairs (i, i + 8)), rope_fraction 0.25: pairs 0 and 1 (dims 0, 1, 8, 9) rotate as with every pair
    rotating, bit for bit; dims 2-7 and 10-15 are the input's, bit for bit, at every position."""
    torch.manual_seed(0)
    x = torch.randn(2, 12, 3, 16)                                     # [B, T, H, D]
    part, full = Rotary(16, 12, 10000.0, fraction=0.25), Rotary(16, 12, 10000.0)
    y, y_full = part(x), full(x)
    rotated = torch.tensor([0, 1, 8, 9])
    kept = torch.tensor([d for d in range(16) if d not in (0, 1, 8, 9)])
    assert torch.equal(y[..., kept], x[..., kept])
    assert torch.equal(y[..., rotated], y_full[..., rotated])
    assert not torch.allclose(y[:, 1:, :, rotated], x[:, 1:, :, rotated])   # they do rotate after position 0
    assert (part.n_rotated, part.pairing) == (2, "half")
    assert part.frequencies().tolist() == [1.0, 10000.0 ** (-2 / 16)] + [0.0] * 6


def test_rope_fraction_one_is_the_full_rotary_and_the_model_takes_the_field():
    cfg = ModelConfig(vocab_size=8, n_layers=1, d_model=32, n_heads=2, n_kv_heads=1, d_ff=8, max_seq_len=16,
                      rope_fraction=0.5)
    assert MinimalLLM(cfg).rotary.n_rotated == 4                      # d_head 16: 8 pairs, half of them
    assert MinimalLLM(ModelConfig()).rotary.n_rotated == 32           # the default: every pair of d_head 64


@pytest.mark.parametrize("value, message", [
    (0.0, "rope_fraction=0.0 must be in (0, 1] (the share of the rotary pairs that rotate; 1: all of them)"),
    (1.5, "rope_fraction=1.5 must be in (0, 1] (the share of the rotary pairs that rotate; 1: all of them)"),
    (0.3, "rope_fraction=0.3 rotates 9.6 of the 32 rotary pairs of d_head=64: pick a whole number of pairs, e.g. "
          "0.3125"),
])
def test_rope_fraction_out_of_range_or_between_pairs_is_refused(value, message):
    with pytest.raises(ConfigError) as e:
        ModelConfig(d_model=128, n_heads=2, rope_fraction=value)
    assert str(e.value) == message


# --- the QK-norm settings the field tunes (issue 71): gain shape, gain init, qk_mult, attn_scale -----------------

def test_the_logit_scale_and_multiplier_by_hand():
    """attn_scale and qk_mult multiply every logit: token 1's weights on its two tokens, by hand, at scale 1 (Gemma
    4), at 1/sqrt(2) times qk_mult 1.3, and 1/sqrt(d_head) by default."""
    for kw, scale in (({}, 2 ** -0.5), ({"attn_scale": 1.0}, 1.0), ({"qk_mult": 1.3}, 1.3 * 2 ** -0.5),
                      ({"attn_scale": 0.25, "qk_mult": 2.0}, 0.5)):
        cfg, attn, rotary = one_head(**kw)
        assert cfg.logit_scale == pytest.approx(scale)
        y = attn(X, rotary)[0]
        e0, e1 = math.exp(2 * scale), math.exp(5 * scale)  # q1 . k0 = 2, q1 . k1 = 5
        expect = torch.tensor([[2.0, 0.0], [(e0 * 2 + e1 * 1) / (e0 + e1), e1 * 2 / (e0 + e1)]])
        torch.testing.assert_close(y, expect, rtol=1e-6, atol=1e-6)
        _, capped, _ = one_head(attn_softcap=1e6, **kw)  # the written-out path takes the same scale
        torch.testing.assert_close(capped(X, rotary)[0], expect, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape,on,want_q,want_k", [
    ("shared", "both", (16,), (16,)), ("per_head", "both", (4, 16), (2, 16)), ("head_scalar", "both", (4, 1), (2, 1)),
    ("head_scalar", "q", (4, 1), (16,)), ("shared", "k", (16,), (16,))])
def test_the_gain_shapes_and_which_norm_carries_them(shape, on, want_q, want_k):
    cfg = ModelConfig(vocab_size=8, n_layers=1, d_model=64, n_heads=4, n_kv_heads=2, d_ff=8, max_seq_len=16,
                      qk_gain_shape=shape, qk_gain_on=on, qk_gain_init=1.5)
    model = MinimalLLM(cfg)  # reset_parameters sets every gain to its initial value
    attn = model.blocks[0].attn
    q, k = attn.q_norm.weight, attn.k_norm.weight
    assert (tuple(q.shape), tuple(k.shape)) == (want_q, want_k)
    assert q.requires_grad == (on != "k") and k.requires_grad == (on != "q")
    assert float(q.detach().unique()) == (1.5 if on != "k" else 1.0)
    assert float(k.detach().unique()) == (1.5 if on != "q" else 1.0)
    x = torch.randn(2, 5, 4, 16)
    if shape != "shared":  # each head's normalized vector times its own gain
        with torch.no_grad():
            q.copy_(torch.arange(1, 5, dtype=torch.float32).view(4, 1).expand_as(q))
        y = attn.q_norm(x)
        hat = x / x.square().mean(-1, keepdim=True).add(cfg.norm_eps).sqrt()
        torch.testing.assert_close(y, hat * torch.arange(1, 5, dtype=torch.float32).view(4, 1), rtol=1e-5, atol=1e-6)


def test_frozen_gains_stay_at_their_init_and_per_head_gains_go_to_adamw():
    from configs.config import TrainConfig
    from optimizers import build_optimizers
    kw = dict(vocab_size=8, n_layers=1, d_model=64, n_heads=4, n_kv_heads=2, d_ff=8, max_seq_len=16)
    frozen = MinimalLLM(ModelConfig(**kw, qk_norm="frozen", qk_gain_init=5.0)).blocks[0].attn
    assert float(frozen.q_norm.weight.unique()) == 5.0 and not frozen.q_norm.weight.requires_grad
    model = MinimalLLM(ModelConfig(**kw, qk_gain_shape="head_scalar"))
    names = {n for n, p in model.named_parameters() if p.ndim == 2 and "norm" in n}
    assert names == {"blocks.0.attn.q_norm.weight", "blocks.0.attn.k_norm.weight"}
    opts, _ = build_optimizers(model, TrainConfig())
    muon = {id(p) for o in opts if type(o).__name__ == "Muon" for g in o.param_groups for p in g["params"]}
    assert not any(id(p) in muon for n, p in model.named_parameters() if n in names)


@pytest.mark.parametrize("kw,said", [
    ({"qk_norm": "none", "qk_gain_init": 2.0}, "qk_gain_init=2.0 with qk_norm='none': there is no q/k norm gain"),
    ({"qk_norm": "none", "qk_gain_shape": "per_head"}, "qk_gain_shape='per_head' with qk_norm='none'"),
    ({"qk_norm_scope": "full", "qk_gain_shape": "head_scalar"}, "qk_gain_shape='head_scalar' with "
                                                                 "qk_norm_scope='full': a gain per head needs"),
    ({"qk_gain_init": 0.0}, "qk_gain_init=0.0 must be a positive number"),
    ({"qk_mult": -1.0}, "qk_mult=-1.0 must be a positive number"),
    ({"attn_scale": -0.5}, "attn_scale=-0.5 must be >= 0")])
def test_settings_that_cannot_work_are_refused_in_one_line(kw, said):
    with pytest.raises(ConfigError) as e:
        ModelConfig(vocab_size=8, n_layers=1, d_model=64, n_heads=4, n_kv_heads=2, d_ff=8, max_seq_len=16, **kw)
    assert said in str(e.value) and "\n" not in str(e.value)
