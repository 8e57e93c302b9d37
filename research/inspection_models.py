"""Where things are inside a causal LM: one adapter per model family, and loading.

    model, tokenizer, adapter = load_model("path/or/hub-id")
    with adapter.capture(sink): adapter.forward(ids_BT)

An adapter exposes, uniformly across families: the decoder layers, per layer the
q/k/v/o weights in nn.Linear layout [out, in] (GPT-2's fused Conv1D c_attn is
transposed and split), the k_norm/q_norm gains where the model has them, the
per-layer norm gains (Gemma's RMSNorm multiplies by 1 + weight: the effective gain is
reported), the final norm and the output embedding. During `capture`, forward hooks
call back into a sink, layer by layer, with:

    sink.on_state(l, h_BTd)                         residual stream entering layer l (l = n_layers: leaving
                                                    the last layer, before the final norm)
    sink.on_keys(i, site, k_HBTD)                   keys of layer i at "k_proj" / "k_norm"
    sink.on_attention(i, q_BHTD, k_BKTD, v, scaling, window, softcap) -> output [B, T, H, Dv] or None

Attention of Hugging Face models: the model is switched, inside `capture` only, to an
attention implementation registered here that receives the post-RoPE q and k exactly
as the model's attention uses them (its own scaling, sliding window and soft-cap
arguments) and returns the output the sink computes eagerly, so the fused kernel is
never needed and no [T, T] matrix of all heads is kept. This project's MinimalLLM
gets q/k from its hook points (hook_q_rope, hook_k_rope) and keeps its own SDPA output.
"""
from __future__ import annotations

import json
import os
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import torch
import torch.nn as nn

from research.probe import heads_first


class InspectError(RuntimeError):
    """A model that cannot be found, loaded or inspected; the message says why and what to do."""


# model_type -> family. Tested: llama, qwen3, gemma3_text, gpt2 (and this project's own);
# the others share the Llama layout (q/k/v/o_proj, model.layers, model.norm) and are accepted.
HF_FAMILIES = {"llama": "llama", "mistral": "llama", "qwen2": "llama", "qwen3": "qwen3", "olmo2": "qwen3",
               "gemma3_text": "gemma3", "gpt2": "gpt2"}
_ATTN_IMPL = "research_inspect"
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


