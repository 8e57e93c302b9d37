"""Fine-tune a pretrained QK-norm model with transformers' Trainer and watch its keys learn.

    python research/finetune_keys_study.py                         # Gemma 3 270M (packaged GGUF), offline
    python research/finetune_keys_study.py --model PATH --tokens 200000 --seeds 0 1 2 --device cuda
    python research/finetune_keys_study.py --ray --gpus_per_run 0.5  # the runs as Ray tasks, two per GPU
    python research/split_panels.py research_results/finetune_keys_study   # redraw from the results files
"""
from utils.cli import command

from research.studies import finetune


# --help's description: the module docstring, then these details
DESCRIPTION = __doc__ + """
The write-ups ask whether QK-norm's learned gain or its normalization shapes the keys; for a model trained
elsewhere the question becomes: does training its q/k norm gains while it fine-tunes change its keys or its
loss, against freezing them at their pretrained values? Two conditions, the same in everything else:

    gains_trained   every weight trains but the embeddings (input embedding and a tied LM head)
    gains_frozen    the same, with the q_norm and k_norm gains frozen at their pretrained values

Each condition is fine-tuned once per seed on the natural-language corpus english-v1 (documents cut
into blocks of --seq_len tokens; a held-out tenth of the documents gives the fixed probe batch), with
research.probing.hf.KeyProbeCallback probing keys, gains, attention and the largest logits at step 0, every
--probe_every steps and at the last; runs of one seed share the data order. Then
research/analysis/finetune.py decides, paired by seed, by the project's procedure (docs/decisions.md).
--model: a packaged name (gemma3-270m), a GGUF file, a Hugging Face folder or a hub id of a family with
q/k norms (Gemma 3, Qwen3, OLMo 2, Apertus). A run already finished in --out is kept; an unfinished one is
trained again from the start (no checkpoints of the model are saved).
"""


def build_parser():
    return finetune.build_parser(DESCRIPTION)


@command(fix_also="pass --out DIR")
def main(argv: list[str] | None = None) -> int:
    return finetune.main(argv, DESCRIPTION)


if __name__ == "__main__":
    raise SystemExit(main())
