"""Data: source -> tokenizer -> token blocks (prepare.py), then batches (loader.py).

    cfg = resolve_offline(cfg)         # the write-ups' presets without a network: local data, said so
    data = prepare_data(cfg)           # TokenData: train/val blocks, tokenizer folder, hashes
    usage, notes = data_usage(cfg, data)  # what the run takes from it; a sentence per shortfall
    loader = BlockLoader(data.train, cfg.train.batch_size, seed=cfg.train.seed, rank=r, world_size=w)
    x, y = loader.next_batch()         # int64 [batch_size // world_size, seq_len]
    evals = val_batches(data.val, cfg.train.batch_size, cfg.train.eval_batches, r, w)
"""
from data.loader import BlockLoader, val_batches
from data.offline import resolve_offline
from data.prepare import TokenData, data_usage, prepare_data
from data.source import OFFLINE_OPTIONS, DataError
from data.tokenizer import EOT

__all__ = ["TokenData", "prepare_data", "data_usage", "resolve_offline", "BlockLoader", "val_batches", "DataError",
           "EOT", "OFFLINE_OPTIONS"]
