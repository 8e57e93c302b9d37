"""The key probe: one no-grad forward on a fixed batch, measuring keys at the model's hook points.

    probe = KeyProbe(eval_ids_BT)
    record = probe(model)        # per-layer key/attention metrics and gain statistics
    record, loss = KeyProbe(eval_ids_BT, targets_BT=next_ids_BT).measure(model, loss_rows=n)
                                 # and the mean LM loss of the first n sequences, from the same forward

The hooks are the adapter's (OwnAdapter.capture); `LayerSink` reads them and `layer_record` builds every layer's
record, for this project's model and for a Hugging Face one. The sites (k_norm, k_rope, k_hat, k_hat_rope), the
metrics, the memory and why probing never changes training: docs/probing.md.
"""
from __future__ import annotations

import math
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import torch
import torch.nn as nn

from research.access.own_adapter import OwnAdapter
from research.probing import metrics as declared
from research.probing.key_rank import key_rank
from research.probing.metrics import (attention_metrics, divided_moments, gain_factor, gamma_stats, key_eigvals,
                                      key_metrics, key_moments, key_pr_sv, layer_means)
from research.probing.rotary_use import logit_pair_shares, rotary_use
from research.results.vocabulary import (ATTENTION_METRICS, GAIN_SPLIT, GATE_CLOSED, GATE_METRICS, GATE_OPEN,
                                         LOGIT_SPLIT, PR, PRE_GAIN_SITES,
                                         QUERY_ROTARY, ROTARY_METRICS, UNCAPPED_SPLIT)


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module behind DDP and torch.compile wrappers."""
    while True:
        if hasattr(model, "module") and isinstance(model.module, nn.Module):  # DDP
            model = model.module
        elif hasattr(model, "_orig_mod"):  # torch.compile
            model = model._orig_mod
        else:
            return model


class LayerSink:
    """An adapter's capture callbacks reduced, layer by layer, to layer_record's records: the one reader of both probes
    (KeyProbe through OwnAdapter, hf.measure.HFKeyProbe through a Hugging Face family's adapter). The model's own
    attention computes the output (on_attention returns None).

    ropes: each layer's RoPE (ModelRope, AdapterRope) or None; context(window): the tokens a layer's rotary use is
    read against; exact: layer_record's; learned_hat: the k_hat sites only where the k norm's gain is learned (this
    project's frozen gain is 1); projections: a k_proj site beside a k_norm one (the adapters' capture hands it only
    then). Without a k norm the projection stands
    for k_norm (as this project's qk_norm='none'), the queries' likewise."""

    def __init__(self, adapter, ropes: list | None, context: Callable[[int | None], int], *, exact: bool = False,
                 learned_hat: bool = False, projections: bool = True):
        self.adapter, self.ropes, self.context = adapter, ropes, context
        self.exact, self.learned_hat, self.projections = exact, learned_hat, projections
        self.values = False  # the adapters' capture need not hold the values for it
        self.pre: dict[int, dict[str, torch.Tensor]] = {}
        self.layers: list[dict] = []
        self.final: torch.Tensor | None = None

    def on_state(self, l: int, h_BTd: torch.Tensor) -> None:
        if l == self.adapter.n_layers:
            self.final = h_BTd

    def on_keys(self, i: int, site: str, x_HBTD: torch.Tensor) -> None:
        self.pre.setdefault(i, {})[site] = x_HBTD

    on_queries = on_keys

    def on_gate(self, i: int, g_HBTg: torch.Tensor) -> None:
        self.on_keys(i, "gate", g_HBTg)
        norms = self.adapter.gate_weight_norms(i)
        if norms is not None:
            self.on_keys(i, "gate_weight_norm", norms)

    def tensors(self, i: int, q_BHTD: torch.Tensor, k_BKTD: torch.Tensor) -> tuple[dict[str, torch.Tensor], bool]:
        """(layer i's tensors as layer_record reads them [H, B, T, D], whether it has the k_hat sites)."""
        t = self.pre.pop(i, {})
        has_norm = "k_norm" in t
        t.update(q_rope=q_BHTD.transpose(0, 1), k_rope=k_BKTD.transpose(0, 1))
        for x in "qk":
            if f"{x}_norm" not in t and f"{x}_proj" in t:
                t[f"{x}_norm"] = t.pop(f"{x}_proj")
        return t, has_norm and (not self.learned_hat or learned_gain(self.adapter.qk_norms(i)[1]) is not None)

    def on_attention(self, i, q_BHTD, k_BKTD, v, scaling, window, softcap):
        t, hat = self.tensors(i, q_BHTD, k_BKTD)
        q_norm, k_norm = self.adapter.qk_norms(i)
        gains = self.adapter.gain(q_norm), self.adapter.gain(k_norm)
        self.layers.append(layer_record(i, t, gains=gains, pre_gain=gains[1] if hat else None,
                                        rope=self.ropes[i] if self.ropes is not None else None,
                                        context=self.context(window), exact=self.exact, scale=scaling, window=window,
                                        softcap=softcap))
        return None


def as_lists(metrics: dict[str, torch.Tensor]) -> dict[str, list[float]]:
    """Per-head metric tensors as JSON-ready lists of floats."""
    return {k: v.double().tolist() for k, v in metrics.items()}


def lists_and_means(records: dict[str, dict[str, torch.Tensor]]) -> tuple[dict[str, dict[str, list]], dict[str, float]]:
    """as_lists of each record and layer_means of all of them ("record.metric": mean), the same values: the [H]
    metrics of one length stacked into one float64 tensor, read out with one tolist() and their means with one more
    (a row's mean is the vector's own: the same reduction), the others (sink_by_position [Hq, T]) one by one."""
    rows: dict[int, list[tuple[str, str, torch.Tensor]]] = {}
    for name, metrics in records.items():
        for k, v in metrics.items():
            if v.dim() == 1:
                rows.setdefault(v.shape[0], []).append((name, k, v))
    read: dict[tuple[str, str], tuple[list, float]] = {}
    for group in rows.values():
        stacked = torch.stack([v.double() for _, _, v in group])               # [metrics, H] float64
        read.update(((name, k), (values, mean)) for (name, k, _), values, mean
                    in zip(group, stacked.tolist(), stacked.mean(1).tolist()))
    lists: dict[str, dict[str, list]] = {}
    means: dict[str, float] = {}
    for name, metrics in records.items():  # in the records' own order, as as_lists and layer_means give them
        lists[name] = {}
        for k, v in metrics.items():
            lists[name][k], means[f"{name}.{k}"] = read[name, k] if v.dim() == 1 else \
                (v.double().tolist(), layer_means({k: v})[k])
    return lists, means


def attention_record(attn_m: dict[str, torch.Tensor], q_pre: torch.Tensor, k_pre: torch.Tensor,
                     gain_q: torch.Tensor | None, gain_k: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """The recorded attention metrics of a layer (ATTENTION_METRICS and LOGIT_SPLIT, [Hq] each) from
    attention_metrics' result, with UNCAPPED_SPLIT where it has them (a soft-capped model), and GAIN_SPLIT where
    the layer has q and k norm gains (their effective values):
    q_pre [Hq, B, T, D] and k_pre [Hkv, B, T, D] are the norms' outputs before RoPE."""
    out = {n: attn_m[n] for n in (*ATTENTION_METRICS, *LOGIT_SPLIT)}
    out.update({n: attn_m[n] for n in UNCAPPED_SPLIT if n in attn_m})  # soft-capped models only
    if gain_q is not None and gain_k is not None:
        b, t, j = attn_m["logit_at"]
        Hq, Hkv = q_pre.shape[0], k_pre.shape[0]
        heads = torch.arange(Hq, device=b.device)
        out.update(zip(GAIN_SPLIT, (gain_factor(q_pre, gain_q, torch.stack([b, t]), heads),
                                    gain_factor(k_pre, gain_k, torch.stack([b, j]), heads // (Hq // Hkv)))))
    return out


SITE_ORDER = ("k_norm", "k_proj", "k_rope", PRE_GAIN_SITES["k_norm"], PRE_GAIN_SITES["k_rope"])  # records' order
RANKED_SITES = ("k_norm", "k_rope")  # the sites whose key_rank is recorded


def site_metrics(t: dict[str, torch.Tensor], pre_gain: torch.Tensor | None, rope,
                 exact: bool) -> tuple[dict[str, dict[str, torch.Tensor]], torch.Tensor]:
    """key_metrics of each site of a layer's keys, in one call over all the sites' heads (one contiguous float32
    [sites, H, B, T, D] copy: k_norm, k_proj where t has it, k_hat = k_norm / pre_gain (0 where the gain is 0) where
    pre_gain is given, k_rope, and with `exact` k_hat_rope = rope.rotate(k_hat)), and key_rank (RANK_METRICS) of
    k_norm's and k_rope's, from one set of float64 moments and one eigendecomposition of them. With `exact` (the
    training probe's reading), k_hat's moments are k_norm's divided exactly (divided_moments); else the divided keys'.
    Also k_norm's energy per head and dim [H, D] (its second moment's diagonal), what ModelRope.use reads."""
    hat = [PRE_GAIN_SITES["k_norm"]] if pre_gain is not None else []
    names = ["k_norm", *(["k_proj"] if "k_proj" in t else []), *hat, "k_rope",
             *([PRE_GAIN_SITES["k_rope"]] if hat and exact else [])]
    stack = torch.empty(len(names), *t["k_norm"].shape, device=t["k_norm"].device)
    for n, name in enumerate(names):
        if name in t:
            stack[n].copy_(t[name])
    H, cut = stack.shape[1], names.index(hat[0]) if hat and exact else len(names)
    if hat:  # x / inf = 0 for finite x: one division, exact where g != 0, instead of where() over the keys
        g = pre_gain.detach().float().reshape(-1, 1, 1, stack.shape[-1]).to(stack.device)   # [1 or H, 1, 1, D]
        k_hat = torch.div(stack[0], torch.where(g != 0, g, math.inf), out=stack[names.index(hat[0])])
        if exact:
            stack[-1].copy_(rope.rotate(k_hat))
    parts = [key_moments(stack[:cut].flatten(0, 1))]
    if cut < len(names):  # k_hat's from k_norm's, then the sites after it
        parts += [divided_moments(tuple(m[:H] for m in parts[0]), pre_gain), key_moments(stack[cut + 1:].flatten(0, 1))]
    moments = tuple(torch.cat(m) for m in zip(*parts))
    eig = key_eigvals(moments)                                 # [2 * sites * H, D]: every site's M, then its C
    m = key_metrics(stack.flatten(0, 1), moments, eig)
    per_site = {name: {k: v[i * H:(i + 1) * H] for k, v in m.items()} for i, name in enumerate(names)}
    SH = len(names) * H
    for name in RANKED_SITES:
        i = names.index(name)
        per_site[name].update(key_rank(eigvals=torch.cat([eig[i * H:(i + 1) * H], eig[SH + i * H:SH + (i + 1) * H]])))
    records = {name: per_site[name] for name in SITE_ORDER if name in per_site}  # the records' order
    return records, moments[0][:H].diagonal(dim1=1, dim2=2)


def learned_gain(norm: nn.Module | None) -> torch.Tensor | None:
    """A norm's gain where it is learned (the pre-gain sites exist); else None."""
    gain = getattr(norm, "weight", None)
    return gain if gain is not None and gain.requires_grad else None


class ModelRope:
    """This project's Rotary as layer_record reads it: the rotation of k_hat_rope and the rotary use."""

    def __init__(self, rotary: nn.Module):
        self.rotary, self.pairing, self.frequencies = rotary, rotary.pairing, rotary.frequencies()

    def rotate(self, x_HBTD: torch.Tensor) -> torch.Tensor:
        """RoPE of [H, B, T, D] vectors (the model's Rotary takes [B, T, H, D])."""
        return self.rotary(x_HBTD.permute(1, 2, 0, 3)).permute(2, 0, 1, 3)

    def use(self, t: dict[str, torch.Tensor], key_energy: torch.Tensor, logit_at: torch.Tensor,
            context: int) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, list]]:
        """(ROTARY_METRICS of the keys [Hkv], QUERY_ROTARY of the queries [Hq], pair_share {k_norm, q_norm, logit}
        as lists [heads][pairs]): rotary_use before RoPE in one call over both, the keys' energy per dim from their
        moments (key_energy, site_metrics'), and logit_pair_shares of the rotated q and k at logit_at."""
        Hkv = t["k_norm"].shape[0]
        energy = torch.cat([key_energy.float(), t["q_norm"].float().square().sum((1, 2))])     # [Hkv + Hq, D]
        use = rotary_use(None, self.frequencies, context, self.pairing, energy=energy)
        pairs = {"k_norm": use["pair_share"][:Hkv], "q_norm": use["pair_share"][Hkv:],
                 "logit": logit_pair_shares(t["q_rope"], t["k_rope"], logit_at, self.pairing)}
        queries = dict(zip(QUERY_ROTARY, (use[n][Hkv:] for n in ROTARY_METRICS)))
        return {n: use[n][:Hkv] for n in ROTARY_METRICS}, queries, {k: v.tolist() for k, v in pairs.items()}


def layer_record(i: int, t: dict[str, torch.Tensor], *, gains: tuple[torch.Tensor | None, torch.Tensor | None],
                 pre_gain: torch.Tensor | None, rope, context: int, exact: bool = False, scale: float | None = None,
                 window: int | None = None, softcap: float | None = None) -> dict:
    """One layer's record, for both probes (KeyProbe: this project's model; hf.measure.HFKeyProbe: any adapter's),
    from its captured tensors t [heads, B, T, D]: k_norm (the keys before RoPE: k_norm's output, or the projection),
    k_rope, q_rope, and where captured q_norm, k_proj (beside a k_norm), gate. gains: the q and k norms' effective
    gains (None: no norm); pre_gain: what k_hat divides by (None: no k_hat); rope: ModelRope, AdapterRope or None,
    its use read against `context` tokens; exact: site_metrics'; scale, window, softcap: the attention's."""
    g_q, g_k = gains
    rec: dict = {"layer": i}
    with torch.autocast(t["k_rope"].device.type, enabled=False):  # metrics in full precision
        attn_m = attention_metrics(t["q_rope"], t["k_rope"], scale=scale, window=window, softcap=softcap)
        split = "q_norm" in t and g_q is not None and g_k is not None
        attn_rec = attention_record(attn_m, t.get("q_norm"), t["k_norm"], *((g_q, g_k) if split else (None, None)))
        if "gate" in t:
            attn_rec.update(gate_metrics(t["gate"], t.get("gate_weight_norm")))
        sites, key_energy = site_metrics(t, pre_gain, rope, exact)
        if rope is not None:
            k_use, q_use, pairs = rope.use(t, key_energy, attn_m["logit_at"], context)
            sites["k_norm"].update(k_use)
            attn_rec.update(q_use)
        for record, name, fn in declared.LAYER_METRICS:  # read when called: a declaration added there is recorded
            if record == "attn" or record in sites:
                (attn_rec if record == "attn" else sites[record])[name] = fn({**t, "rope": rope, "attention": attn_m})
        lists, means = lists_and_means({**sites, "attn": attn_rec})
        rec.update(lists)
    if rope is not None:
        rec["pair_share"] = pairs
    rec["gamma_k"], rec["gamma_q"], rec["means"] = gamma_stats(g_k), gamma_stats(g_q), means
    return rec


@contextmanager
def measuring(model: nn.Module, device: torch.device, precision: str) -> Iterator[None]:
    """A probe's forward: eval mode, bf16 autocast when precision is bf16, and afterwards the module's mode and
    the RNG states as they were, so that probing never changes training."""
    was_training = model.training
    cpu_rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    model.eval()
    try:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
            yield
    finally:
        model.train(was_training)
        torch.set_rng_state(cpu_rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state(cuda_rng, device)


def gate_metrics(gate_HBTg: torch.Tensor, weight_norm_H: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
    """GATE_METRICS of each query head from its sigmoid gate values [H, B, T, D or 1]: mean and population std
    (unbiased=False) over the batch's tokens (and channels), the shares below GATE_CLOSED and above GATE_OPEN, and
    the norm of the head's rows of W_g (weight_norm_H; NaN where not given), float64 [H]."""
    g = gate_HBTg.detach().double().flatten(1)                                   # [H, B*T*(D or 1)]
    norm = torch.full((g.shape[0],), math.nan, dtype=torch.float64) if weight_norm_H is None else \
        weight_norm_H.detach().double().cpu()
    return dict(zip(GATE_METRICS, (g.mean(1), g.std(1, correction=0), (g < GATE_CLOSED).double().mean(1),
                                   (g > GATE_OPEN).double().mean(1), norm.to(g.device))))


class _PRSink:
    """measure_pr's reader: each layer's mean key_pr_sv of its keys before RoPE (k_norm's, else the projection's)."""

    projections = values = False

    def __init__(self):
        self.prs: dict[int, float] = {}
        self.keys: dict[int, torch.Tensor] = {}

    def on_state(self, l, h) -> None:
        pass

    def on_keys(self, i: int, site: str, k_HBTD: torch.Tensor) -> None:
        self.keys[i] = k_HBTD  # projections=False: the one site before RoPE (k_norm's, else the projection)

    def on_attention(self, i, *args) -> None:
        with torch.autocast(self.keys[i].device.type, enabled=False):
            self.prs[i] = key_pr_sv(self.keys.pop(i)).mean().item()


class KeyProbe:
    """Measures a model's keys on a fixed evaluation batch of token ids [B, T]; given the batch's next tokens
    (targets [B, T]), also the LM loss of its first sequences from the same forward (measure)."""

    def __init__(self, eval_ids_BT: torch.Tensor, precision: str = "fp32", targets_BT: torch.Tensor | None = None,
                 context: int | None = None):
        if targets_BT is not None and targets_BT.shape != eval_ids_BT.shape:
            raise ValueError(f"targets {tuple(targets_BT.shape)} must have the ids' shape {tuple(eval_ids_BT.shape)}")
        self.ids = eval_ids_BT
        self.targets = targets_BT
        self.precision = precision
        # the training context low_freq_share reads wavelengths against (a run's seq_len; else the batch's length)
        self.context = context or eval_ids_BT.shape[1]

    def __call__(self, model: nn.Module) -> dict:
        return self.measure(model)[0]

    def sink(self, model: nn.Module) -> LayerSink:
        """The LayerSink of this probe's reading of `model` (this project's MinimalLLM, unwrapped)."""
        return LayerSink(OwnAdapter(model), [ModelRope(model.rotary)] * len(model.blocks), lambda window: self.context,
                         exact=True, learned_hat=True, projections=False)

    def covers(self, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> int:
        """n where the (inputs, targets) batches, in order, are the first n sequences of the probe's batch and
        its targets, and all batches have the same size (so that their mean of batch-mean losses is the mean
        loss over those n sequences' tokens, what measure(model, n) gives); 0 where they are not."""
        if self.targets is None or not batches or len({x.shape for x, _ in batches}) != 1:
            return 0
        x, y = torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches])
        n = x.shape[0]
        if n > self.ids.shape[0] or x.shape[1:] != self.ids.shape[1:]:
            return 0
        same = torch.equal(x.long(), self.ids[:n].long()) and torch.equal(y.long(), self.targets[:n].long())
        return n if same else 0

    @torch.no_grad()
    def measure_pr(self, model: nn.Module, loss_rows: int = 0) -> tuple[list[float], float, float | None]:
        """A light probe: (each layer's mean PR, their mean, the loss of the first `loss_rows` sequences) as measure
        gives them (its layers' means[PR], mean_pr, loss), bit for bit, from the same forward reading only the
        k_norm keys and only their pr_sv (key_pr_sv): what the gain ablation records of each mode."""
        if loss_rows and (self.targets is None or loss_rows > self.ids.shape[0]):
            raise ValueError(f"loss_rows={loss_rows} needs targets and at most {self.ids.shape[0]} rows")
        model = unwrap(model)
        device = next(model.parameters()).device
        sink = _PRSink()
        loss = None
        with measuring(model, device, self.precision), OwnAdapter(model).capture(sink):
            h_BTd = model.hidden(self.ids.to(device))
            if loss_rows:
                loss = model.loss(h_BTd[:loss_rows], self.targets[:loss_rows].to(device)).item()
        prs = sink.prs
        layer_pr = [prs[i] for i in sorted(prs)]
        return layer_pr, sum(layer_pr) / len(layer_pr), loss

    @torch.no_grad()
    def measure(self, model: nn.Module, loss_rows: int = 0) -> tuple[dict, float | None]:
        """(the probe's record, the mean next-token loss of the batch's first `loss_rows` sequences, or None for
        loss_rows=0). The loss comes from the probe's own hidden states through the model's LM head and loss
        (MinimalLLM.loss), in the probe's precision and eval mode: the value a validation pass over those
        sequences in that precision gives, up to float rounding, without a second forward."""
        if loss_rows and (self.targets is None or loss_rows > self.ids.shape[0]):
            raise ValueError(f"loss_rows={loss_rows} needs targets and at most {self.ids.shape[0]} rows")
        model = unwrap(model)
        device = next(model.parameters()).device
        sink = self.sink(model)
        loss = None
        t0 = time.perf_counter()
        with measuring(model, device, self.precision):
            with sink.adapter.capture(sink):
                h_BTd = model.hidden(self.ids.to(device))
            probe_time = time.perf_counter() - t0  # the probe's own cost, without the loss it shares
            if loss_rows:
                loss = model.loss(h_BTd[:loss_rows], self.targets[:loss_rows].to(device)).item()
        layers = sink.layers
        layers.sort(key=lambda r: r["layer"])
        return ({"layers": layers, "mean_pr": sum(r["means"][PR] for r in layers) / len(layers),
                 "probe_time_s": probe_time, "batch": list(self.ids.shape), "precision": self.precision,
                 "rotary": {"pairing": model.rotary.pairing, "context": self.context}}, loss)