class Adapter:
    """Common interface; subclasses fill in the family specifics."""

    family = "?"
    gain_offset = 0.0  # Gemma RMSNorm: y = x_hat * (1 + w)
    logit_softcap: float | None = None

    def __init__(self, model: nn.Module):
        self.model = model

    # --- structure -------------------------------------------------------------------------
    layers: list[nn.Module]
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_model: int

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

    def final_norm(self, h: torch.Tensor) -> torch.Tensor:
        return self.final_norm_module()(h)

    def output_embedding(self) -> torch.Tensor:
        raise NotImplementedError

    def model_param_count(self) -> int:
        return self.model.num_parameters()

    def logits(self, h_BTd: torch.Tensor) -> torch.Tensor:
        """Final norm and output embedding (+ final soft-cap) of residual states, float32."""
        W = self.output_embedding()
        x = self.final_norm(h_BTd.to(W.dtype))
        z = (x @ W.T).float()
        if self.logit_softcap:
            z = torch.tanh(z / self.logit_softcap) * self.logit_softcap
        return z

    # --- running ---------------------------------------------------------------------------
    @contextmanager
    def capture(self, sink) -> Iterator[None]:
        raise NotImplementedError

    def forward(self, ids_BT: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    @contextmanager
    def _state_hooks(self, sink) -> Iterator[list]:
        """on_state for the input of each layer and the output of the last one."""
        handles = []
        try:
            for l, layer in enumerate(self.layers):
                def pre(module, args, kwargs, l=l):
                    h = args[0] if args else kwargs["hidden_states"]
                    sink.on_state(l, h.detach())
                handles.append(layer.register_forward_pre_hook(pre, with_kwargs=True))
            last = self.n_layers

            def post(module, args, out):
                sink.on_state(last, _first(out).detach())
            handles.append(self.layers[-1].register_forward_hook(post))
            yield handles
        finally:
            for h in handles:
                h.remove()


class OwnAdapter(Adapter):
    """This project's MinimalLLM (models/llm.py)."""

    family = "minimal_llm"

    def __init__(self, model):
        super().__init__(model)
        c = model.cfg
        self.layers = list(model.blocks)
        self.n_layers, self.n_heads, self.n_kv_heads = c.n_layers, c.n_heads, c.n_kv_heads
        self.head_dim, self.d_model = c.d_head, c.d_model
        self.model_type = f"MinimalLLM(qk_norm={c.qk_norm})"

    def qkvo(self, i):
        a = self.layers[i].attn
        return {"q": a.wq.weight, "k": a.wk.weight, "v": a.wv.weight, "o": a.wo.weight}

    def qk_norms(self, i):
        a = self.layers[i].attn
        return (a.q_norm if isinstance(a.q_norm, nn.Module) and hasattr(a.q_norm, "weight") else None,
                a.k_norm if hasattr(a.k_norm, "weight") else None)

    def final_norm_module(self):
        return self.model.final_norm

    def output_embedding(self):
        return self.model.embed.weight

    def model_param_count(self):
        return self.model.num_params()

    def forward(self, ids_BT):
        return self.model(ids_BT)

    @contextmanager
    def capture(self, sink):
        handles = []
        with self._state_hooks(sink):
            try:
                for i, block in enumerate(self.layers):
                    a = block.attn
                    scratch = {}

                    def k_proj(module, inp, out, i=i, a=a):
                        B, T, _ = out.shape
                        sink.on_keys(i, "k_proj", heads_first(out.view(B, T, a.n_kv_heads, a.d_head)))
                    handles.append(a.wk.register_forward_hook(k_proj))
                    if hasattr(a.k_norm, "weight"):
                        handles.append(a.hook_k_norm.register_forward_hook(
                            lambda m, inp, out, i=i: sink.on_keys(i, "k_norm", heads_first(out))))

                    def q_rope(m, inp, out, scratch=scratch):
                        scratch["q"] = out.detach().transpose(1, 2)  # [B, H, T, D]

                    def k_rope(m, inp, out, i=i, scratch=scratch, a=a):
                        q = scratch.pop("q")
                        sink.on_attention(i, q, out.detach().transpose(1, 2), None, a.d_head ** -0.5, None, None)
                    handles.append(a.hook_q_rope.register_forward_hook(q_rope))
                    handles.append(a.hook_k_rope.register_forward_hook(k_rope))
                yield
            finally:
                for h in handles:
                    h.remove()


class HFAdapter(Adapter):
    """Hugging Face causal LMs with the Llama layout (Llama, Mistral, Qwen2/3, OLMo 2, Gemma 3) or GPT-2."""

    def __init__(self, model, family: str):
        super().__init__(model)
        self.family = family
        c = model.config
        self.model_type = c.model_type
        if family == "gpt2":
            self.base = model.transformer
            self.layers = list(self.base.h)
            self.n_heads = self.n_kv_heads = c.n_head
            self.d_model = c.n_embd
            self.head_dim = c.n_embd // c.n_head
        else:
            self.base = model.model
            self.layers = list(self.base.layers)
            self.n_heads = c.num_attention_heads
            self.n_kv_heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
            self.d_model = c.hidden_size
            self.head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
        self.n_layers = len(self.layers)
        if family == "gemma3":
            self.gain_offset = 1.0
            self.logit_softcap = getattr(c, "final_logit_softcapping", None)

    def attn(self, i):
        return self.layers[i].attn if self.family == "gpt2" else self.layers[i].self_attn

    def qkvo(self, i):
        a = self.attn(i)
        if self.family == "gpt2":  # Conv1D stores [in, out]
            q, k, v = a.c_attn.weight.T.split(self.d_model, dim=0)
            return {"q": q, "k": k, "v": v, "o": a.c_proj.weight.T}
        return {"q": a.q_proj.weight, "k": a.k_proj.weight, "v": a.v_proj.weight, "o": a.o_proj.weight}

    def qk_norms(self, i):
        a = self.attn(i)
        return getattr(a, "q_norm", None), getattr(a, "k_norm", None)

    def final_norm_module(self):
        return self.base.ln_f if self.family == "gpt2" else self.base.norm

    def output_embedding(self):
        return self.model.get_output_embeddings().weight

    def forward(self, ids_BT):
        return self.model(input_ids=ids_BT, use_cache=False).logits

    @contextmanager
    def capture(self, sink):
        from transformers import AttentionInterface
        index = {id(self.attn(i)): i for i in range(self.n_layers)}

        def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0,
                      sliding_window=None, softcap=None, **kwargs):
            if scaling is None:
                scaling = query.shape[-1] ** -0.5
            out = sink.on_attention(index[id(module)], query.detach(), key.detach(), value.detach(),
                                    scaling, sliding_window, softcap)
            return out.to(query.dtype), None

        AttentionInterface.register(_ATTN_IMPL, attention)
        config = self.model.config
        previous = config._attn_implementation_internal
        handles = []
        with self._state_hooks(sink):
            try:
                config._attn_implementation_internal = _ATTN_IMPL
                for i in range(self.n_layers):
                    a = self.attn(i)
                    q_norm, k_norm = self.qk_norms(i)
                    proj = a.c_attn if self.family == "gpt2" else a.k_proj

                    def k_hook(module, inp, out, i=i, k_norm=k_norm):
                        out = out.detach()
                        B, T, _ = out.shape
                        if self.family == "gpt2":
                            out = out[..., self.d_model:2 * self.d_model]
                        sink.on_keys(i, "k_proj", heads_first(out.reshape(B, T, self.n_kv_heads, self.head_dim)))
                        if k_norm is not None:
                            if k_norm.weight.numel() == self.head_dim:  # per head (Qwen3, Gemma 3)
                                kn = k_norm(out.reshape(B, T, self.n_kv_heads, self.head_dim))
                            else:  # over the whole projection (OLMo 2)
                                kn = k_norm(out).reshape(B, T, self.n_kv_heads, self.head_dim)
                            sink.on_keys(i, "k_norm", heads_first(kn))
                    handles.append(proj.register_forward_hook(k_hook))
                yield
            finally:
                config._attn_implementation_internal = previous
                for h in handles:
                    h.remove()


