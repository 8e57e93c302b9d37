"""Each check of one layer: what runs (research/audit/norms.py, rope.py, scale.py on the tensors AuditSink kept)
against what the config declares (declared.py), ending "as declared", "differs" or "not measurable", with a sentence
that says what runs and what the config says. The tolerances and why: docs/audit.md.

    findings = layer_checks(adapter, i, layer, declared(adapter, i), tol=TOLERANCE, checkpoint=None)
"""
from __future__ import annotations

import math

import torch

from research.audit.declared import Declared
from research.audit.norms import measure_norm
from research.audit.rope import fit_theta, measure_rope
from research.audit.scale import measure_scale

AS_DECLARED, DIFFERS, NOT_MEASURABLE = "as declared", "differs", "not measurable"
# fp32: float32 rounding of the model's own arithmetic, with room; bf16: its 8-bit mantissa (2^-8 = 0.4%)
# The audit loads and runs every model in float32, whatever the host's --precision auto would pick, so these hold on
# every CPU. angle: the total turn (radians) over the batch's positions below which a pair's frequency is unresolved.
TOLERANCE = {"rms": 1e-4, "gain": 1e-3, "pair_norm": 1e-4, "frequency": 1e-3, "angle": 2e-5, "scale": 1e-3, "fit": 1e-3}


def finding(i: int, check: str, status: str, text: str, **numbers) -> dict:
    return {"layer": i, "check": check, "status": status, "text": text, **numbers}


def _heads_first(y: torch.Tensor, heads: int, T: int) -> torch.Tensor:
    """A norm's output in the layout its family calls it on, [B, T, heads, D], [B, heads, T, D] (Gemma 3, after
    the head transpose) or [B, T, heads * D] (OLMo 2, the whole projection) -> [heads, B, T, D]."""
    if y.dim() == 4 and y.shape[1] == heads and y.shape[2] == T and (y.shape[1] != T or heads == T):
        return y.transpose(0, 1)
    return y.reshape(y.shape[0], T, heads, -1).permute(2, 0, 1, 3)


def _eps(norm) -> float:
    for name in ("eps", "variance_epsilon", "epsilon"):
        if isinstance(getattr(norm, name, None), (int, float)):
            return float(getattr(norm, name))
    return 1e-6


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(((a.double() - b.double()).abs() / b.double().abs().clamp_min(1e-12)).amax())


