"""HFAdapter: Hugging Face causal LMs with the Llama layout (the families llama, mistral and qwen2 read it unchanged),
and what every Hugging Face family shares: the config's dimensions checked where a model loads, and `capture`, which
wraps the attention function of the model's own implementation (docs/inspection.md)."""
from __future__ import annotations

import sys
from contextlib import contextmanager

import torch
import torch.nn as nn

from research.access.adapters.base import DEFAULT_ATTN, Adapter, InspectError, _first
from utils.errors import shown
from utils.tensors import heads_first


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
        self.rotary_dims = self._rotary_dims()
        self._check_weights(source)

    def _rotary_dims(self) -> int:
        """How many of each head's dims RoPE rotates: all of them in the Llama layout."""
        return self.head_dim

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
            w, D = self.qkvo(i), self.head_dim_of(i)
            for m, heads in (("q", self.n_heads), ("k", self.kv_heads_of(i))):
                rows = w[m].shape[0]
                if rows != heads * D:
                    raise InspectError(f"{source}: layer {i}'s {m} projection has {rows} rows, not {heads} heads x "
                                       f"head_dim {D} = {heads * D} as its config says. Fix: "
                                       f"restore the model's folder (weights and config.json of one model)")

    def _base(self) -> nn.Module:
        return self.model.model

    def _layer_list(self):
        return self.base.layers

    def attn(self, i: int) -> nn.Module:
        return self.layers[i].self_attn

    def qkvo(self, i):
        a = self.attn(i)
        return {"q": a.q_proj.weight, "k": a.k_proj.weight, "v": a.v_proj.weight, "o": a.o_proj.weight}

    def biases(self, i):
        a = self.attn(i)
        return {m: getattr(getattr(a, f"{m}_proj"), "bias", None) for m in "qkv"}  # Qwen2 has them

    def qk_norms(self, i):
        a = self.attn(i)
        return getattr(a, "q_norm", None), getattr(a, "k_norm", None)

    def rotary_frequencies(self, i):
        """The model's own inverse frequencies (its rotary_emb's buffer; Gemma 3 keeps one per layer type)."""
        emb = getattr(self.base, "rotary_emb", None)
        kinds = getattr(self.model.config, "layer_types", None)
        f = getattr(emb, f"{kinds[i]}_inv_freq", None) if kinds else None
        f = getattr(emb, "inv_freq", None) if f is None else f
        return None if f is None else f.detach().float()

    def final_norm_module(self):
        return self.base.norm

    def output_embedding(self):
        return self.model.get_output_embeddings().weight

    def input_embedding(self):
        return self.model.get_input_embeddings().weight  # Gemma's forward scales it by sqrt(d_model)

    def forward(self, ids_BT):
        return self.model(input_ids=ids_BT, use_cache=False).logits

    # --- keys ------------------------------------------------------------------------------
    def key_projection(self, i: int) -> nn.Module | None:
        """The module whose output holds layer i's keys (None: the layer reads another's, Gemma 4's KV sharing)."""
        return self.attn(i).k_proj

    def keys_of(self, projected: torch.Tensor) -> torch.Tensor:
        """Keys [B, T, Hkv * D] from that module's output."""
        return projected

    def query_projection(self, i: int) -> nn.Module:
        """The module whose output holds layer i's queries (families with a q_norm)."""
        return self.attn(i).q_proj

    def queries_of(self, projected: torch.Tensor) -> torch.Tensor:
        """Queries [B, T, H * D] from that module's output (Qwen3.5's holds each head's output gate too)."""
        return projected

    @torch.no_grad()
    def normed(self, norm: nn.Module, x_BTC: torch.Tensor, heads: int) -> torch.Tensor:
        """A q/k norm applied as the model applies it (per head) to a projection's output [B, T, heads * D]:
        [heads, B, T, D]. Computed from the projection, because families call the norm on different layouts."""
        B, T, _ = x_BTC.shape
        return heads_first(norm(x_BTC.reshape(B, T, heads, -1)))

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
                result = own(module, query, key, value, attention_mask, *args, **kwargs)
                if hasattr(sink, "on_output"):
                    sink.on_output(i, _first(result).detach())                    # [B, T, Hq, Dv]
                return result
            return out.to(query.dtype), None

        projections = getattr(sink, "projections", True)  # as OwnAdapter.capture: no k_proj beside a k norm if False
        with self._hooks(sink) as handles:
            try:
                local[impl] = attention
                for i in range(self.n_layers):
                    q_norm, k_norm = self.qk_norms(i)
                    heads = self.kv_heads_of(i)

                    def k_hook(module, inp, out, i=i, k_norm=k_norm, heads=heads):
                        k = self.keys_of(out.detach())
                        B, T, _ = k.shape
                        if projections or k_norm is None:  # without a k norm the projection is the key before RoPE
                            sink.on_keys(i, "k_proj", heads_first(k.reshape(B, T, heads, -1)))
                        if k_norm is not None and not hasattr(sink, "on_norm"):  # on_norm: the norm's own output
                            sink.on_keys(i, "k_norm", self.normed(k_norm, k, heads))
                    if self.key_projection(i) is not None:
                        handles.append(self.key_projection(i).register_forward_hook(k_hook))
                    if q_norm is not None and hasattr(sink, "on_queries"):
                        handles.append(self.query_projection(i).register_forward_hook(
                            lambda m, inp, out, i=i, q_norm=q_norm: sink.on_queries(
                                i, "q_norm", self.normed(q_norm, self.queries_of(out.detach()), self.n_heads))))
                yield
            finally:
                if before is None:
                    local.pop(impl, None)
                else:
                    local[impl] = before


