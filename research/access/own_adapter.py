"""The adapter of this project's own MinimalLLM (models/llm.py): its layers, weights and norms, and its keys and
queries from its hook points (research/access/adapters/ has the interface and the Hugging Face families)."""
from __future__ import annotations

from contextlib import contextmanager

from research.access.adapters import Adapter
from utils.tensors import heads_first


class OwnAdapter(Adapter):
    """This project's MinimalLLM (models/llm.py)."""

    family = "minimal_llm"

    def __init__(self, model):
        super().__init__(model)
        c = model.cfg
        self.layers = list(model.blocks)
        self.n_layers, self.n_heads, self.n_kv_heads = c.n_layers, c.n_heads, c.n_kv_heads
        self.head_dim, self.d_model = c.d_head, c.d_model
        # models.layers.Rotary pairs every dim, (i, i + D/2); with rope_fraction < 1 the later pairs have frequency 0
        self.rotary_dims, self.rope_pairing = c.d_head, model.rotary.pairing
        self.model_type = f"MinimalLLM(qk_norm={c.qk_norm})"
        self.context, self.context_name = c.max_seq_len, "max_seq_len of the run"

    def rotary_frequencies(self, i):
        return self.model.rotary.frequencies().float()  # [D/2]: 0 for a pair that does not rotate (rope_fraction)

    def qkvo(self, i):
        a = self.layers[i].attn
        return {"q": a.wq.weight, "k": a.wk.weight, "v": a.wv.weight, "o": a.wo.weight}

    def qk_norms(self, i):
        a = self.layers[i].attn
        return tuple(m if hasattr(m, "weight") else None for m in (a.q_norm, a.k_norm))  # qk_norm='none': Identity

    def gate_weight_norms(self, i):
        wg = getattr(self.layers[i].attn, "wg", None)  # [H x (D or 1), d]
        return None if wg is None else wg.weight.detach().float().reshape(self.n_heads, -1).norm(dim=1)

    def final_norm_module(self):
        return self.model.final_norm

    def output_embedding(self):
        return self.model.embed.weight

    def input_embedding(self):
        return self.model.embed.weight  # tied; the forward multiplies it by sqrt(d_model)

    def attention_norm(self, i):
        return self.layers[i].attn_norm

    def model_param_count(self):
        return self.model.num_params()

    def forward(self, ids_BT):
        return self.model(ids_BT)

    @contextmanager
    def capture(self, sink):
        """The Adapter's callbacks from the model's hook points; also on_queries "q_proj" where a layer has no q norm
        and, where the sink has on_gate, gated attention's sigmoid gate [H, B, T, D or 1]. on_attention's v is the
        values [B, Hkv, T, D]; the model's own attention computes the output (on_attention's return is unread).
        A sink that sets `projections = False` gets no k_proj beside a k norm, and `values = False` v = None: what it
        does not read is not held (the training probe's memory and time)."""
        queries, gates = hasattr(sink, "on_queries"), hasattr(sink, "on_gate")
        projections, values = getattr(sink, "projections", True), getattr(sink, "values", True)
        with self._hooks(sink) as handles:
            for i, block in enumerate(self.layers):
                a = block.attn
                q_norm, k_norm = self.qk_norms(i)
                scratch = {}

                def keep(name, scratch=scratch):
                    def hook(m, inp, out):
                        scratch[name] = out.detach().transpose(1, 2)  # [B, H, T, D]
                    return hook

                def k_proj(module, inp, out, i=i, a=a):
                    B, T, _ = out.shape
                    sink.on_keys(i, "k_proj", heads_first(out.view(B, T, a.n_kv_heads, a.d_head)))
                if gates and hasattr(a, "hook_gate"):  # fires first
                    handles.append(a.hook_gate.register_forward_hook(
                        lambda m, inp, out, i=i: sink.on_gate(i, heads_first(out))))
                if projections or k_norm is None:  # without a k norm the projection is the keys before RoPE
                    handles.append(a.wk.register_forward_hook(k_proj))
                if values:
                    handles.append(a.hook_v.register_forward_hook(keep("v")))
                if k_norm is not None:
                    handles.append(a.hook_k_norm.register_forward_hook(
                        lambda m, inp, out, i=i: sink.on_keys(i, "k_norm", heads_first(out))))
                if queries:
                    site = "q_proj" if q_norm is None else "q_norm"
                    handles.append(a.hook_q_norm.register_forward_hook(
                        lambda m, inp, out, i=i, site=site: sink.on_queries(i, site, heads_first(out))))
                handles.append(a.hook_q_rope.register_forward_hook(keep("q")))

                def k_rope(m, inp, out, i=i, scratch=scratch, a=a):
                    sink.on_attention(i, scratch.pop("q"), out.detach().transpose(1, 2), scratch.pop("v", None),
                                      a.scale, None, a.softcap or None)
                handles.append(a.hook_k_rope.register_forward_hook(k_rope))
                if hasattr(sink, "on_output"):  # the attention's output (times the gate), as wo reads it
                    handles.append(a.wo.register_forward_pre_hook(
                        lambda m, args, i=i, a=a: sink.on_output(i, args[0].detach().unflatten(-1, (a.n_heads, -1)))))
            yield