def norm_check(adapter, i: int, which: str, layer: dict, d: Declared, tol: dict,
               checkpoint: dict[str, torch.Tensor] | None) -> dict:
    """The q, k or v ("v": Gemma 4's value norm, no gain) norm of layer i: it runs, normalizes, with its gain."""
    name = f"{which}_norm"
    module = adapter.value_norm(i) if which == "v" else adapter.qk_norms(i)["qk".index(which)]
    declared, ran = d.v_norm if which == "v" else d.norms["qk".index(which)], which in layer["norm"]
    if not declared and not ran:
        return finding(i, name, AS_DECLARED, "no norm declared, none runs")
    if not ran:
        return finding(i, name, DIFFERS, f"differs: runs no {which} norm, config says one runs (built, never called)")
    if not declared:
        return finding(i, name, DIFFERS, f"differs: runs a {which} norm, config declares none")
    x, y = layer["norm"][which]
    m = _measured(adapter, module, x, y, layer.get(which))
    if not _normalizes(m, tol):
        heads = _heads_apart(x, y, _eps(module), layer.get(which), tol)
        where = f" in head{'s' * (len(heads[0]) > 1)} {', '.join(map(str, heads[0]))} of {heads[1]}" if heads else ""
        return finding(i, name, DIFFERS, f"differs{where}: output / gain has RMS {m['rms']:.5f}, an RMS norm gives "
                                         f"{m['expected_rms']:.5f} (fit error {m['fit_error']:.1e})", rms=m["rms"])
    g = m["gain"]
    if which == "v":  # no gain: the norm's output / its input's RMS is 1 in every dim
        if _rel(g, torch.ones_like(g)) > tol["gain"]:
            return finding(i, name, DIFFERS, f"differs: runs gain {_gain_text(g)}, the value norm has none",
                           rms=m["rms"])
        return finding(i, name, AS_DECLARED, f"runs; RMS of output {m['rms']:.5f} (an RMS norm: "
                                             f"{m['expected_rms']:.5f}), no gain", rms=m["rms"])
    own = adapter.gain(module)
    other = adapter.gain(adapter.qk_norms(i)[1 - "qk".index(which)])
    if own is not None and _rel(g, own) > tol["gain"]:
        swapped = other is not None and other.shape == g.shape and _rel(g, other) <= tol["gain"]
        return finding(i, name, DIFFERS, "differs: runs the " + ("other norm's gain (q and k swapped)" if swapped
                                                                 else "gain " + _gain_text(g)) +
                       f", the module holds {_gain_text(own)}", rms=m["rms"])
    if checkpoint is not None:
        stored = checkpoint.get(f"{i}.{which}")
        if stored is None:
            return finding(i, name, NOT_MEASURABLE, "runs; gain not in the checkpoint file to compare", rms=m["rms"])
        stored = stored.double() + adapter.gain_offset
        if _rel(g, stored) > tol["gain"]:
            other_name = "qk"[1 - "qk".index(which)]
            twin = checkpoint.get(f"{i}.{other_name}")
            if twin is not None and twin.shape == g.shape and \
                    _rel(g, twin.double() + adapter.gain_offset) <= tol["gain"]:
                return finding(i, name, DIFFERS, f"differs: runs the checkpoint's {other_name} norm gain (q and k "
                                                 f"swapped)", rms=m["rms"])
            return finding(i, name, DIFFERS, f"differs: runs gain {_gain_text(g)}, the checkpoint holds "
                                             f"{_gain_text(stored)}", rms=m["rms"])
    return finding(i, name, AS_DECLARED, f"runs; RMS of output / gain {m['rms']:.5f} (an RMS norm: "
                                         f"{m['expected_rms']:.5f}), gain "
                                         f"{'the checkpoint' if checkpoint is not None else 'the module'}'s",
                   rms=m["rms"])


def _measured(adapter, module, x: torch.Tensor, y: torch.Tensor, attended) -> dict:
    """measure_norm of a norm's call; where the module holds a gain per head (this project's qk_gain_shape per_head
    or head_scalar), each head's measured alone and the gains joined head by head ([heads x D], as Adapter.gain)."""
    eps, w = _eps(module), getattr(module, "weight", None)
    if w is None or w.dim() != 2 or x.dim() != 4 or attended is None:
        return measure_norm(x, y, eps)
    H, T = w.shape[0], attended.shape[2]
    xh, yh = _heads_first(x, H, T), _heads_first(y, H, T)
    each = [measure_norm(xh[h], yh[h], eps) for h in range(H)]
    return {"gain": torch.cat([m["gain"] for m in each]), "rms": float(sum(m["rms"] for m in each) / H),
            "expected_rms": float(sum(m["expected_rms"] for m in each) / H),
            "fit_error": max(m["fit_error"] for m in each)}


def _normalizes(m: dict, tol: dict) -> bool:
    return abs(m["rms"] - m["expected_rms"]) <= tol["rms"] and m["fit_error"] <= tol["fit"]


def _heads_apart(x, y, eps: float, attended, tol: dict) -> tuple[list[int], int] | None:
    """Where a per-head norm ([4-D] input, its heads as the attention's q or k has them) fails over the layer: the
    heads it fails on, each measured alone, and the head count; None where every head fails alike (or the norm
    spans the whole projection)."""
    if x.dim() != 4 or attended is None:
        return None
    H, T = attended.shape[0], attended.shape[2]
    xh, yh = _heads_first(x, H, T), _heads_first(y, H, T)
    bad = [h for h in range(H) if not _normalizes(measure_norm(xh[h], yh[h], eps), tol)]
    return (bad, H) if 0 < len(bad) < H else None


def _gain_text(g: torch.Tensor) -> str:
    g = g.double()
    if torch.allclose(g, torch.ones_like(g)):
        return "all ones"
    return f"mean {float(g.mean()):.4g} (min {float(g.min()):.4g}, max {float(g.max()):.4g})"


