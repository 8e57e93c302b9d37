"""The interface every adapter fills in (docs/inspection.md says what it exposes): the model's
structure, its norms' gains, the query/key weights as maps of the residual stream, where RoPE rotates which key
dimensions, and the hooks that call back into a sink; InspectError, the error of every model that cannot be read."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch
import torch.nn as nn

from utils.errors import UserError

DEFAULT_ATTN = "sdpa"  # models loaded for inspection: PyTorch's fused attention, which every supported family has


class InspectError(UserError, RuntimeError):
    """A model that cannot be found, loaded or inspected; the message says why and what to do."""


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
    layers: list[nn.Module]
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_model: int
    # RoPE as data, so no other code assumes a convention: the first `rotary_dims` dims of each head's q and k are
    # rotated, the rest pass unrotated; rope_pairing says which of them turn together ("half": dim j with dim
    # j + rotary_dims / 2, transformers' rotate_half and this project's Rotary; None: no RoPE, rotary_dims 0)
    rope_pairing: str | None = "half"
    rotary_dims: int = 0
    norm_centres = False  # the norms are LayerNorms, which subtract the mean over d before the gain (GPT-2, GPT-NeoX)
    parallel_residual = False  # attention and MLP both read the layer's input stream, their outputs added (GPT-NeoX)

    def __init__(self, model: nn.Module):
        self.model = model

    # --- structure -------------------------------------------------------------------------
    def qkvo(self, i: int) -> dict[str, torch.Tensor]:
        """Layer i's q/k/v/o weights, [out, in]: views of the parameters where the layout allows, copies where it
        does not (GPT-NeoX's q, k and v, whose rows interleave by head in query_key_value)."""
        raise NotImplementedError

    def biases(self, i: int) -> dict[str, torch.Tensor | None]:
        """Layer i's q/k/v projection biases [heads * D] (None: no bias); the keys of `capture` include them."""
        return {"q": None, "k": None, "v": None}

    def qk_norms(self, i: int) -> tuple[nn.Module | None, nn.Module | None]:
        return None, None

    def gate_weight_norms(self, i: int) -> torch.Tensor | None:
        """The norm of each query head's rows of layer i's attention-output gate weight [H] (None: no gate)."""
        return None

    def value_norm(self, i: int) -> nn.Module | None:
        """The norm layer i applies to its values (Gemma 4's v_norm, an RMS norm without gain); None: none."""
        return None

    # --- per layer: one shape for every layer but in Gemma 4 (research/access/adapters/gemma4.py) ------------
    def head_dim_of(self, i: int) -> int:
        """Layer i's head size (Gemma 4's full-attention layers have larger heads than its sliding ones)."""
        return self.head_dim

    def kv_heads_of(self, i: int) -> int:
        """Layer i's key/value heads."""
        return self.n_kv_heads

    def rotary_dims_of(self, i: int) -> int:
        """How many of layer i's head dims RoPE pairs up (rotary_dims where every layer has one head size)."""
        return self.rotary_dims

    def rotary_split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Queries or keys [..., D] split into the dims RoPE rotates [..., rotary_dims] and those it leaves
        [..., D - rotary_dims] (views; a family without RoPE has all dims unrotated)."""
        return x[..., :self.rotary_dims], x[..., self.rotary_dims:]

    def layer_has_rope(self, i: int) -> bool:
        """Whether layer i rotates its queries and keys (SmolLM3 leaves every fourth layer without RoPE)."""
        return bool(self.rope_pairing) and self.rotary_dims_of(i) > 0

    def rotary_frequencies(self, i: int) -> torch.Tensor | None:
        """Layer i's RoPE angular frequencies [rotary_dims / 2], float32: pair j (rope_pairing) turns by
        position x f[j] radians. None where the adapter does not know them."""
        return None

    def layer_gains(self, i: int) -> dict[str, torch.Tensor]:
        """Effective gain vectors of the layer's own norms (not q/k norms), by module name."""
        out = {}
        for name, mod in self.layers[i].named_children():
            w = getattr(mod, "weight", None)
            if ("norm" in name or name.startswith("ln")) and isinstance(w, torch.Tensor) and w.dim() == 1:
                out[name] = w.detach().float() + self.gain_offset
        return out

    def gain(self, module: nn.Module | None) -> torch.Tensor | None:
        """A norm's effective gain: [D] shared by the heads, or [heads x D] (over the whole projection, OLMo 2; or
        one gain per head, this project's qk_gain_shape per_head and head_scalar, a head's scalar repeated D times)."""
        w = getattr(module, "weight", None) if module is not None else None
        if w is None:
            return None
        w = w.detach().float()
        if w.dim() == 2:  # [heads, D] or [heads, 1]: per head
            w = w.expand(w.shape[0], self.head_dim).reshape(-1)
        return w + self.gain_offset

    def final_norm_module(self) -> nn.Module:
        raise NotImplementedError

    def final_layer(self) -> nn.Module:
        """The module whose output is the residual stream's end, before the final norm (the last of `layers` but
        where the adapter's layers are some of the model's: Qwen3.5's full-attention ones)."""
        return self.layers[-1]

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
        q_norm / k_norm gain the rows; a LayerNorm's centring (norm_centres) centres each row. The norms'
        per-token 1/RMS factors are dropped: they scale a token's query or key, never the direction it reads."""
        W = self.qkvo(i)[m].detach().float()                                    # [H * D, d]
        g_in = self.gain(self.attention_norm(i))
        if g_in is not None:
            W = W * g_in[None, :]
        g_out = self.gain(self.qk_norms(i)[0 if m == "q" else 1])
        if g_out is not None:  # per head (size D, shared by the heads) or over the whole projection (OLMo 2)
            W = W * g_out.repeat(W.shape[0] // g_out.numel())[:, None]
        if self.norm_centres:  # LayerNorm reads (I - 11^T/d) x; its bias and the projection's are constants,
            W = W - W.mean(-1, keepdim=True)  # not directions, and are left out
        return W.reshape(-1, self.head_dim_of(i), W.shape[1])

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
        """Yields a list to append hook handles to; on_state hooks are registered already, and where the sink has
        on_norm(i, "q", "k" or "v", input, output) a hook on each q/k norm's (and value norm's) own call (the audit:
        whether it runs, and on what). Every handle is removed on exit, also when the forward raises."""
        handles = []
        try:
            for l, layer in enumerate(self.layers):
                def pre(module, args, kwargs, l=l):
                    sink.on_state(l, (args[0] if args else kwargs["hidden_states"]).detach())
                handles.append(layer.register_forward_pre_hook(pre, with_kwargs=True))
                norms = (*self.qk_norms(l), self.value_norm(l)) if hasattr(sink, "on_norm") else ()
                for which, norm in zip("qkv", norms):
                    if norm is not None:
                        handles.append(norm.register_forward_hook(
                            lambda m, args, out, l=l, which=which: sink.on_norm(l, which, args[0].detach(),
                                                                              _first(out).detach())))
            last = self.n_layers
            handles.append(self.final_layer().register_forward_hook(
                lambda module, args, out: sink.on_state(last, _first(out).detach())))
            yield handles
        finally:
            for h in handles:
                h.remove()


