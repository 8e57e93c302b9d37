from models.layers import Attention, Block, FeedForward, HookPoint, RMSNorm, Rotary
from models.llm import MinimalLLM

__all__ = ["Attention", "Block", "FeedForward", "HookPoint", "MinimalLLM", "RMSNorm", "Rotary"]
