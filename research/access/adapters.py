"""Where things are inside a causal LM: one adapter class per model family.

    adapter = ADAPTERS[model_type](hf_model)      # or OwnAdapter(minimal_llm), own_adapter.py
    with adapter.capture(sink): adapter.forward(ids_BT)

An adapter exposes, uniformly across families: the decoder layers, per layer the q/k/v/o
weights in nn.Linear layout [out, in] (GPT-2's fused Conv1D c_attn is transposed and split),
the k_norm/q_norm gains where the model has them, the per-layer norm gains (Gemma's RMSNorm
multiplies by 1 + weight: the effective gain is reported), the final norm, the input and
output embeddings, and per head the query/key weights as maps of the residual stream
(`read_weights`, the norms' gains folded in). Families differ by overriding a few small
methods, never by if-chains on a name.
During `capture`, forward hooks call back into a sink, layer by layer, with:

    sink.on_state(l, h_BTd)                         residual stream entering layer l (l = n_layers: leaving
                                                    the last layer, before the final norm)
    sink.on_keys(i, site, k_HBTD)                   keys of layer i at "k_proj" / "k_norm"
    sink.on_queries(i, "q_norm", q_HBTD)            (if the sink has it, and the model a q_norm) its output
    sink.on_attention(i, q_BHTD, k_BKTD, v, scaling, window, softcap) -> output [B, T, H, Dv] or None

Attention of Hugging Face models: inside `capture` only, the attention function of the model's own
implementation (sdpa, flash_attention_2, eager, ...) is wrapped, so the sink receives the post-RoPE q
and k exactly as the model's attention uses them (its own scaling, sliding window and soft-cap
arguments). When the sink returns an output, the model uses it (the inspection computes attention
blockwise itself: no [T, T] matrix of all heads is kept); when it returns None, the model's own
implementation computes the output as it always does (the training-time probe: the model keeps its
SDPA or flash attention and never falls back to eager). The wrapper is an entry of transformers'
attention registry for the implementation's name, set and removed by `capture`: while it is set, another
model of the process using that implementation passes through it untouched (no two captures at once).
This project's MinimalLLM gets q/k from its hook points (hook_q_rope, hook_k_rope) and keeps its own
SDPA output.
"""
from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn as nn

from utils.errors import UserError, shown

DEFAULT_ATTN = "sdpa"  # models loaded for inspection: PyTorch's fused attention, which every supported family has


class InspectError(UserError, RuntimeError):
    """A model that cannot be found, loaded or inspected; the message says why and what to do."""


def heads_first(x_BTHD: torch.Tensor) -> torch.Tensor:
    """[B, T, H, D] hook output -> [H, B, T, D] (detached view), the layout the sinks and the metrics take."""
    return x_BTHD.detach().permute(2, 0, 1, 3)  # [H, B, T, D]


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


