"""Two models on the same tokens (qk-audit --reference): each layer's q and k after RoPE, v and the attention's
output compared, the first layer where they part, and which of the audited model's checks at that layer explains
it (docs/audit.md, "Against a reference").

    parting = first_parting(layers_a, layers_b, n_layers)     # None: they agree everywhere
"""
from __future__ import annotations

SITES = ("q", "k", "v", "out")
AGREE = 1e-4  # float32: two implementations of one computation agree to about 1e-6 of the largest value


def difference(a, b) -> float:
    """max |a - b| over max |b| (inf where the shapes differ)."""
    if a.shape != b.shape:
        return float("inf")
    return float((a.double() - b.double()).abs().amax() / b.double().abs().amax().clamp_min(1e-30))


def first_parting(a: dict[int, dict], b: dict[int, dict], n_layers: int, tol: float = AGREE) -> dict | None:
    """{"layer", "site", "difference"} of the first layer and site (in SITES' order) where a and b differ by more
    than tol; None where every layer's sites agree (a site one of them did not show is skipped)."""
    for i in range(n_layers):
        for site in SITES:
            x, y = a.get(i, {}).get(site), b.get(i, {}).get(site)
            if x is not None and y is not None and (d := difference(x, y)) > tol:
                return {"layer": i, "site": site, "difference": d}
    return None


def explain(parting: dict | None, findings: list[dict]) -> str:
    """One sentence: where the models part and the audited model's checks that differ at that layer."""
    if parting is None:
        return f"the models agree on every layer's q, k, v and attention output (within {AGREE:g})"
    i, site = parting["layer"], parting["site"]
    where = (f"they part at layer {i}: {site} differs by {parting['difference']:.2g} of its largest value"
             if parting["difference"] != float("inf") else f"they part at layer {i}: {site} has another shape")
    causes = [f"{f['check']} ({f['text']})" for f in findings if f["layer"] == i and f["status"] == "differs"]
    if causes:
        return f"{where}; explained by that layer's {'; '.join(causes)}"
    return f"{where}; no check of that layer differs (weights, the MLP or an earlier layer's residual differ)"
