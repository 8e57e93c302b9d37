"""Inspect a pretrained causal LM's internals (the Llama 2 7B write-up's tour), for any supported family.

    model, tokenizer, adapter = load_model("path")         # research.access.loading
    result = inspect_model(adapter, tokenizer, prompt)     # a JSON-ready dict (inspect.json)

Sections of the result: params, weights, attention, hidden, amplitude, logit_lens, keys (the probe's key and
attention metrics, research.probing.metrics), dictionaries, input_lens and head_words
(research.inspection.dictionaries), memory. Every statistic is reduced inside the forward, layer by layer, so that
memory beyond the weights stays bounded (the last 15 layers' hidden states, one block of queries' attention).
What each section holds, and the memory bound: docs/inspection.md, "The tour".
"""
from __future__ import annotations

import math
import sys
import time
from collections import deque

import torch

from research.access.adapters import Adapter, InspectError
from research.access.gguf import quantization_note
from research.inspection.dictionaries import (DEFAULT_WORDS, DICT_SAMPLE, dictionary_section, head_words,
                                              input_lens)
from research.probing.metrics import attention_metrics, gamma_stats, key_metrics, layer_means
from research.probing.probe import as_lists
from research.results.vocabulary import SITES

SINK_THRESHOLD = 0.3  # Gu et al. 2024: a head is a sink head if its mean first-token attention exceeds this
GAPS = (5, 15)
GAUSSIAN_RATIO = math.sqrt(math.pi / 2)  # sigma / mean|w| of a zero-centred Gaussian, 1.2533
DEFAULT_PROMPT = ("The history of science is the study of how people came to understand the natural world. "
                  "Early astronomers watched the sky, recorded the motion of the planets, and built calendars. "
                  "Later, careful experiments and mathematics turned these observations into laws of nature.")


# ----------------------------------------------------------------------------------------------
# Static statistics: parameters and weights

def _kind(name: str) -> str:
    n = name.lower()
    if "norm" in n or ".ln_" in n or n.startswith("ln_"):
        return "norms"
    if any(s in n for s in ("embed", "wte", "wpe", "lm_head")):
        return "embeddings"
    if any(s in n for s in ("attn", "attention")):
        return "attention"
    if any(s in n for s in ("mlp", "ffn", "feed_forward")):
        return "feed_forward"
    return "other"


def param_tally(adapter: Adapter) -> dict:
    """Parameters by kind (each shared tensor once), checked against the model's own count."""
    by_kind = {"embeddings": 0, "attention": 0, "feed_forward": 0, "norms": 0, "other": 0}
    for name, p in adapter.model.named_parameters():  # named_parameters yields a tied tensor once
        by_kind[_kind(name)] += p.numel()
    total = sum(by_kind.values())
    own = adapter.model_param_count()
    return {"by_kind": by_kind, "total": total, "model_count": own, "matches": total == own}


def sigma_over_mean_abs(w: torch.Tensor, dim: int | None = None) -> float:
    """sigma / mean|w| (population sigma): of all entries (dim None) or mean over vectors along `dim`."""
    w = w.detach().float()
    if dim is None:
        return (w.std(correction=0) / w.abs().mean()).item()
    ratio = w.std(dim=dim, correction=0) / w.abs().mean(dim=dim)
    return ratio[torch.isfinite(ratio)].mean().item()


@torch.no_grad()
def weight_stats(adapter: Adapter) -> dict:
    """Per layer, for q/k/v/o: sigma/mean|w| of the whole matrix, of vectors along the model
    dimension (length d_model: rows of Wq/Wk/Wv, columns of Wo) and of vectors across heads
    (length heads x head_dim: columns of Wq/Wk/Wv, rows of Wo); mean over vectors."""
    out = {m: {"whole": [], "model_dim": [], "heads": []} for m in "qkvo"}
    for i in range(adapter.n_layers):
        for m, w in adapter.qkvo(i).items():  # Linear layout [out, in]
            model_axis = 0 if m == "o" else 1  # the axis of length d_model
            out[m]["whole"].append(sigma_over_mean_abs(w))
            out[m]["model_dim"].append(sigma_over_mean_abs(w, dim=model_axis))
            out[m]["heads"].append(sigma_over_mean_abs(w, dim=1 - model_axis))
    return {"gaussian_reference": GAUSSIAN_RATIO, "matrices": out}


# ----------------------------------------------------------------------------------------------
# The sink that reduces everything during the forward

