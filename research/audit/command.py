"""The qk-audit command (research/qk_audit.py): load the model (or build it with the user's --factory), run a few
windows of the offline text through it, audit every layer (research.audit), print one line per layer and check,
write --json, and exit 1 where anything differs.

    main(argv, description)
"""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import torch

from research.access import InspectError, OwnAdapter, load_model
from research.access.loading import CACHE_HELP, DEFAULT_CACHE
from research.audit import audit_layers
from research.audit.compare import explain, first_parting
from research.audit.checks import AS_DECLARED, DIFFERS, NOT_MEASURABLE
from research.inspection.text import ENGLISH, text_batch
from utils.cli import ArgumentParser
from utils.errors import UserError
from utils.io import atomic_write_text

EXIT_DIFFERS = 1


class AuditError(UserError, ValueError):
    """A model or factory the audit cannot run; the message says why and the fix."""


def build_parser(description: str = "") -> ArgumentParser:
    p = ArgumentParser(description=description)
    p.add_argument("model", nargs="?", default=None,
                   help="A Hugging Face folder or hub id, a GGUF file, a packaged model (smollm2-135m, "
                        "gemma3-270m), or a train_llm.py run folder; with --factory, what the factory is given "
                        "(may be left out)")
    p.add_argument("--factory", default=None, metavar="FILE.py:FUNCTION",
                   help="Build the model in your own code: FUNCTION(MODEL) (or FUNCTION() without MODEL) returns a "
                        "torch model of a family the audit reads, audited as it runs (a port, a patched module)")
    p.add_argument("--reference", default=None, metavar="MODEL2",
                   help="Audit MODEL2 too (e.g. the Hugging Face original of a port) and compare the two on the same "
                        "tokens: the first layer whose q, k, v or attention output part, and the check that explains "
                        "it")
    p.add_argument("--text", default=ENGLISH, help="The text whose windows run through the model (as "
                                                   "inspect_pretrained.py's --text). Default: %(default)s")
    p.add_argument("--batch", type=int, default=2, help="Windows of text. Default: %(default)s")
    p.add_argument("--seq_len", type=int, default=64, help="Tokens per window. Default: %(default)s")
    p.add_argument("--json", default=None, metavar="FILE", help="Write every finding to FILE as JSON "
                                                                "(docs/schema/audit.schema.json)")
    p.add_argument("--cache_dir", default=DEFAULT_CACHE, help=CACHE_HELP)
    return p


def _factory(spec: str, model_arg: str | None) -> torch.nn.Module:
    path, _, name = spec.rpartition(":")
    if not path or not name or not Path(path).is_file():
        raise AuditError(f"--factory {spec}: give FILE.py:FUNCTION, an existing file and a function in it")
    loaded = importlib.util.spec_from_file_location("qk_audit_factory", path)
    module = importlib.util.module_from_spec(loaded)
    loaded.loader.exec_module(module)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise AuditError(f"--factory {spec}: {path} has no function {name!r}. Fix: name a function defined there")
    model = fn(model_arg) if model_arg is not None else fn()
    if not isinstance(model, torch.nn.Module):
        raise AuditError(f"--factory {spec} returned {type(model).__name__}, not a torch model. Fix: return the model")
    return model


def _adapter(model: torch.nn.Module):
    from models.llm import MinimalLLM
    from research.probing.hf.model import ProbeError, adapter_for
    if isinstance(model, MinimalLLM):
        return OwnAdapter(model)
    try:
        return adapter_for(model)
    except ProbeError as e:
        raise AuditError(str(e)) from None


def checkpoint_gains(adapter, folder: Path) -> dict[str, torch.Tensor] | None:
    """{"<layer>.q" / ".k": the q/k norm gain the folder's safetensors hold} by the modules' parameter names; None
    where the folder holds no safetensors file (nothing to compare against)."""
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    if not files:
        return None
    from safetensors import safe_open
    names = {id(m): n for n, m in adapter.model.named_modules()}
    stored: dict[str, torch.Tensor] = {}
    for f in files:
        with safe_open(str(f), "pt") as h:
            stored.update({k: h.get_tensor(k) for k in h.keys() if k.endswith("norm.weight")})
    out = {}
    for i in range(adapter.n_layers):
        for which, norm in zip("qk", adapter.qk_norms(i)):
            key = f"{names.get(id(norm), '?')}.weight"
            if norm is not None and key in stored:
                out[f"{i}.{which}"] = stored[key].float()
    return out


