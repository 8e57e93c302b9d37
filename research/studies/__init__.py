"""The studies (catalog), the one runner that trains them (runner, torch) and the rendering of a
study folder into figures and a report (render, no torch)."""
from research.studies.catalog import (HEAD_SPECIALIZATION, KEY_DYNAMICS, LR_SENSITIVITY, PILOT, QK_NORM, STUDIES,
                                      Study)

__all__ = ["HEAD_SPECIALIZATION", "KEY_DYNAMICS", "LR_SENSITIVITY", "PILOT", "QK_NORM", "STUDIES", "Study"]