# ----------------------------------------------------------------------------------------------
# Loading

def _load_own(path: Path, dtype: torch.dtype):
    from configs import RunConfig
    from models.llm import MinimalLLM
    from training.checkpoint import latest_checkpoint, load_model_weights
    cfg = RunConfig.load(path / "config.json")
    ckpt = latest_checkpoint(path / "checkpoints")
    if ckpt is None:
        raise InspectError(f"{path} is a training folder of this project but has no complete checkpoint under "
                           f"{path / 'checkpoints'} (train with --ckpt_every, or wait for the first checkpoint)")
    model = MinimalLLM(cfg.model)
    load_model_weights(ckpt.path, model)
    tok_dir = path / "tokenizer"
    if not tok_dir.is_dir():
        raise InspectError(f"{path} has no tokenizer/ folder: the logit lens and the prompt need it")
    from transformers import AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    model = model.to(dtype).eval()
    adapter = OwnAdapter(model)
    adapter.source = f"{path} (checkpoint step {ckpt.step})"
    return model, tokenizer, adapter


_HUB_TIMEOUT_S = 5.0


def _hub_host() -> str:
    from urllib.parse import urlparse
    return urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname or "huggingface.co"


def _hub_reachable() -> bool:
    """A TCP connection to the hub within _HUB_TIMEOUT_S (DNS included), so no network fails fast
    instead of waiting through the hub client's retries."""
    import socket
    import threading
    ok = []

    def probe():
        try:
            socket.create_connection((_hub_host(), 443), timeout=_HUB_TIMEOUT_S).close()
            ok.append(True)
        except OSError:
            pass
    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(_HUB_TIMEOUT_S)
    return bool(ok)


def _is_own_run(path: Path) -> bool:
    try:
        d = json.loads((path / "config.json").read_text())
    except (OSError, json.JSONDecodeError):
        return False
    return isinstance(d, dict) and {"model", "train", "data"} <= set(d)


def load_model(name: str, dtype: str = "float32"):
    """(model, tokenizer, adapter) for a local HF folder, a training folder of this project, or a hub id."""
    if dtype not in _DTYPES:
        raise InspectError(f"dtype {dtype!r}: choose one of {', '.join(_DTYPES)}")
    torch_dtype = _DTYPES[dtype]
    path = Path(name).expanduser()
    if path.is_dir() and _is_own_run(path):
        return _load_own(path, torch_dtype)
    local = path.exists()
    looks_like_hub_id = (not local and not name.startswith((".", "/", "~")) and name.count("/") <= 1
                         and "\\" not in name)
    if not local and not looks_like_hub_id:
        raise InspectError(f"model {name!r} not found: no such folder, and it is not a hub id (owner/name)")
    if local and not (path / "config.json").is_file():
        raise InspectError(f"{path} has no config.json: expected a Hugging Face model folder "
                           f"(save_pretrained) or a training folder written by train_llm.py")
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    use_local = True
    try:
        # Local folder or the local cache first; the network only after a fast reachability check.
        config = AutoConfig.from_pretrained(str(path) if local else name, local_files_only=True)
    except Exception as e:  # noqa: BLE001 - hub/IO errors have many types; re-raise with the cause
        if local:
            raise InspectError(f"cannot read the config of {path}: {e}") from e
        try:
            if offline:
                raise e
            if not _hub_reachable():
                raise ConnectionError(f"cannot reach {_hub_host()} within {_HUB_TIMEOUT_S:.0f} s")
            config = AutoConfig.from_pretrained(name)
            use_local = False
        except Exception as e2:  # noqa: BLE001
            raise InspectError(f"model {name!r} is neither a local folder nor in the local Hugging Face cache, "
                               f"and fetching it from the hub failed ({type(e2).__name__}: {e2}). Without a "
                               f"network, pass a local folder (save_pretrained) or a train_llm.py output "
                               f"folder.") from e2
    family = HF_FAMILIES.get(config.model_type)
    if family is None:
        raise InspectError(f"unsupported architecture {config.model_type!r} "
                           f"({', '.join(getattr(config, 'architectures', None) or [])}): supported model types are "
                           f"{', '.join(sorted(HF_FAMILIES))} and this project's train_llm.py checkpoints")
    src = str(path) if local else name
    try:
        model = AutoModelForCausalLM.from_pretrained(src, dtype=torch_dtype, local_files_only=use_local)
        tokenizer = AutoTokenizer.from_pretrained(src, local_files_only=use_local)
    except Exception as e:  # noqa: BLE001
        raise InspectError(f"cannot load the weights or tokenizer of {src} ({type(e).__name__}: {e})") from e
    model.eval()
    adapter = HFAdapter(model, family)
    adapter.source = src
    return model, tokenizer, adapter