def report_lines(findings: list[dict]) -> list[str]:
    return [f"layer {f['layer']:>3}  {f['check']:<8} {f['text']}" for f in findings]


def summary(findings: list[dict]) -> dict:
    return {s: sum(f["status"] == s for f in findings) for s in (AS_DECLARED, DIFFERS, NOT_MEASURABLE)}


def main(argv=None, description: str = "") -> int:
    args = build_parser(description).parse_args(argv)
    if args.model is None and args.factory is None:
        raise AuditError("give MODEL, or --factory FILE.py:FUNCTION")
    if args.batch < 1 or args.seq_len < 2:
        raise AuditError(f"--batch {args.batch} --seq_len {args.seq_len}: give 1 or more windows of 2 or more tokens")
    tokenizer = None
    if args.factory:
        adapter = _adapter(_factory(args.factory, args.model))
        if args.model and Path(args.model).is_dir():
            from transformers import AutoTokenizer
            try:
                tokenizer = AutoTokenizer.from_pretrained(args.model)
            except (OSError, ValueError):
                tokenizer = None
    else:
        _, tokenizer, adapter = load_model(args.model, "float32", args.cache_dir)
    seq_len = min(args.seq_len, adapter.context or args.seq_len)
    if tokenizer is not None:
        ids, _ = text_batch(tokenizer, args.text, args.batch, seq_len)
        what = f"{args.batch} windows of {seq_len} tokens of {args.text}"
    else:
        rows = adapter.vocab_rows()
        ids = torch.randint(0, rows, (args.batch, seq_len), generator=torch.Generator().manual_seed(0))
        what = f"{args.batch} sequences of {seq_len} seeded random token ids (no tokenizer)"
    folder = Path(args.model) if args.model else None
    findings, layers = _audited(adapter, ids, checkpoint_gains(adapter, folder) if folder is not None else None)
    print(f"audit of {args.model or args.factory} ({adapter.family}, {adapter.n_layers} layers) on {what}")
    counts = _report(findings)
    record = {"model": args.model, "factory": args.factory, "family": adapter.family, "layers": adapter.n_layers,
              "tokens": list(ids.shape), "findings": findings, "summary": counts}
    parted = False
    if args.reference:
        _, _, ref = load_model(args.reference, "float32", args.cache_dir)
        if _shape(ref) != _shape(adapter):
            raise AuditError(f"--reference {args.reference}: {ref.n_layers} layers of {ref.n_heads} heads, not the "
                             f"{adapter.n_layers} of {adapter.n_heads} of MODEL. Fix: a reference of the same shape")
        ref_findings, ref_layers = _audited(ref, ids, checkpoint_gains(ref, Path(args.reference)))
        print(f"audit of the reference {args.reference} ({ref.family}) on the same tokens")
        ref_counts = _report(ref_findings)
        parting = first_parting(layers, ref_layers, adapter.n_layers)
        parted = parting is not None
        print(f"against the reference: {explain(parting, findings)}")
        record.update(reference={"model": args.reference, "findings": ref_findings, "summary": ref_counts},
                      comparison={"parting": parting, "text": explain(parting, findings)})
    if args.json:
        atomic_write_text(Path(args.json), json.dumps(record, indent=1, allow_nan=False) + "\n")
    return EXIT_DIFFERS if counts[DIFFERS] or parted else 0


def _shape(adapter) -> tuple:
    """Layers, query heads and each layer's KV heads and head size (Gemma 4's differ by layer)."""
    return adapter.n_layers, adapter.n_heads, [(adapter.kv_heads_of(i), adapter.head_dim_of(i))
                                               for i in range(adapter.n_layers)]


def _audited(adapter, ids, gains):
    try:
        return audit_layers(adapter, ids, checkpoint=gains)
    except InspectError as e:
        raise AuditError(str(e)) from None


def _report(findings: list[dict]) -> dict:
    print("\n".join(report_lines(findings)))
    counts = summary(findings)
    print(f"{len(findings)} checks: {counts[AS_DECLARED]} as declared, {counts[DIFFERS]} differ, "
          f"{counts[NOT_MEASURABLE]} not measurable")
    return counts


