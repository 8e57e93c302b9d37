"""The declared formats (utils.formats) of the JSON files written below research/results, by rooms that import
torch or that research/results may not import: a checkpoint's state.json (training.checkpoint), a data cache's
meta.json (data.blocks) and a cached tokenizer's data_tokenizer.json (data.tokenizer), a converted GGUF model's
gguf_source.json (research.access.gguf) and the holder record in a folder's .lock (utils.lock). Each writer's reader
checks its file against the spec here, and research.results.published publishes them as JSON Schema with the
others, from this one declaration. No torch, nothing of the project but utils.formats.
"""
from __future__ import annotations

import math

from utils.formats import Integer, MapOf, Number, Obj, OneOf, Opt, Text, found
from utils.time_split import TIME_SPLIT

STATE_FILE = "state.json"  # a checkpoint's (training.checkpoint)
BLOCKS_META = "meta.json"  # a data cache's token blocks (data.blocks)
DATA_TOKENIZER = "data_tokenizer.json"  # a cached tokenizer's folder (data.tokenizer)
GGUF_SOURCE = "gguf_source.json"  # a converted GGUF model's folder (research.access.gguf)

_TEXT = Text(nullable=False)
_NAME = Text(nullable=False, nonempty=True)
_SHA256 = Text("a sha256 (64 hexadecimal digits)", nullable=False, pattern=r"^[0-9a-f]{64}$")
_COUNT = Integer("a whole number >= 0", nullable=False, lo=0)
_SECONDS = Number("a number of seconds >= 0", nullable=False, ge=0)

# state.json: every field of the type training.checkpoint.save_checkpoint writes. The callbacks' own states and the
# loader position are checked by their owners when they are loaded (CheckpointError names the callback).
CHECKPOINT_STATE = Obj({
    "step": Integer("a step (a whole number >= 0)", nullable=False, lo=0),
    "tokens": Opt(Integer("a whole number >= 0", nullable=False, lo=0)),
    "wall_time": Opt(Number("a number of seconds", nullable=False, ok=lambda v: math.isfinite(v) and v >= 0)),
    "loader": Obj({}, show=found),
    **{k: Opt(Obj({}, show=found)) for k in ("config", "data")},  # data: training.resume.data_identity
    "callbacks": Opt(MapOf(Obj({}, show=found), show=found)),  # {callback name: its state}
    "time_split": Opt(TIME_SPLIT),  # the run's wall time by phase up to this checkpoint (utils.time_split)
}, "a JSON object (a checkpoint's state)", show=found)

# meta.json of a data cache folder (data.blocks): the key the blocks were built for (BlockKey.meta), what they were
# built from (data.prepare), the counts and the arrays' sha256. load_blocks compares the key with the one requested.
BLOCKS_META_FORMAT = Obj({
    "format": Integer("a format number (an integer >= 1)", nullable=False, lo=1),
    **{k: _NAME for k in ("source_hash", "tokenizer_hash")},
    "seq_len": Integer("a positive integer", nullable=False, lo=1),
    "vocab_size": Integer("a positive integer", nullable=False, lo=1),
    "eos_id": Integer("a token id (an integer >= 0)", nullable=False, lo=0),
    "val_frac": Number("a share in (0, 1)", nullable=False, gt=0, lt=1),
    "dtype": OneOf(("uint16", "int32")),
    "split_seed": Integer(nullable=False),
    **{k: Opt(_TEXT) for k in ("source", "source_description", "tokenizer", "tokenizer_dir")},
    "created": Opt(Number("a time (seconds since 1970)", nullable=False)),
    **{k: Opt(_COUNT) for k in ("n_docs", "n_tokens")},
    "tokenize_seconds": Opt(_SECONDS),
    **{k: Integer("a number of blocks (an integer >= 1)", nullable=False, lo=1) for k in ("n_train", "n_val")},
    **{k: _SHA256 for k in ("train_sha256", "val_sha256")},
}, "a JSON object (a data cache's record)")

# data_tokenizer.json of a cached tokenizer (data.tokenizer): what it was made for (a trained BPE: the recipe, the
# corpus and the vocabulary asked for; a GGUF file's: its sha256; a Hub tokenizer's: its id) and the hash of its
# tokenizer.json. _load_cached compares what it was made for with what is asked.
DATA_TOKENIZER_FORMAT = Obj({
    "tokenizer_hash": Opt(_NAME),
    "recipe": Opt(_NAME), "source_hash": Opt(_NAME),
    **{k: Opt(Integer("a positive integer", nullable=False, lo=1)) for k in ("requested_vocab_size", "vocab_size",
                                                                             "sample_limit_bytes")},
    "eos_token": Opt(_TEXT),
    **{k: Opt(_COUNT) for k in ("corpus_bytes", "trained_on_bytes")},
    "gguf_sha256": Opt(_SHA256), "gguf_file": Opt(_NAME), "repo_id": Opt(_NAME),
}, "a JSON object (a cached tokenizer's record)")

# gguf_source.json of a converted GGUF model (research.access.gguf._convert): the file, its hash and size, its
# architecture and elements per tensor type, and the check the conversion passed (its loss on the check text).
GGUF_SOURCE_FORMAT = Obj({
    "recipe": _NAME, "gguf_file": _NAME, "gguf_sha256": _SHA256, "gguf_bytes": Opt(_COUNT),
    "architecture": Opt(_NAME), "model_type": Opt(_NAME),
    "tensor_types": Opt(MapOf(_COUNT, "an object mapping each tensor type to its elements")),
    "check_text": Opt(_TEXT), "check_loss": Opt(Number(nullable=False, ge=0)), "check_tokens": Opt(_COUNT),
    "transformers": Opt(_NAME), "convert_s": Opt(_SECONDS),
}, "a JSON object (a converted GGUF model's record)")

# .lock (utils.lock): who holds the folder, one JSON object on one line. Its contents are read only while another
# process holds the lock, to name it; a record that does not fit is "not readable", never an error.
LOCK_HOLDER = Obj({
    "pid": Integer("a process id (an integer >= 0)", nullable=False, lo=0),
    "host": _TEXT, "started": _TEXT, "command": _TEXT,
}, "a JSON object (a folder lock's holder)")
