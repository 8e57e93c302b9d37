"""Muon with its orthogonalization shared over ranks (DDP) and on FSDP2-sharded parameters, 2 CPU processes
on gloo, against the same steps in one process.

Each rank orthogonalizes the matrices j with j % world_size == rank (a smaller batch than the single
process's) and the results are all-gathered; the batched iteration treats each matrix on its own, so the
parameters come out bit for bit equal (measured: max difference 0.0 after 3 steps, both tests,
in fp32 and in bf16: each matrix's batched matmuls do the same arithmetic whatever the batch holds).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from optimizers import Muon
from tests.helpers import spawn_gloo

# Tall, wide and square matrices, odd counts per shape (uneven shares), a row count FSDP splits unevenly (7).
SHAPES = [(16, 16), (16, 16), (16, 16), (8, 16), (16, 8), (7, 12), (32, 16), (16, 32), (16, 32)]
STEPS = 3


def make_params() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return [nn.Parameter(torch.randn(*s, generator=g)) for s in SHAPES]


def grads(step: int) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return [torch.randn(*s, generator=g) for s in SHAPES]


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}  # the orthogonalization's precision, both sides alike


def muon(params, precision: str) -> Muon:
    # Two param groups, as W_q and W_k get with --qk_lr_multiplier: the second with its own lr and Moonlight's
    # update scale, which must use each matrix's whole shape, not its FSDP shard's.
    groups = [{"params": params[:5]}, {"params": params[5:], "lr": 0.03, "update_scale": "match_rms_adamw"}]
    opt = Muon(groups, lr=0.05, weight_decay=0.1, ortho_dtype=DTYPES[precision])
    opt.max_batch_numel = 512  # several batches per shape
    return opt


def reference(precision: str) -> list[torch.Tensor]:
    params = make_params()
    opt = muon(params, precision)
    for step in range(STEPS):
        for p, g in zip(params, grads(step)):
            p.grad = g
        opt.step()
    return [p.detach().clone() for p in params]


def _ddp_rank(rank: int, world: int, out, precision) -> None:
    params = make_params()
    opt = muon(params, precision)
    calls = []
    import optimizers.muon as muon_module
    real = muon_module.ORTHOGONALIZERS["polar_express"]
    muon_module.ORTHOGONALIZERS["polar_express"] = lambda G, **kw: calls.append(G.shape[0]) or real(G, **kw)
    for step in range(STEPS):
        for p, g in zip(params, grads(step)):
            p.grad = g
        opt.step()
    muon_module.ORTHOGONALIZERS["polar_express"] = real
    torch.save({"params": [p.detach() for p in params], "orthogonalized": sum(calls)}, out / f"ddp{rank}.pt")


def _fsdp_rank(rank: int, world: int, out, precision) -> None:
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor
    from optimizers.muon import local_rows
    from torch.distributed.device_mesh import init_device_mesh
    model = nn.ParameterList(make_params())
    fully_shard(model, mesh=init_device_mesh("cpu", (world,)))  # gloo on CPU, also on a machine with a GPU
    params = list(model.parameters())
    assert all(isinstance(p, DTensor) for p in params)
    opt = muon(params, precision)
    for step in range(STEPS):
        for p, g in zip(params, grads(step)):
            p.grad = DTensor.from_local(local_rows(g, p), p.device_mesh, p.placements, shape=p.shape,
                                        stride=p.stride())
        opt.step()
    torch.save({"params": [p.full_tensor() for p in params],
                "momentum_sharded": all(isinstance(opt.state[p]["momentum_buffer"], DTensor) for p in params)},
               out / f"fsdp{rank}.pt")


@pytest.mark.slow
@pytest.mark.parametrize("precision", DTYPES)
def test_ddp_ranks_share_the_orthogonalization_and_match_one_process(tmp_path, precision):
    spawn_gloo(_ddp_rank, 2, tmp_path, precision)
    want = reference(precision)
    ranks = [torch.load(tmp_path / f"ddp{r}.pt") for r in range(2)]
    for res in ranks:
        assert all(torch.equal(a, b) for a, b in zip(res["params"], want))
    # 9 matrices a step (groups of 5 and 4, each shared out from rank 0): rank 0 takes 3 + 2, rank 1 2 + 2.
    assert [r["orthogonalized"] for r in ranks] == [5 * STEPS, 4 * STEPS]


@pytest.mark.slow
@pytest.mark.parametrize("precision", DTYPES)
def test_fsdp_sharded_params_get_the_full_matrix_update(tmp_path, precision):
    spawn_gloo(_fsdp_rank, 2, tmp_path, precision)
    want = reference(precision)
    for r in range(2):
        res = torch.load(tmp_path / f"fsdp{r}.pt")
        assert res["momentum_sharded"]
        assert all(torch.equal(a, b) for a, b in zip(res["params"], want))
