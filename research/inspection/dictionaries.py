"""Sections 2A, 2B and 3 of the Llama 2 7B tour: the token dictionaries, the input lens, and the words the attention
heads look for. Pure tensor functions plus three section builders that inspect_model (tour.py) calls.

- dictionaries: positive_share and input_output_correlation of the cosines of a sample's token pairs, in the input
  embedding and in the LM head;
- input lens: each residual state decoded by cosine with every input embedding, no norm applied;
- head words: the top right-singular direction of each head's query (key) weights, norm gains folded in, against
  the input embeddings.
Never a V x V matrix: pairs come in blocks of BLOCK_PAIRS, vocabulary-wide cosines VOCAB_BLOCK rows at a time.
The definitions, and the memory bound as measured: docs/inspection.md, "The tour" (Token dictionaries, Memory).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from research.access.adapters import Adapter, InspectError

BLOCK_PAIRS = 1 << 21     # pair cosines per block and dictionary: ~33 bytes each of scratch, ~70 MB
VOCAB_BLOCK = 4096        # dictionary rows in float32 at a time: 67 MB at d = 4096
DICT_SAMPLE = 4096        # tokens whose pairs are counted: 8.4M pairs; exact for V <= 4096 (this project's BPE)
DICT_SEED = 0
DEFAULT_WORDS = ("king", "queen", "man", "woman", "cat", "dog", "Paris", "London", "red", "blue", "one", "two")
HEAD_WORDS = ("top right-singular vector v of the head's weights with the pre-attention and q/k norm gains "
              "folded in; projection |cos(v, e_t)| with the input embedding e_t")
INPUT_LENS = "cosine of the raw residual state (no norm) with each input embedding"


# ----------------------------------------------------------------------------------------------
# Pure functions

def unit_rows(x: torch.Tensor) -> torch.Tensor:
    """Rows scaled to unit length, float32 (a zero row stays zero)."""
    x = x.float()
    return x / x.norm(dim=-1, keepdim=True).clamp_min(1e-30)


def vocab_cosines(E_Vd: torch.Tensor, X_kd: torch.Tensor, block: int = VOCAB_BLOCK) -> torch.Tensor:
    """cos(x_i, e_t) for every row x_i of X and every row e_t of E, [k, V] float32; E is read
    `block` rows at a time so only block x d of it is ever in float32."""
    U = unit_rows(X_kd.to(E_Vd.device))
    out = torch.empty(U.shape[0], E_Vd.shape[0], device=E_Vd.device)
    for t0 in range(0, E_Vd.shape[0], block):
        out[:, t0:t0 + block] = U @ unit_rows(E_Vd[t0:t0 + block]).T
    return out


def sample_ids(V: int, n: int, seed: int = DICT_SEED) -> torch.Tensor:
    """All V token ids when n >= V, else n distinct ids drawn with a seeded generator, sorted."""
    if n >= V:
        return torch.arange(V)
    return torch.randperm(V, generator=torch.Generator().manual_seed(seed))[:n].sort().values


@dataclass(frozen=True)
class PairStats:
    pairs: int
    positive_share_a: float
    positive_share_b: float
    mean_cos_a: float
    mean_cos_b: float
    correlation: float  # Pearson, of cos_a(i, j) with cos_b(i, j)


def pair_blocks(n: int, block_pairs: int = BLOCK_PAIRS) -> list[tuple[int, int]]:
    """Row blocks [i0, i1) of b = max(1, block_pairs // n) rows; block rows meet the rows from i0 on,
    so a block holds (i1 - i0) x (n - i0) <= max(block_pairs, n) cosines."""
    b = max(1, block_pairs // n)
    return [(i0, min(n, i0 + b)) for i0 in range(0, n - 1, b)]


def pair_statistics(A: torch.Tensor, B: torch.Tensor, block_pairs: int = BLOCK_PAIRS,
                    ids: torch.Tensor | None = None) -> PairStats:
    """Over all pairs i < j of the n rows (of A[ids] and B[ids] when ids are given), the cosines
    cos_A(i, j) and cos_B(i, j): shares of positive ones and their correlation, accumulated block
    by block (pair_blocks). Gathering rows here frees each gathered copy once it is normalized."""
    Ua = unit_rows(A if ids is None else A[ids])
    Ub = unit_rows(B if ids is None else B[ids])
    n = Ua.shape[0]
    if n < 3:
        raise InspectError(f"pair statistics need at least 3 tokens, got {n}")
    s = torch.zeros(8, dtype=torch.float64)  # pairs, positives a, b, sum a, b, sum a^2, b^2, ab
    for i0, i1 in pair_blocks(n, block_pairs):
        keep = torch.arange(i0, n, device=Ua.device)[None, :] > torch.arange(i0, i1, device=Ua.device)[:, None]
        x = (Ua[i0:i1] @ Ua[i0:].T)[keep].double()
        y = (Ub[i0:i1] @ Ub[i0:].T)[keep].double()
        s += torch.stack([torch.tensor(float(x.numel()), dtype=torch.float64, device=x.device),
                          (x > 0).sum().double(), (y > 0).sum().double(), x.sum(), y.sum(),
                          (x * x).sum(), (y * y).sum(), (x * y).sum()]).cpu()
    N, pa, pb, sa, sb, saa, sbb, sab = s.tolist()
    va, vb = saa - sa * sa / N, sbb - sb * sb / N
    cov = sab - sa * sb / N
    # cov / sqrt(va * vb), not / (sqrt(va) sqrt(vb)): equal dictionaries give exactly 1
    corr = cov / math.sqrt(va * vb) if va > 0 and vb > 0 else math.nan
    return PairStats(int(N), pa / N, pb / N, sa / N, sb / N, corr)


def top_direction(W_HDd: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per head, the top right-singular vector [H, d] and its share s_1^2 / sum s_i^2 [H]."""
    _, S, Vh = torch.linalg.svd(W_HDd.float(), full_matrices=False)   # S [H, D], Vh [H, D, d]
    return Vh[:, 0], S[:, 0].square() / S.square().sum(-1).clamp_min(1e-30)


# ----------------------------------------------------------------------------------------------
# The three sections

def word_ids(tokenizer, words, vocab: int | None = None) -> tuple[list[str], list[int], list[str]]:
    """(kept words, their token ids, skipped words): a word is kept when it is one token other
    than the unknown token, written as in running text (leading space) or else bare; repeats of an
    id, and ids at or beyond `vocab` (no row in the model's dictionaries), are skipped."""
    kept, ids, skipped = [], [], []
    unk = getattr(tokenizer, "unk_token_id", None)
    for w in words:
        found = None
        for variant in (" " + w, w):
            t = tokenizer(variant, add_special_tokens=False)["input_ids"]
            if len(t) == 1 and t[0] != unk:
                found = t[0]
                break
        if found is None or found in ids or (vocab is not None and found >= vocab):
            skipped.append(w)
        else:
            kept.append(w)
            ids.append(found)
    return kept, ids, skipped


def _word_cosines(E_Vd: torch.Tensor, ids: list[int]) -> list[list[float]]:
    U = unit_rows(E_Vd[torch.tensor(ids, dtype=torch.long, device=E_Vd.device)])
    return (U @ U.T).cpu().tolist()


@torch.no_grad()
def dictionary_section(adapter: Adapter, tokenizer, words=DEFAULT_WORDS, sample: int = DICT_SAMPLE,
                       seed: int = DICT_SEED, block_pairs: int = BLOCK_PAIRS) -> dict:
    """Section 2A: positive shares, the input/output correlation and the words' cosine matrices."""
    E_in, E_out = adapter.input_embedding().detach(), adapter.output_embedding().detach()
    V = adapter.vocab_rows()  # an LM head padded beyond the input vocabulary: common ids only
    ids = sample_ids(V, sample, seed).to(E_in.device)
    st = pair_statistics(E_in, E_out, block_pairs, ids)
    kept, wids, skipped = word_ids(tokenizer, words, V)
    return {"vocab_size": V, "sample_tokens": len(ids), "exact": len(ids) == V, "seed": seed, "pairs": st.pairs,
            "tied": E_in.data_ptr() == E_out.data_ptr() and E_in.shape == E_out.shape,
            "positive_share_input": st.positive_share_a, "positive_share_output": st.positive_share_b,
            "mean_cos_input": st.mean_cos_a, "mean_cos_output": st.mean_cos_b,
            "input_output_correlation": st.correlation,
            "words": {"words": kept, "ids": wids, "skipped": skipped,
                      "input": _word_cosines(E_in, wids), "output": _word_cosines(E_out, wids)},
            "block_pairs": block_pairs,
            "memory_bound_bytes": 2 * len(ids) * E_in.shape[1] * 4 + 33 * max(block_pairs, len(ids))}


def _lens_entry(cos_V: torch.Tensor, pos: int, own: int, top_k: int, decode) -> dict:
    top = cos_V.topk(top_k)
    c = cos_V[own]
    return {"pos": pos, "ids": top.indices.tolist(), "tokens": [decode(t) for t in top.indices.tolist()],
            "cos": top.values.tolist(), "input_id": own, "input_cos": c.item(),
            "input_rank": int((cos_V > c).sum())}


@torch.no_grad()
def input_lens(adapter: Adapter, states: dict[int, torch.Tensor], positions: list[int], token_ids: list[int],
               top_k: int, decode) -> dict:
    """Section 2B, in the logit lens's layout: states {l: [P, d]} (first sequence) decoded by cosine
    with the input dictionary; input_rank 0 means the position's own token is read first."""
    L1, P = len(states), len(positions)
    X = torch.cat([states[l] for l in range(L1)])                                   # [(L+1) * P, d]
    cos = vocab_cosines(adapter.input_embedding().detach(), X).view(L1, P, -1).cpu()
    layers = [{"layer": l, "positions": [_lens_entry(cos[l, j], p, token_ids[p], top_k, decode)
                                         for j, p in enumerate(positions)]} for l in range(L1)]
    return {"positions": positions, "top_k": top_k, "measure": INPUT_LENS, "layers": layers,
            "input_rank": [[ly["positions"][j]["input_rank"] for ly in layers] for j in range(P)]}


def _head_rows(cos_HV: torch.Tensor, share_H: torch.Tensor, top_k: int, decode) -> list[dict]:
    top = cos_HV.abs().topk(top_k, dim=-1)
    rows = []
    for h in range(cos_HV.shape[0]):
        ids = top.indices[h].tolist()
        rows.append({"head": h, "ids": ids, "tokens": [decode(t) for t in ids], "projections": top.values[h].tolist(),
                     "signs": [1 if cos_HV[h, t] >= 0 else -1 for t in ids], "energy_share": share_H[h].item()})
    return rows


@torch.no_grad()
def head_words(adapter: Adapter, layer: int, top_k: int, decode) -> dict:
    """Section 3: per query head and per KV (key) head of `layer`, the tokens whose input embeddings
    lie closest to the direction the head reads most (see the module docstring)."""
    if not 0 <= layer < adapter.n_layers:
        raise InspectError(f"head-words layer {layer} outside 0..{adapter.n_layers - 1}")
    E = adapter.input_embedding().detach()
    out = {"layer": layer, "top_k": top_k, "definition": HEAD_WORDS}
    for kind, m in (("query", "q"), ("key", "k")):
        v, share = top_direction(adapter.read_weights(layer, m).to(E.device))
        out[kind] = _head_rows(vocab_cosines(E, v).cpu(), share.cpu(), top_k, decode)
        out[f"max_projection_{kind}"] = max(h["projections"][0] for h in out[kind])
    return out