def rope_check(adapter, i: int, layer: dict, d: Declared, tol: dict) -> dict:
    if "k" not in layer:
        return finding(i, "rope", NOT_MEASURABLE, "not measurable here: the attention call was not seen")
    post = layer["k"]
    pre = _heads_first(layer["norm"]["k"][1], post.shape[0], post.shape[2]) if "k" in layer["norm"] else \
        layer.get("k_proj")
    if pre is None or pre.shape != post.shape:
        return finding(i, "rope", NOT_MEASURABLE, "not measurable here: no keys before rotation of the "
                                                  "attention's shape")
    if d.rope is None:
        moved = float((post - pre).abs().amax() / pre.abs().amax().clamp_min(1e-30))
        return finding(i, "rope", AS_DECLARED if moved <= tol["pair_norm"] else DIFFERS,
                       "no RoPE declared, keys unrotated" if moved <= tol["pair_norm"] else
                       f"differs: keys change between projection and attention (by {moved:.2e}), no RoPE declared")
    K = post.shape[0]
    pooled = _rope_finding(i, pre, post, d.rope, tol)
    if pooled["status"] != DIFFERS or K == 1:
        return pooled
    heads = [_rope_finding(i, pre[h:h + 1], post[h:h + 1], d.rope, tol) for h in range(K)]
    bad = [h for h, f in enumerate(heads) if f["status"] == DIFFERS]
    if not 0 < len(bad) < K:  # every KV head alike: the layer's finding
        return pooled
    first = heads[bad[0]]
    said = first["text"].removeprefix("differs: ")
    return {**first, "text": f"differs in KV head{'s' * (len(bad) > 1)} {', '.join(map(str, bad))} of {K}: {said}"}


def _rope_finding(i: int, pre: torch.Tensor, post: torch.Tensor, r, tol: dict) -> dict:
    """The RoPE check of keys before and after rotation [heads, B, T, D] against the declared Rope r."""
    m = measure_rope(pre, post, r.rotated_dims)
    if m["norm_error"] > tol["pair_norm"]:
        return finding(i, "rope", DIFFERS, f"differs: no pairing keeps every pair's norm (best {m['pairing']}, "
                                           f"error {m['norm_error']:.1e}); config pairs {r.pairing}")
    if m["pairing"] != r.pairing:
        return finding(i, "rope", DIFFERS, f"differs: runs pairing {_pairing_text(m['pairing'], pre.shape[-1])}, "
                                           f"config says {_pairing_text(r.pairing, pre.shape[-1])}")
    f, want = m["frequency"].double(), r.frequency.double()
    T = post.shape[2] - 1
    resolved = tol["angle"] / T                                 # the smallest frequency the positions resolve
    clear = want > 100 * resolved                               # the pairs the θ fit reads
    theta_fit = fit_theta(f, r.denominator, clear)[0] if r.theta else None
    numbers = {"theta": theta_fit, "scaling": m["scaling"]}
    live = m["energy"] > 1e-6 * m["energy"].amax()              # a pair the keys leave empty (gain 0) has no phase
    clear &= live
    turning, turns = (want > resolved) & live, (f.abs() > resolved) & live
    if (turns != turning).any():
        return finding(i, "rope", DIFFERS, f"differs: {int(turns.sum())} pairs turn, config says "
                                           f"{int(turning.sum())} ({r.rotated_dims} of {pre.shape[-1]} dims)",
                       **numbers)
    off = (f - want).abs() - resolved
    worst = float((off[turning] / want[turning]).amax()) if turning.any() else 0.0
    if worst <= tol["frequency"]:
        ladder = f"θ fitted {theta_fit:.6g}, " if theta_fit else ""
        raw = float(((f - want).abs()[clear] / want[clear]).amax()) if clear.any() else 0.0
        return finding(i, "rope", AS_DECLARED, f"runs {r.pairing} pairs, {ladder}frequencies within "
                                               f"{raw:.1e} of the config's", **numbers)
    if r.theta is None:
        return finding(i, "rope", DIFFERS, f"differs: frequencies off the config's ({r.kind}) by up to "
                                           f"{worst:.1%}", **numbers)
    D, R = pre.shape[-1], r.rotated_dims
    for den, name in ((D, f"head_dim {D}"), (R, f"rotary dims {R}")):
        alt = fit_theta(f, den, clear)[0]
        if den != r.denominator and alt and abs(alt / r.theta - 1) < 0.01:
            return finding(i, "rope", DIFFERS, f"differs: frequencies are θ {r.theta:g} over {name}, config "
                                               f"implies the denominator {r.denominator}", **numbers)
    return finding(i, "rope", DIFFERS, f"differs: runs θ {theta_fit:.6g} (over {r.denominator} dims), config says "
                                       f"θ {r.theta:g}", **numbers)


