from optimizers.muon import Muon, newton_schulz, polar_express
from optimizers.split import build_optimizers, format_split

__all__ = ["Muon", "build_optimizers", "format_split", "newton_schulz", "polar_express"]
