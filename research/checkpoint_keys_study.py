"""Keys across the saved checkpoints of one model: what happens to keys as an LLM trains, for models trained elsewhere.

    python research/export_hf.py RUN hf-200 --step 200          # a run of this project: one export per step
    python research/checkpoint_keys_study.py --checkpoints hf-100 hf-200 hf-400
    python research/checkpoint_keys_study.py --checkpoints out/checkpoint-500 out/checkpoint-1000   # Trainer's
    python research/checkpoint_keys_study.py --checkpoints ORG/MODEL --revisions step1000 step2000   # a network
    python research/checkpoint_keys_study.py --checkpoints ORG/M-seed1 ORG/M-seed2 --revisions step1000 step8000
    python research/checkpoint_keys_study.py --checkpoints s1/a s1/b s2/a s2/b --seeds 1 1 2 2   # across seeds
    python research/checkpoint_keys_study.py --render_only      # redraw the figures and report from the JSON
"""
from utils.cli import command

from research.studies import checkpoint_keys


# --help's description: the module docstring, then these details
DESCRIPTION = __doc__ + """
Each checkpoint (a Hugging Face folder, a GGUF file, or a revision of one hub id) is loaded in turn and the
SAME --batches batches of --batch windows of --seq_len tokens of real text (--text) go through it: per
batch the probe's key metrics (per layer and KV head at k_proj, k_norm where the model has one, and after
RoPE), its attention metrics and its loss (research/inspection/key_study.py). The training step of each
checkpoint is read from it (research/access/checkpoints.py) unless --steps gives them (a step the checkpoint
records must agree); checkpoints are taken in step order. A checkpoint whose weights hash (sha256 of the state
dict) equals an earlier one's is named as its duplicate and not measured: it is no progress of training,
whatever its name says.
research/analysis/trajectory.py decides, per layer group, the change from the first to the last checkpoint,
with text batches as the unit of uncertainty. All checkpoints must share one architecture and tokenizer.
Across seeds (several hub ids with --revisions, each id's seed<N>, or --seeds), revisions are paired within a seed and
research/analysis/trajectory_seeds.py decides the change across seeds, and follows sink heads (--sink_threshold).
"""


def build_parser():
    return checkpoint_keys.build_parser(DESCRIPTION)


@command(fix_also="pass --out DIR")
def main(argv: list[str] | None = None) -> int:
    return checkpoint_keys.main(argv, DESCRIPTION)


if __name__ == "__main__":
    raise SystemExit(main())
