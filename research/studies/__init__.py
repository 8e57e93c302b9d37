"""The studies: the registry of study kinds (kinds), the catalog and the one runner that trains it (runner,
torch), the one executor of every trained study's runs (executors), the studies of Hugging Face models (finetune,
pretrained_keys, checkpoint_keys) and the rendering of any study folder into figures and a report (render, no
torch)."""
from research.studies.catalog import (HEAD_SPECIALIZATION, KEY_DYNAMICS, LR_SENSITIVITY, PILOT, QK_NORM,
                                      SPIKE_WARNING, STUDIES, Study)

__all__ = ["HEAD_SPECIALIZATION", "KEY_DYNAMICS", "LR_SENSITIVITY", "PILOT", "QK_NORM", "SPIKE_WARNING", "STUDIES",
           "Study"]