class Adapter:
    """The common interface; subclasses fill in where a family keeps things."""

    family = "?"
    gain_offset = 0.0  # Gemma RMSNorm: y = x_hat * (1 + w)
    logit_softcap: float | None = None
    source = "?"  # where the model was loaded from (set by the loader)
    gguf: dict | None = None  # gguf_source.json of a model converted from a GGUF file (set by the loader)
    tokenizer_size: int | None = None  # len(tokenizer) of the tokenizer loaded with the model (set by the loader)
    model_type = "?"
    context: int | None = None  # the most tokens a sequence may have (None: no limit known)
    context_name = "context"  # the config field that sets it, for messages
    # the dims of each rotary pair (research.probing.rotary_use): "half", (i, i + D/2) as transformers' rotate_half in
    # every family here; "interleaved", (2i, 2i + 1); None: no rotary (GPT-2)
    rotary_pairing: str | None = "half"
    layers: list[nn.Module]
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_model: int

    def __init__(self, model: nn.Module):
        self.model = model

    # --- structure -------------------------------------------------------------------------
    def qkvo(self, i: int) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def qk_norms(self, i: int) -> tuple[nn.Module | None, nn.Module | None]:
        return None, None

    def layer_gains(self, i: int) -> dict[str, torch.Tensor]:
        """Effective gain vectors of the layer's own norms (not q/k norms), by module name."""
        out = {}
        for name, mod in self.layers[i].named_children():
            w = getattr(mod, "weight", None)
            if ("norm" in name or name.startswith("ln")) and isinstance(w, torch.Tensor) and w.dim() == 1:
                out[name] = w.detach().float() + self.gain_offset
        return out

    def gain(self, module: nn.Module | None) -> torch.Tensor | None:
        w = getattr(module, "weight", None) if module is not None else None
        return None if w is None else w.detach().float() + self.gain_offset

    def final_norm_module(self) -> nn.Module:
        raise NotImplementedError

    def output_embedding(self) -> torch.Tensor:
        raise NotImplementedError

    def input_embedding(self) -> torch.Tensor:
        """The token dictionary [V, d] the model adds to the residual stream (before any sqrt(d) scale)."""
        raise NotImplementedError

    def attention_norm(self, i: int) -> nn.Module | None:
        """The norm layer i applies to the residual stream before attention (None: it reads it raw)."""
        return getattr(self.layers[i], "input_layernorm", None)

    @torch.no_grad()
    def read_weights(self, i: int, m: str) -> torch.Tensor:
        """Layer i's query (m='q') or key ('k') weights per head as linear maps of the residual
        stream, [heads, D, d] float32: the pre-attention norm's gain multiplies the columns and the
        q_norm / k_norm gain the rows. The norms' per-token 1/RMS factors are dropped: they scale a
        token's query or key, never the direction it reads."""
        W = self.qkvo(i)[m].detach().float()                                    # [H * D, d]
        g_in = self.gain(self.attention_norm(i))
        if g_in is not None:
            W = W * g_in[None, :]
        g_out = self.gain(self.qk_norms(i)[0 if m == "q" else 1])
        if g_out is not None:  # per head (size D, shared by the heads) or over the whole projection (OLMo 2)
            W = W * g_out.repeat(W.shape[0] // g_out.numel())[:, None]
        return W.reshape(-1, self.head_dim, W.shape[1])

    def model_param_count(self) -> int:
        return self.model.num_parameters()

    def vocab_rows(self) -> int:
        """Token ids the model can read and write: rows of the smaller of its two dictionaries."""
        return min(self.input_embedding().shape[0], self.output_embedding().shape[0])

    def check_window(self, tokens: int, what: str = "windows", option: str = "--seq_len") -> None:
        """InspectError when sequences of `tokens` tokens are longer than the model's context: the one check of
        every tool that feeds windows to a model (`option`: what sets their length, named in the fix)."""
        if self.context is not None and tokens > self.context:
            raise InspectError(f"{what} of {tokens} tokens ({option}) are longer than the context of {self.source} "
                               f"({self.context_name} = {self.context}): pass {option} {self.context} or less")

    def check_token_ids(self, ids: torch.Tensor, what: str = "the prompt") -> None:
        """InspectError when a token id has no embedding row (the tokenizer is not the model's)."""
        rows = self.input_embedding().shape[0]
        top = int(ids.max()) if ids.numel() else -1
        if top >= rows:
            tok = f"the tokenizer has {self.tokenizer_size:,} tokens" if self.tokenizer_size else "the tokenizer"
            raise InspectError(f"{what} holds token id {top:,} but the model's embedding has {rows:,} rows "
                               f"(ids 0..{rows - 1:,}) and {tok}: the tokenizer and the model likely come from "
                               f"different checkpoints; use the tokenizer saved with this model")

    def logits(self, h_BTd: torch.Tensor) -> torch.Tensor:
        """Final norm and output embedding (+ final soft-cap) of residual states, float32."""
        W = self.output_embedding()
        x = self.final_norm_module()(h_BTd.to(W.dtype))
        z = (x @ W.T).float()
        if self.logit_softcap:
            z = torch.tanh(z / self.logit_softcap) * self.logit_softcap
        return z

    # --- running ---------------------------------------------------------------------------
    def forward(self, ids_BT: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @contextmanager
    def capture(self, sink) -> Iterator[None]:
        raise NotImplementedError

    @contextmanager
    def _hooks(self, sink) -> Iterator[list]:
        """Yields a list to append hook handles to; on_state hooks are registered already. Every
        handle is removed on exit, also when the forward raises."""
        handles = []
        try:
            for l, layer in enumerate(self.layers):
                def pre(module, args, kwargs, l=l):
                    sink.on_state(l, (args[0] if args else kwargs["hidden_states"]).detach())
                handles.append(layer.register_forward_pre_hook(pre, with_kwargs=True))
            last = self.n_layers
            handles.append(self.layers[-1].register_forward_hook(
                lambda module, args, out: sink.on_state(last, _first(out).detach())))
            yield handles
        finally:
            for h in handles:
                h.remove()


class HFAdapter(Adapter):
    """Hugging Face causal LMs with the Llama layout: model.model.layers[i].self_attn.{q,k,v,o}_proj,
    model.model.norm; q_norm / k_norm per head where the family has them (Qwen3, Gemma 3)."""

    family = "llama"

    def __init__(self, model, attn_implementation: str | None = DEFAULT_ATTN):
        """attn_implementation: set the model's attention to it (None: keep the model's, as the training-time
        probe does)."""
        super().__init__(model)
        if attn_implementation is not None:
            model.set_attn_implementation(attn_implementation)
        self.model_type = model.config.model_type
        self.base = self._base()
        self.layers = list(self._layer_list())
        self.n_layers = len(self.layers)
        source = getattr(model.config, "_name_or_path", None) or f"the {self.model_type} model"
        dims = self.check_config(model.config, source)
        self.n_heads, self.n_kv_heads, self.head_dim, self.d_model = (
            dims[k] for k in ("n_heads", "n_kv_heads", "head_dim", "d_model"))
        self.context, self.context_name = dims["context"], "max_position_embeddings"
        self._check_weights(source)

    # where the config keeps each dimension (GPT-2 names them otherwise; None: none); an absent one takes the default
    FIELDS: dict[str, str | None] = {
        "n_heads": "num_attention_heads", "n_kv_heads": "num_key_value_heads", "head_dim": "head_dim",
        "d_model": "hidden_size", "context": "max_position_embeddings"}

    @classmethod
    def dims(cls, c) -> dict:
        """The attention's dimensions as the config states them (None where a field is absent)."""
        return {k: getattr(c, field, None) if field else None for k, field in cls.FIELDS.items()}

    @classmethod
    def check_config(cls, c, source: str) -> dict:
        """The model's structure checked where it loads, before any weight is read, so no tool meets it later:
        heads a multiple of the KV heads, a head size, a positive context. Returns the dimensions (defaults
        filled in); InspectError names the model, the fields' values and the fix."""
        d = cls.dims(c)
        if d["n_kv_heads"] is None:
            d["n_kv_heads"] = d["n_heads"]
        fix = "the model's config.json is damaged or describes a model transformers cannot run: restore it, or " \
              "pass another model"
        for key in ("n_heads", "n_kv_heads", "d_model"):
            value = d[key]
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InspectError(f"{source}: {cls.FIELDS[key]} = {shown(value, 40)} should be a whole number >= 1; "
                                   f"{fix}")
        n, kv = d["n_heads"], d["n_kv_heads"]
        if n % kv:
            raise InspectError(f"{source}: {cls.FIELDS['n_heads']} = {n} is not a multiple of "
                               f"{cls.FIELDS['n_kv_heads']} = {kv} (each key/value head serves the same number of "
                               f"query heads), so its attention cannot run; {fix}")
        if d["head_dim"] is None:
            if d["d_model"] % n:
                raise InspectError(f"{source}: {cls.FIELDS['d_model']} = {d['d_model']} is not divisible by "
                                   f"{cls.FIELDS['n_heads']} = {n}, and no head_dim is given, so a head has no "
                                   f"whole size; {fix}")
            d["head_dim"] = d["d_model"] // n
        elif isinstance(d["head_dim"], bool) or not isinstance(d["head_dim"], int) or d["head_dim"] < 1:
            raise InspectError(f"{source}: {cls.FIELDS['head_dim']} = {shown(d['head_dim'], 40)} should be a whole "
                               f"number >= 1; {fix}")
        ctx = d["context"]
        if ctx is not None and (isinstance(ctx, bool) or not isinstance(ctx, int) or ctx < 1):
            raise InspectError(f"{source}: {cls.FIELDS['context']} = {shown(ctx, 40)} should be the context length, a "
                               f"whole number >= 1; {fix}")
        return d

    def _check_weights(self, source: str) -> None:
        """Each layer's q and k projections hold heads x head_dim rows, as the config says."""
        for i in range(self.n_layers):
            w = self.qkvo(i)
            for m, heads in (("q", self.n_heads), ("k", self.n_kv_heads)):
                rows = w[m].shape[0]
                if rows != heads * self.head_dim:
                    raise InspectError(f"{source}: layer {i}'s {m} projection has {rows} rows, not {heads} heads x "
                                       f"head_dim {self.head_dim} = {heads * self.head_dim} as its config says: the "
                                       f"weights and config.json do not belong together; restore the model's "
                                       f"folder, or pass another model")

    def _base(self) -> nn.Module:
        return self.model.model

    def _layer_list(self):
        return self.base.layers

    def attn(self, i: int) -> nn.Module:
        return self.layers[i].self_attn

    def qkvo(self, i):
        a = self.attn(i)
        return {"q": a.q_proj.weight, "k": a.k_proj.weight, "v": a.v_proj.weight, "o": a.o_proj.weight}

    def qk_norms(self, i):
        a = self.attn(i)
        return getattr(a, "q_norm", None), getattr(a, "k_norm", None)

    def final_norm_module(self):
        return self.base.norm

    def output_embedding(self):
        return self.model.get_output_embeddings().weight

    def input_embedding(self):
        return self.model.get_input_embeddings().weight  # Gemma's forward scales it by sqrt(d_model)

    def forward(self, ids_BT):
        return self.model(input_ids=ids_BT, use_cache=False).logits

    # --- keys ------------------------------------------------------------------------------
    def key_projection(self, i: int) -> nn.Module:
        """The module whose output holds layer i's keys."""
        return self.attn(i).k_proj

    def keys_of(self, projected: torch.Tensor) -> torch.Tensor:
        """Keys [B, T, Hkv * D] from that module's output."""
        return projected

    def query_projection(self, i: int) -> nn.Module:
        """The module whose output holds layer i's queries (families with a q_norm)."""
        return self.attn(i).q_proj

    @torch.no_grad()
    def normed(self, norm: nn.Module, x_BTC: torch.Tensor, heads: int) -> torch.Tensor:
        """A q/k norm applied as the model applies it (per head) to a projection's output [B, T, heads * D]:
        [heads, B, T, D]. Computed from the projection, because families call the norm on different layouts."""
        B, T, _ = x_BTC.shape
        return heads_first(norm(x_BTC.reshape(B, T, heads, self.head_dim)))

    @contextmanager
    def capture(self, sink):
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS as registry
        index = {id(self.attn(i)): i for i in range(self.n_layers)}
        impl = getattr(self.model.config, "_attn_implementation", None) or "eager"
        local = registry._local_mapping  # transformers' per-instance overrides: the only way to restore exactly
        before = local.get(impl)
        plain = registry[impl] if impl in registry else None  # None: eager, which each model's file defines

        def attention(module, query, key, value, attention_mask, *args, **kwargs):
            own = plain or sys.modules[type(module).__module__].eager_attention_forward
            i = index.get(id(module))
            if i is None:  # another model of the process: untouched
                return own(module, query, key, value, attention_mask, *args, **kwargs)
            scaling = kwargs.get("scaling")
            out = sink.on_attention(i, query.detach(), key.detach(), value.detach(),
                                    query.shape[-1] ** -0.5 if scaling is None else scaling,
                                    kwargs.get("sliding_window"), kwargs.get("softcap"))
            if out is None:  # the model's own attention computes the output
                return own(module, query, key, value, attention_mask, *args, **kwargs)
            return out.to(query.dtype), None

        with self._hooks(sink) as handles:
            try:
                local[impl] = attention
                for i in range(self.n_layers):
                    q_norm, k_norm = self.qk_norms(i)

                    def k_hook(module, inp, out, i=i, k_norm=k_norm):
                        k = self.keys_of(out.detach())
                        B, T, _ = k.shape
                        sink.on_keys(i, "k_proj", heads_first(k.reshape(B, T, self.n_kv_heads, self.head_dim)))
                        if k_norm is not None:
                            sink.on_keys(i, "k_norm", self.normed(k_norm, k, self.n_kv_heads))
                    handles.append(self.key_projection(i).register_forward_hook(k_hook))
                    if q_norm is not None and hasattr(sink, "on_queries"):
                        handles.append(self.query_projection(i).register_forward_hook(
                            lambda m, inp, out, i=i, q_norm=q_norm: sink.on_queries(
                                i, "q_norm", self.normed(q_norm, out.detach(), self.n_heads))))
                yield
            finally:
                if before is None:
                    local.pop(impl, None)
                else:
                    local[impl] = before


class Qwen3Adapter(HFAdapter):
    family = "qwen3"


class ApertusAdapter(HFAdapter):
    """Apertus: per-head q_norm / k_norm before RoPE (the export of qk_norm learned/frozen runs)."""

    family = "apertus"


class ArceeAdapter(HFAdapter):
    """Arcee: Llama attention with a non-gated MLP (the export of qk_norm='none' runs)."""

    family = "arcee"


class Olmo2Adapter(HFAdapter):
    """OLMo 2 normalizes the whole key projection (all heads together), before the head split."""

    family = "olmo2"

    @torch.no_grad()
    def normed(self, norm, x_BTC, heads):
        B, T, _ = x_BTC.shape
        return heads_first(norm(x_BTC).reshape(B, T, heads, self.head_dim))


class Gemma3Adapter(HFAdapter):
    """Gemma 3 (text): RMSNorm gains act as 1 + weight; final logits are soft-capped."""

    family = "gemma3"
    gain_offset = 1.0

    def __init__(self, model, attn_implementation: str | None = DEFAULT_ATTN):
        super().__init__(model, attn_implementation)
        self.logit_softcap = getattr(model.config, "final_logit_softcapping", None)


class GPT2Adapter(HFAdapter):
    """GPT-2: model.transformer.h[i].attn with a fused Conv1D c_attn ([in, out] layout) and c_proj."""

    family = "gpt2"
    rotary_pairing = None  # learned absolute positions

    def _base(self):
        return self.model.transformer

    def _layer_list(self):
        return self.base.h

    # GPT-2 splits n_embd into n_head equal heads (no head_dim) and has no KV heads of its own
    FIELDS = {"n_heads": "n_head", "n_kv_heads": "n_head", "head_dim": None, "d_model": "n_embd",
              "context": "n_positions"}

    def attn(self, i):
        return self.layers[i].attn

    def qkvo(self, i):
        a = self.attn(i)
        q, k, v = a.c_attn.weight.T.split(self.d_model, dim=0)
        return {"q": q, "k": k, "v": v, "o": a.c_proj.weight.T}

    def qk_norms(self, i):
        return None, None

    def final_norm_module(self):
        return self.base.ln_f

    def attention_norm(self, i):
        return self.layers[i].ln_1

    def read_weights(self, i, m):
        """LayerNorm also subtracts the mean over d: the map reads (I - 11^T/d) x, so each row is
        centred. Its bias and c_attn's bias are constants, not directions, and are left out."""
        W = super().read_weights(i, m)
        return W - W.mean(-1, keepdim=True)

    def key_projection(self, i):
        return self.attn(i).c_attn

    def keys_of(self, projected):
        return projected[..., self.d_model:2 * self.d_model]


# model_type -> adapter. Tested: llama, qwen3, gemma3_text, gpt2, and apertus and arcee (tests/research/export);
# mistral, qwen2 and olmo2 share a tested layout and are accepted.
ADAPTERS: dict[str, type[HFAdapter]] = {
    "llama": HFAdapter, "mistral": HFAdapter, "qwen2": HFAdapter, "qwen3": Qwen3Adapter, "olmo2": Olmo2Adapter,
    "gemma3_text": Gemma3Adapter, "gpt2": GPT2Adapter, "apertus": ApertusAdapter, "arcee": ArceeAdapter}
