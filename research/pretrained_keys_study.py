"""Keys of real pretrained models: what a trained model can answer of the write-ups' claims.

    python research/pretrained_keys_study.py                      # SmolLM2-135M and Gemma 3 270M, offline
    python research/pretrained_keys_study.py --models smollm2-135m --batches 4
    python research/pretrained_keys_study.py --render_only        # redraw figures and report from the JSON
"""
from utils.cli import command

from research.studies import pretrained_keys


# --help's description: the module docstring, then these details
DESCRIPTION = __doc__ + """
For each model (a packaged name, a GGUF file, a Hugging Face folder or a hub id; GGUF files are
converted once into --cache_dir), --batches batches of --batch windows of --seq_len tokens of real text
(--text: english-v1 by default, one window per document) go through the model; on each batch the
probe's key metrics (per layer and KV head at k_proj, k_norm where the model has one, and after
RoPE), its attention metrics (per query head) and its loss are recorded, and the same keys of an
untrained model of the same architecture (seeded initialization) on the same batch. Then
research/analysis/pretrained.py decides, per model, with text batches as the unit of uncertainty:

1. key norms against sqrt(d_head) by depth (early, middle, final layers);
2. sinks and gatherers among the KV heads of a layer (by attention, as the head-specialization study
   decides them) and whether sinks have longer keys within a layer;
3. the spread of the k_norm gain (CV, golden dimensions), exact, for models that have k_norm;
4. low key rank: pr_sv against the untrained architecture's on the same text.

Writes into --out the results file (every per-batch number), one figure per question and report.md;
--help lists the files.
"""


def build_parser():
    return pretrained_keys.build_parser(DESCRIPTION)


@command(fix_also="pass --out DIR")
def main(argv: list[str] | None = None) -> int:
    return pretrained_keys.main(argv, DESCRIPTION)


if __name__ == "__main__":
    raise SystemExit(main())