def _pairing_text(name: str, D: int) -> str:
    if name == "interleaved":
        return "interleaved (2j, 2j+1)"
    R = D if name == "half" else int(name.split("_")[1])
    return f"half-split (j, j+{R // 2}) over {R} of {D} dims"


def scale_checks(i: int, layer: dict, d: Declared, tol: dict) -> list[dict]:
    if "out" not in layer or layer.get("v") is None:
        why = "not measurable here: the attention's output was not seen (its own attention function?)"
        return [finding(i, "scale", NOT_MEASURABLE, why)]
    q, k, v, out = layer["q"], layer["k"], layer["v"], layer["out"]
    T = min(q.shape[2], layer["window"] or q.shape[2])
    fit = measure_scale(q[:, :, :T], k[:, :, :T], v[:, :, :T], out[:, :, :T], cap=d.softcap)
    if fit is None:
        return [finding(i, "scale", NOT_MEASURABLE, "not measurable here: too few positions to solve weights")]
    out_ = []
    scale, resid = fit["scale"], fit["residual"]
    if d.softcap:
        capped = fit["capped_residual"] < fit["residual"] and fit["capped_residual"] <= tol["fit"]
        if fit["logit_peak"] < 0.3:
            out_.append(finding(i, "softcap", NOT_MEASURABLE, f"not measurable here: logits reach "
                                                              f"{fit['logit_peak']:.0%} of the cap {d.softcap:g}"))
        elif capped:
            out_.append(finding(i, "softcap", AS_DECLARED, f"runs cap {d.softcap:g} (logits reach "
                                                           f"{fit['logit_peak']:.0%} of it)"))
        else:
            out_.append(finding(i, "softcap", DIFFERS, f"differs: no soft-cap runs (logits reach "
                                                       f"{fit['logit_peak']:.0%} of the cap), config says "
                                                       f"{d.softcap:g}"))
        if capped:
            scale, resid = fit["capped_scale"], fit["capped_residual"]
    if resid > tol["fit"] and not (d.softcap and out_[-1]["status"] == DIFFERS):
        out_.insert(0, _per_head(i, q[:, :, :T], k[:, :, :T], v[:, :, :T], out[:, :, :T], d, tol, resid))
        return out_
    ok = abs(scale / d.scale - 1) <= tol["scale"]
    out_.insert(0, finding(i, "scale", AS_DECLARED if ok else DIFFERS,
                           f"{'runs' if ok else 'differs: runs'} scale {_scale_text(scale)}"
                           + ("" if ok else f", config says {_scale_text(d.scale)}"), scale=scale))
    return out_


