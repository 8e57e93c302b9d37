"""Loading a model to inspect: a local Hugging Face folder, a hub id, or a training folder of this project."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from research.access.adapters import ADAPTERS, DEFAULT_ATTN, Adapter, InspectError
from research.access.own_adapter import OwnAdapter
from research.access.gguf import PACKAGED, read_meta, resolve_gguf
from utils.cache import AUTO, cache_dir as cache_folder
from utils.errors import shown
from utils.hub import hub_problem
from utils.progress import library_progress
from utils.run_names import is_own_run

DEFAULT_CACHE = AUTO  # converted GGUF models (research.access.gguf): the user cache's models/ (utils.cache)
CACHE_HELP = ("Folder where GGUF files are converted to Hugging Face folders, once per file; auto: models/ in the "
              "user's qk-keys cache ($QK_KEYS_CACHE, else ~/.cache/qk-keys on Linux; utils/cache.py). Default: "
              "%(default)s")  # --cache_dir of inspect_pretrained and pretrained_keys_study
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _load_own(path: Path, dtype: torch.dtype):
    from configs import ConfigError
    from configs.files import load_run_config
    from models.llm import MinimalLLM
    from training.checkpoint import load_newest_weights
    from training.memory_fit import check_fits
    from utils.io import check_links
    check_links(path, "inspect another run", InspectError)
    try:
        cfg = load_run_config(path / "config.json")
    except ConfigError as e:
        raise InspectError(str(e)) from e
    check_fits(cfg)  # the model is built in this machine's memory: refused with the numbers when it cannot be
    model = MinimalLLM(cfg.model)
    ckpt, failed = load_newest_weights(path / "checkpoints", model)
    for bad, why in failed:
        print(f"warning: checkpoint {bad.path} cannot be loaded: {why}", file=sys.stderr)
    if ckpt is None and failed:
        raise InspectError(f"no checkpoint under {path / 'checkpoints'} can be loaded ("
                           f"{'; '.join(f'{c.path.name}: {why}' for c, why in failed)}): restore them from a copy")
    if ckpt is None:
        raise InspectError(f"{path} is a training folder of this project but has no complete checkpoint under "
                           f"{path / 'checkpoints'} (train with --ckpt_every, or wait for the first checkpoint)")
    if failed:
        print(f"warning: inspecting the older checkpoint {ckpt.path} instead", file=sys.stderr)
    tok_dir = path / "tokenizer"
    if not tok_dir.is_dir():
        raise InspectError(f"{path} has no tokenizer/ folder: the logit lens and the prompt need it")
    from transformers import AutoTokenizer
    try:
        tokenizer = AutoTokenizer.from_pretrained(tok_dir)
    except Exception as e:  # noqa: BLE001 - a damaged tokenizer fails in many ways; one message names it
        raise InspectError(f"cannot load the tokenizer in {tok_dir} ({type(e).__name__}: {str(e)[:200]}): "
                           f"restore it from the run's data cache or a copy") from e
    model = model.to(dtype).eval()
    adapter = OwnAdapter(model)
    adapter.source = f"{path} (checkpoint step {ckpt.step})"
    adapter.tokenizer_size = len(tokenizer)
    return model, tokenizer, adapter


def _hf_config(name: str, path: Path, local: bool, revision: str | None = None):
    """The model's config: from the folder, else the local cache, else the hub after a fast check.
    Returns (config, whether it came from local files). revision: a hub revision (branch, tag or commit)."""
    from transformers import AutoConfig
    try:
        return AutoConfig.from_pretrained(str(path) if local else name, revision=revision,
                                          local_files_only=True), True
    except Exception as e:  # noqa: BLE001 - hub/IO errors have many types; re-raised with the cause
        if local:
            raise InspectError(f"cannot read the config of {path}: {e}") from e
        cached_error = e
    problem = hub_problem(name, "model")
    at = f" at revision {shown(revision)}" if revision else ""
    try:
        if problem is not None:
            raise ConnectionError(problem[1])
        return AutoConfig.from_pretrained(name, revision=revision), False
    except Exception as e:  # noqa: BLE001
        raise InspectError(f"model {shown(name)}{at} is neither a local folder nor in the local Hugging Face cache, "
                           f"and the hub failed ({type(e).__name__}: {e}). Fix: without a network, pass a local "
                           f"folder (save_pretrained) or a train_llm.py output folder") from cached_error


def looks_like_hub_id(name: str) -> bool:
    """`name` is spelled as a hub id (owner/name, or name) and not as a path (./, /, ~, two folders deep)."""
    return not name.startswith((".", "/", "~")) and name.count("/") <= 1 and "\\" not in name


def local_kind(name: str) -> str | None:
    """What `name` is when it is no hub id: "folder", "file" or "packaged model" (None: a hub id, or nothing)."""
    path = Path(name).expanduser()
    if path.is_dir():
        return "folder"
    if path.exists():
        return "file"
    return "packaged model" if name in PACKAGED else None


# the files one of transformers' tokenizers is read from; a folder holding none of them has no tokenizer
TOKENIZER_FILES = (("tokenizer.json",), ("tokenizer.model",), ("vocab.json", "merges.txt"), ("vocab.txt",))


def safetensors_problem(f: Path) -> str | None:
    """What is wrong with a .safetensors file, read from its header and size alone (None: nothing seen)."""
    size = f.stat().st_size
    with f.open("rb") as fh:
        head = fh.read(8)
        n = int.from_bytes(head, "little") if len(head) == 8 else -1
        if n < 0 or 8 + n > size:
            return f"{size:,} bytes, fewer than its header needs"
        try:
            header = json.loads(fh.read(n))
            end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
        except (ValueError, TypeError, KeyError, IndexError, AttributeError):
            return "its header is not readable"
    if 8 + n + end > size:
        return f"{size:,} bytes, where its header lists tensors up to byte {8 + n + end:,}"
    return None


def check_local_files(folder: Path) -> None:
    """InspectError naming the file and the fix: a cut-off or damaged weights file, a folder without tokenizer
    files; the checks every local Hugging Face folder passes before transformers reads it."""
    weights = sorted(folder.glob("*.safetensors"))
    if not weights and not any(folder.glob("pytorch_model*.bin")):
        raise InspectError(f"{folder} has no weights file (model.safetensors, or pytorch_model.bin): copy the model's "
                           f"weights into it (model.save_pretrained(\"{folder}\")), or pass the folder that holds "
                           f"them")
    for f in weights:
        problem = safetensors_problem(f)
        if problem:
            raise InspectError(f"{f} is damaged or cut off ({problem}): copy or download the model again (an "
                               f"interrupted copy or download leaves such a file)")
    if not any(all((folder / n).is_file() for n in files) for files in TOKENIZER_FILES):
        names = ", ".join(" + ".join(files) for files in TOKENIZER_FILES)
        raise InspectError(f"{folder} has no tokenizer files (none of {names}): copy the model's tokenizer into it "
                           f"(tokenizer.save_pretrained(\"{folder}\")), or pass the folder that holds them")


def load_model(name: str, dtype: str = "float32", cache_dir: str | Path = DEFAULT_CACHE,
               log=print, progress: bool = True,
               revision: str | None = None) -> tuple[torch.nn.Module, object, Adapter]:
    """(model, tokenizer, adapter) for a local HF folder, a training folder of this project, a hub id, or a
    GGUF file (a .gguf, a folder holding one, or a packaged model's name: research.access.gguf), which is
    converted once into a Hugging Face folder under cache_dir ("auto": the user cache's models/). adapter.gguf is
    that folder's gguf_source.json (None for a model not read from GGUF). progress=False (--no_progress): no
    progress bar of downloads, conversion or loading (utils.progress). revision: a hub revision (branch, tag or
    commit) of a hub id, e.g. one of a model's intermediate training checkpoints; only for hub ids."""
    if dtype not in DTYPES:
        raise InspectError(f"dtype {shown(dtype)}: choose one of {', '.join(DTYPES)}")
    if revision is not None and local_kind(name):
        raise InspectError(f"revision {shown(revision)} given for {shown(name)}, which is a local {local_kind(name)}: "
                           f"revisions belong to hub ids only; pass each local checkpoint as its own folder")
    with library_progress(progress):
        converted = resolve_gguf(name, cache_folder(cache_dir, "models"), log)
        if converted is not None:
            folder, meta = converted
            model, tokenizer, adapter = _load_not_gguf(str(folder), DTYPES[dtype], meta)
            adapter.source = f"{name} (converted: {folder})"
            return model, tokenizer, adapter
        return _load_not_gguf(name, DTYPES[dtype], revision=revision)


def _load_not_gguf(name: str, dtype: torch.dtype, gguf: dict | None = None,
                   revision: str | None = None) -> tuple[torch.nn.Module, object, Adapter]:
    """load_model for a name that is no GGUF file: a training folder, a Hugging Face folder or a hub id.
    gguf: the converted folder's gguf_source.json when load_model has read it already."""
    path = Path(name).expanduser()
    if path.is_dir() and is_own_run(path):
        return _load_own(path, dtype)
    local = path.exists()
    if not local and not looks_like_hub_id(name):
        raise InspectError(f"model {shown(name)} not found: no such folder or file, and it is not a hub id "
                           f"(owner/name) or a packaged model ({', '.join(PACKAGED)})")
    if path.is_file():
        raise InspectError(f"{path} is a file but not a GGUF file (*.gguf): pass a GGUF file, a Hugging Face model "
                           f"folder or a training folder written by train_llm.py")
    if local and not (path / "config.json").is_file():
        raise InspectError(f"{path} has no config.json: expected a Hugging Face model folder "
                           f"(save_pretrained), a GGUF file or a folder holding one, or a training folder written "
                           f"by train_llm.py")
    config, from_local = _hf_config(name, path, local, revision)
    adapter_cls = ADAPTERS.get(config.model_type)
    if adapter_cls is None:
        raise InspectError(f"unsupported architecture {config.model_type!r} "
                           f"({', '.join(getattr(config, 'architectures', None) or [])}): supported model types are "
                           f"{', '.join(sorted(ADAPTERS))} and this project's train_llm.py checkpoints")
    if local:
        check_local_files(path)  # before transformers reads them: its errors name no file and no fix
    from transformers import AutoModelForCausalLM, AutoTokenizer
    src = str(path) if local else name
    adapter_cls.check_config(config, f"{src}@{revision}" if revision else src)  # before any weight is read
    if gguf is not None or (local and read_meta(path) is not None):
        # a folder converted from GGUF holds float32 weights; one converted before the conversion dropped the GGUF
        # quantization_config from its config.json would load as a "quantized" model that no Trainer fine-tunes
        config.__dict__.pop("quantization_config", None)
    at = f" at revision {shown(revision)}" if revision else ""
    try:
        model = AutoModelForCausalLM.from_pretrained(src, config=config, dtype=dtype, local_files_only=from_local,
                                                     attn_implementation=DEFAULT_ATTN, revision=revision)
    except Exception as e:  # noqa: BLE001
        damaged = " (a weights file is damaged or cut off: download the model again)" \
            if type(e).__name__ == "SafetensorError" else ""
        raise InspectError(f"cannot load the weights of {src}{at}{damaged} ({type(e).__name__}: {e})") from e
    try:
        tokenizer = AutoTokenizer.from_pretrained(src, local_files_only=from_local, revision=revision)
    except Exception as e:  # noqa: BLE001
        raise InspectError(f"cannot load the tokenizer of {src}{at} ({type(e).__name__}: {str(e)[:300]}): the "
                           f"model's tokenizer files are missing or damaged; copy them from the model's "
                           f"source") from e
    model.eval()
    adapter = adapter_cls(model)
    adapter.source = f"{src}@{revision}" if revision else src
    adapter.gguf = gguf if gguf is not None else read_meta(path) if local else None
    adapter.tokenizer_size = len(tokenizer)
    return model, tokenizer, adapter
