"""The kind of host a run trained on, defined once. bf16 numerics differ between CPU kinds and between GPUs, so a study
compares runs of one host kind (research.analysis.identity) and adds runs only on the kind its folder holds, unless
made with --mix_hosts (research.studies.hosts). No torch: utils.runtime records it in every run's provenance.

    CPU     its model name and the native bf16 path it has: 'AMD EPYC (AVX512-BF16)', 'Intel Xeon ... (AMX)',
            'AMD EPYC (no native bf16)'
    CUDA    the GPU's name: 'NVIDIA H200'
    MPS     'Apple GPU (MPS)'

A provenance recorded before `host_kind` is read from its older fields (`same_paths`; docs/decisions.md, "One recipe").
"""
from __future__ import annotations

BF16_PATHS = ("AMX", "AVX512-BF16", "none")  # the CPU's native bf16 path, best first, as provenance's `cpu_bf16`
NATIVE = "native bf16, path not recorded"  # an older provenance's path: native bf16, which one not recorded
_PATH_TEXT = {"none": "no native bf16"}


def host_kind(provenance: dict | None) -> str | None:
    """The host kind of a run's provenance: its recorded `host_kind`, else one read from its older fields; None where
    it records no host (a write-up's results)."""
    p = provenance if isinstance(provenance, dict) else {}
    if p.get("host_kind"):
        return str(p["host_kind"])
    if p.get("gpu"):
        return str(p["gpu"])
    if str(p.get("device") or "").startswith("mps"):
        return "Apple GPU (MPS)"
    if not p.get("cpu"):
        return None
    path = p.get("cpu_bf16")
    if path is None and p.get("cpu_native_bf16") is not None:
        path = NATIVE if p["cpu_native_bf16"] else "none"
    return f"{p['cpu']} ({_PATH_TEXT.get(path, path)})" if path else str(p["cpu"])


def path_unknown(kind: str | None) -> bool:
    """Whether `kind` is an older run's 'MODEL (native bf16, path not recorded)' (same_paths did not resolve it)."""
    return bool(kind) and kind.endswith(f" ({NATIVE})")


def same_paths(kinds: list[str | None]) -> list[str | None]:
    """The host kinds of one folder's runs, each older 'MODEL (native bf16, path not recorded)' given the path the
    others of MODEL name where they name one only (AMX or AVX512-BF16): older and newer runs of one host are one
    kind; where they name both or none, it stays apart. Only the runs' own kinds: never the reading host's."""
    suffix = f" ({NATIVE})"
    paths: dict[str, set] = {}
    for k in kinds:
        for path in BF16_PATHS[:2]:
            if k and k.endswith(f" ({path})"):
                paths.setdefault(k[:-len(path) - 3], set()).add(path)
    out = []
    for k in kinds:
        model = k[:-len(suffix)] if k and k.endswith(suffix) else None
        known = paths.get(model, set()) if model else set()
        out.append(f"{model} ({next(iter(known))})" if len(known) == 1 else k)
    return out