def _per_head(i: int, q, k, v, out, d: Declared, tol: dict, resid: float) -> dict:
    """Where a layer's heads do not follow one scale together: each query head's own fit (with its KV head). The
    heads whose scale is not the config's are named; "not measurable" where some head follows no one scale."""
    G = q.shape[0] // k.shape[0]
    fits = [measure_scale(q[h:h + 1], k[h // G:h // G + 1], v[h // G:h // G + 1], out[h:h + 1]) for h in
            range(q.shape[0])]
    if any(f is None or f["residual"] > tol["fit"] for f in fits):
        return finding(i, "scale", NOT_MEASURABLE, f"not measurable here: weights do not follow one scale "
                                                   f"(residual {resid:.1e}), not even head by head")
    off = [(h, f["scale"]) for h, f in enumerate(fits) if abs(f["scale"] / d.scale - 1) > tol["scale"]]
    if not off:
        return finding(i, "scale", AS_DECLARED, f"runs scale {_scale_text(d.scale)} in every head (fitted head by "
                                                f"head)", scale=fits[0]["scale"])
    heads = ", ".join(f"head {h} runs {_scale_text(s)}" for h, s in off)
    return finding(i, "scale", DIFFERS, f"differs: {heads}, config says {_scale_text(d.scale)}", scale=off[0][1])


def _scale_text(s: float) -> str:
    inv = 1 / (s * s) if s > 0 else math.inf
    near = round(inv)
    return f"{s:.4g} (1/sqrt({near}))" if near >= 1 and abs(inv - near) < 1e-3 * near and near != 1 else f"{s:.4g}"


def shared_checks(i: int, layer: dict, source: dict | None, d: Declared, tol: dict) -> list[dict]:
    """A KV-shared layer (d.kv_from: Gemma 4's last layers): it attends with the keys and values of layer
    d.kv_from, where their norms and RoPE are checked; here, that they are those tensors."""
    j, said = d.kv_from, f"none here: it reads layer {d.kv_from}'s keys (KV sharing), checked there"
    out = [finding(i, "k_norm", AS_DECLARED, said), finding(i, "rope", AS_DECLARED, said.replace("none here: ", ""))]
    if "k" not in layer or source is None or "k" not in source:
        return out + [finding(i, "kv_share", NOT_MEASURABLE, "not measurable here: the attention call was not seen")]
    same = all(layer[x] is not None and source.get(x) is not None and layer[x].shape == source[x].shape
               and float((layer[x] - source[x]).abs().amax()) <= tol["pair_norm"] * float(source[x].abs().amax())
               for x in ("k", "v"))
    return out + [finding(i, "kv_share", AS_DECLARED if same else DIFFERS,
                          f"attends with layer {j}'s keys and values, as declared" if same else
                          f"differs: attends with keys or values that are not layer {j}'s, config shares them")]


def k_eq_v_check(i: int, layer: dict, d: Declared, tol: dict) -> list[dict]:
    """Where the config declares K = V (Gemma 4's attention_k_eq_v): the value norm reads the key projection."""
    if not d.k_eq_v or d.kv_from is not None:
        return []
    if "v" not in layer["norm"] or "k_proj" not in layer:
        return [finding(i, "k_eq_v", NOT_MEASURABLE, "not measurable here: the value norm's input was not seen")]
    k = layer["k_proj"]
    v = _heads_first(layer["norm"]["v"][0], k.shape[0], k.shape[2])
    same = v.shape == k.shape and float((v - k).abs().amax()) <= tol["pair_norm"] * float(k.abs().amax())
    return [finding(i, "k_eq_v", AS_DECLARED if same else DIFFERS, "values are the key projection (K = V), as "
                    "declared" if same else "differs: values are not the key projection, config says K = V")]


def layer_checks(adapter, i: int, layer: dict, d: Declared, tol: dict,
                 checkpoint: dict[str, torch.Tensor] | None = None, source: dict | None = None) -> list[dict]:
    """Every check of layer i; source: the tensors of layer d.kv_from, where the layer reads another's keys."""
    if d.kv_from is not None:
        keys = shared_checks(i, layer, source, d, tol)
        return [norm_check(adapter, i, "q", layer, d, tol, checkpoint), *keys, *scale_checks(i, layer, d, tol)]
    values = [norm_check(adapter, i, "v", layer, d, tol, None)] if d.v_norm or "v" in layer["norm"] else []
    return [norm_check(adapter, i, "q", layer, d, tol, checkpoint), norm_check(adapter, i, "k", layer, d, tol,
                                                                                checkpoint),
            *values, *k_eq_v_check(i, layer, d, tol), rope_check(adapter, i, layer, d, tol),
            *scale_checks(i, layer, d, tol)]
