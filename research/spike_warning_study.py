"""Do the keys warn before the loss spikes? Which per-step signal crosses a threshold before the loss spikes.

QK (learned gain) and NoQK (no QK-norm), each trained at the learning-rate multiples where spikes occur without
immediate divergence, every step logged with its telemetry (loss, grad_norm, logit_max, key_norm, update_rms) and
the key probe's attention entropy. A spike is defined once (research/analysis/spikes.py); the alarm thresholds of
every signal are chosen on the first half of --seeds and evaluated on the rest: hit rate, false alarms per 1,000
steps and lead time, each with an interval over the evaluation seeds, and a verdict per signal and condition
(docs/spikes.md). --help lists the files it writes.
"""
from utils.cli import command

from research.studies import SPIKE_WARNING
from research.studies.runner import run_study


# --help's description: the module docstring, then these details
DESCRIPTION = __doc__ + """
    python research/spike_warning_study.py                       # tiny on CPU, 88m on CUDA
    python research/spike_warning_study.py --seeds 0 1 2 3 4 5 6 7
"""


@command
def main(argv: list[str] | None = None) -> None:
    run_study(SPIKE_WARNING, argv, description=DESCRIPTION)


if __name__ == "__main__":
    main()