def _cos(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.cosine_similarity(a, b, dim=-1, eps=1e-12)


class _Collector:
    """Receives the adapter's callbacks and reduces them at once (see the module docstring)."""

    def __init__(self, adapter: Adapter, positions: list[int], top_k: int, heatmap_layer: int):
        self.a = adapter
        self.positions, self.top_k, self.heatmap_layer = positions, top_k, heatmap_layer
        self.ring: deque = deque(maxlen=max(GAPS))   # (l, states) of the last 15 layers
        self.adjacent: dict[int, tuple[float, float]] = {}
        self.gaps = {g: {} for g in GAPS}
        self.neighbour: dict[int, dict] = {}
        self.rms: dict[int, tuple[float, float]] = {}
        self.at_positions: dict[int, torch.Tensor] = {}  # [P, d] per state: the logit and input lenses read them
        self.keys: dict[int, dict] = {}
        self.attn: dict[int, dict] = {}
        self.heatmap = None
        self.peak_ring_bytes = 0

    def on_state(self, l: int, h: torch.Tensor) -> None:
        h = h.float()                                                            # [B, T, d]
        for prev_l, prev in self.ring:
            gap = l - prev_l
            c = _cos(prev, h)                                                    # [B, T]
            if gap == 1:
                self.adjacent[prev_l] = (c.mean().item(), c.std(correction=0).item())
            if gap in self.gaps:
                self.gaps[gap][prev_l] = c.mean().item()
        u = h / h.norm(dim=-1, keepdim=True).clamp_min(1e-30)
        T = h.shape[1]
        nb = {}
        for d in (1, 2):
            nb[f"d{d}"] = (u[:, d:] * u[:, :-d]).sum(-1).mean().item() if T > d else math.nan
        pair = u.sum(1).square().sum(-1) - u.square().sum((1, 2))                # [B] sum over i != j
        nb["all_pairs"] = (pair.sum() / (h.shape[0] * T * (T - 1))).item() if T > 1 else math.nan
        self.neighbour[l] = nb
        self.rms[l] = (h.square().mean().sqrt().item(),
                       h[:, 1:].square().mean().sqrt().item() if T > 1 else math.nan)
        self.at_positions[l] = h[0, self.positions]                              # a copy: list indexing
        self.ring.append((l, h))
        self.peak_ring_bytes = max(self.peak_ring_bytes, sum(x.numel() * 4 for _, x in self.ring))

    def on_keys(self, i: int, site: str, k_HBTD: torch.Tensor) -> None:
        self.keys.setdefault(i, {})[site] = as_lists(key_metrics(k_HBTD))

    def on_attention(self, i, q_BHTD, k_BKTD, v_BKTD, scaling, window, softcap):
        k = k_BKTD.transpose(0, 1)                                              # [Hkv, B, T, D]
        st = attention_metrics(q_BHTD.transpose(0, 1), k, None if v_BKTD is None else v_BKTD.transpose(0, 1),
                               scale=scaling, window=window, softcap=softcap)
        self.keys.setdefault(i, {})["k_rope"] = as_lists(key_metrics(k))
        self.attn[i] = {"first_token": st["sink_mass"].tolist(), "entropy": st["entropy"].tolist(),
                        "qk_ratio": st["qk_ratio"].tolist(), "scaling": scaling, "sliding_window": window,
                        "softcap": softcap}
        if i == self.heatmap_layer:
            self.heatmap = st["sink_by_position"].tolist()
        return st["output"].permute(1, 2, 0, 3) if "output" in st else None  # [B, T, Hq, Dv]


# ----------------------------------------------------------------------------------------------

def _positions(spec: list[int] | None, T: int) -> list[int]:
    pos = [-1] if not spec else spec
    out = []
    for p in pos:
        if not -T <= p < T:
            raise InspectError(f"logit-lens position {p} is outside the prompt's {T} tokens: give --positions "
                               f"in {-T}..{T - 1} (negative counts from the end)")
        out.append(p % T)
    return out


def _note(message: str) -> None:
    print(f"note: {message}", file=sys.stderr)


def fit_context(adapter: Adapter, ids: torch.Tensor, max_tokens: int, what: str = "the prompt",
                log=_note) -> torch.Tensor:
    """ids [B, T] cut to max_tokens and to the model's context (adapter.context); a cut by the context is
    logged, since the model cannot read more (its RoPE table or position embedding ends there)."""
    if max_tokens < 2:
        raise InspectError(f"--max_tokens {max_tokens}: give at least 2 (the tour compares tokens with each other)")
    T, ctx = ids.shape[1], adapter.context
    if ctx is not None and T > ctx and ctx < max_tokens:
        log(f"{what} has {T} tokens, more than the model's context ({adapter.context_name} = {ctx}): "
            f"inspecting its first {ctx} tokens")
    return ids[:, :min(max_tokens, ctx or max_tokens)]


def excluding_query0(mass, T: int):
    """Mean first-token attention over query positions 1..T-1 (a float or a tensor of them), from the mean
    over 0..T-1: query 0 can
    only attend to token 0 (weight exactly 1), which lifts the mean over all positions by (1 - m) / T."""
    return (T * mass - 1.0) / (T - 1)


def _attention(col: _Collector, L: int, heatmap_layer: int, T: int) -> dict:
    """First-token attention per (layer, head) with query 0 and without it, the sink rate both ways, and the
    attention arguments per layer."""
    first = [col.attn[i]["first_token"] for i in range(L)]
    excl = [[excluding_query0(x, T) for x in row] for row in first]
    flat = [x for row in first for x in row]
    flat_excl = [x for row in excl for x in row]
    return {"first_token": first, "first_token_excl_q0": excl,
            "sink_rate_excl_q0": sum(x > SINK_THRESHOLD for x in flat_excl) / len(flat_excl),
            "layer_mean_first_token_excl_q0": [sum(r) / len(r) for r in excl],
            "entropy": [col.attn[i]["entropy"] for i in range(L)],
            "qk_ratio": [col.attn[i]["qk_ratio"] for i in range(L)],
            "layer_mean_first_token": [sum(r) / len(r) for r in first],
            "sink_threshold": SINK_THRESHOLD, "sink_rate": sum(x > SINK_THRESHOLD for x in flat) / len(flat),
            "heatmap_layer": heatmap_layer, "heatmap": col.heatmap,
            "scaling": [col.attn[i]["scaling"] for i in range(L)],
            "sliding_window": [col.attn[i]["sliding_window"] for i in range(L)],
            "softcap": [col.attn[i]["softcap"] for i in range(L)]}


def _hidden(col: _Collector, L: int) -> dict:
    """Similarity of hidden states 0..L (0 = embeddings, L = the last layer's output, before the final norm)."""
    adj_mean = [col.adjacent[l][0] for l in range(L)]
    gaps = {}
    for g in GAPS:
        starts = list(range(0, L + 1 - g))
        gaps[str(g)] = {"start_layer": starts, "measured": [col.gaps[g][l] for l in starts],
                        "predicted": [math.prod(adj_mean[l:l + g]) for l in starts]}
    return {"states": L + 1, "adjacent_mean": adj_mean, "adjacent_std": [col.adjacent[l][1] for l in range(L)],
            "gaps": gaps,
            "neighbour": {k: [col.neighbour[l][k] for l in range(L + 1)] for k in ("d1", "d2", "all_pairs")}}


def _amplitude(col: _Collector, adapter: Adapter) -> dict:
    """RMS of the hidden states and the mean gains of the layers' norms."""
    L = adapter.n_layers
    gains, abs_gains = {}, {}
    for i in range(L):
        for name, g in adapter.layer_gains(i).items():
            gains.setdefault(name, []).append(g.mean().item())
            abs_gains.setdefault(name, []).append(g.abs().mean().item())
    fin = adapter.gain(adapter.final_norm_module())
    return {"rms": [col.rms[l][0] for l in range(L + 1)], "rms_excl_first": [col.rms[l][1] for l in range(L + 1)],
            "mean_gain": gains, "mean_abs_gain": abs_gains,
            "final_norm_mean_gain": None if fin is None else fin.mean().item()}


def _logit_lens(col: _Collector, L: int, positions: list[int], top_k: int, decode) -> list[dict]:
    lens = []
    for l in range(L + 1):
        with torch.no_grad():  # [P, V] logits of the first sequence's states at the positions
            logits = col.a.logits(col.at_positions[l].unsqueeze(0))[0]
        top = torch.softmax(logits, dim=-1).topk(top_k, dim=-1)
        lens.append({"layer": l, "positions": [
            {"pos": ps, "ids": top.indices[j].tolist(), "tokens": [decode(t) for t in top.indices[j].tolist()],
             "probs": top.values[j].tolist()} for j, ps in enumerate(positions)]})
    return lens


def _keys(col: _Collector, adapter: Adapter, attention: dict) -> dict:
    """Key metrics per layer and site, the layer's attention metrics and its q/k gain statistics."""
    layers = []
    for i in range(adapter.n_layers):
        q_norm, k_norm = adapter.qk_norms(i)
        rec = {"layer": i, **col.keys[i],
               "attn": {"entropy": attention["entropy"][i], "qk_ratio": attention["qk_ratio"][i],
                        "sink_mass": attention["first_token"][i]},
               "gamma_k": gamma_stats(adapter.gain(k_norm)), "gamma_q": gamma_stats(adapter.gain(q_norm))}
        rec["means"] = {f"{s}.{n}": v for s in ("k_proj", *SITES) if s in col.keys[i]
                        for n, v in layer_means({m: torch.tensor(x) for m, x in col.keys[i][s].items()}).items()}
        layers.append(rec)
    return {"sites": [s for s in ("k_proj", *SITES) if s in col.keys[0]], "layers": layers}


def check_arguments(adapter: Adapter, top_k: int, heatmap_layer: int | None, head_layer: int,
                    dict_sample: int) -> int:
    """InspectError naming the option when an argument cannot work for this model; returns the heatmap layer
    (None: the middle one)."""
    L = adapter.n_layers
    hl = L // 2 if heatmap_layer is None else heatmap_layer
    for name, flag, layer in (("heatmap", "--layer", hl), ("head-words", "--head_layer", head_layer)):
        if not 0 <= layer < L:
            raise InspectError(f"{name} layer {layer} ({flag}) is outside 0..{L - 1}: the model has {L} layers")
    if dict_sample < 3:
        raise InspectError(f"dictionary sample of {dict_sample} tokens (--dict_sample): give at least 3")
    V = adapter.vocab_rows()
    if not 1 <= top_k <= V:
        raise InspectError(f"--top_k {top_k}: give 1..{V:,} (the model's vocabulary has {V:,} tokens)")
    return hl


@torch.no_grad()
def inspect_model(adapter: Adapter, tokenizer, prompt: str = DEFAULT_PROMPT, positions: list[int] | None = None,
                  top_k: int = 5, heatmap_layer: int | None = None, max_tokens: int = 512,
                  words=DEFAULT_WORDS, dict_sample: int = DICT_SAMPLE, head_layer: int = 0,
                  ids: torch.Tensor | None = None, text: dict | None = None, log=_note) -> dict:
    """Run the whole inspection on one prompt, or on a batch of token windows `ids` [B, T] (then `text`
    describes where they come from, and the per-token sections read window 0); returns the inspect.json
    dict. top_k serves the logit lens, the input lens and the head words alike. Tokens beyond max_tokens
    or the model's context are left out (fit_context; a cut by the context is logged). Every argument is
    checked before the forward."""
    t0 = time.perf_counter()
    what = "the prompt" if ids is None else "each text window"
    if ids is None:
        ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
        text = {"source": "prompt"}
    else:
        prompt = None
    given = ids.shape[1]
    ids = fit_context(adapter, ids, max_tokens, what, log)
    B, T = ids.shape
    if T < 2:
        raise InspectError(f"the prompt gives {T} token(s); give a longer --prompt")
    adapter.check_token_ids(ids, what)
    L = adapter.n_layers
    hl = check_arguments(adapter, top_k, heatmap_layer, head_layer, dict_sample)
    pos = _positions(positions, T)
    col = _Collector(adapter, pos, top_k, hl)
    with adapter.capture(col):
        logits = adapter.forward(ids.to(next(adapter.model.parameters()).device))

    def decode(i):
        return tokenizer.decode([i])
    attention = _attention(col, L, hl, T)
    d = adapter.d_model
    return {
        "model": adapter.source, "family": adapter.family, "model_type": adapter.model_type,
        "dtype": str(next(adapter.model.parameters()).dtype).replace("torch.", ""),
        "n_layers": L, "n_heads": adapter.n_heads, "n_kv_heads": adapter.n_kv_heads, "head_dim": adapter.head_dim,
        "d_model": d, "prompt": prompt, "text": text, "batch": B, "n_tokens": T, "token_ids": ids[0].tolist(),
        "context": {"limit": adapter.context, "field": adapter.context_name, "tokens_given": given},
        "gguf": adapter.gguf, "quantization": quantization_note(adapter.gguf),
        "tokens": [decode(t) for t in ids[0].tolist()],
        "params": param_tally(adapter), "weights": weight_stats(adapter), "attention": attention,
        "hidden": _hidden(col, L), "amplitude": _amplitude(col, adapter),
        "logit_lens": {"positions": pos, "top_k": top_k, "layers": _logit_lens(col, L, pos, top_k, decode),
                       "model_top_ids": logits[0, pos].float().topk(top_k, dim=-1).indices.tolist()},
        "keys": _keys(col, adapter, attention),
        "dictionaries": dictionary_section(adapter, tokenizer, words, dict_sample),
        "input_lens": input_lens(adapter, col.at_positions, pos, ids[0].tolist(), top_k, decode),
        "head_words": head_words(adapter, head_layer, top_k, decode),
        "memory": {"bound": "16 x B x T x d x 4 bytes of hidden states (ring of the last 15 layers + current), "
                            "plus 2 x B x Hq x 64 x T x 4 bytes of attention scratch, beyond the weights; "
                            "the dictionary sections: dictionaries.memory_bound_bytes plus VOCAB_BLOCK x d x 4 "
                            "bytes, never a vocabulary x vocabulary matrix",
                   "hidden_ring_bytes_bound": 16 * B * T * d * 4, "hidden_ring_bytes_peak": col.peak_ring_bytes,
                   "attention_block_bytes": 2 * B * adapter.n_heads * 64 * T * 4},
        "time_s": time.perf_counter() - t0,
    }
