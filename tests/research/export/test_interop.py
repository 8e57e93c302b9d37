"""docs/interop.md runs: its ```python blocks, executed in order against a debug run trained and exported here,
read the keys after QK-norm through nnsight and TransformerLens equal to the project's own probe hook
(the training probe's LayerSink, site k_norm), and their key patches give the native model's logits
under the same patch on hook_k_norm.

nnsight and TransformerLens are optional (not in requirements.txt): each test skips where its library is not
installed. The page runs in a subprocess of the same interpreter, and the skip only looks the package up
(find_spec) instead of importing it, because both change globals on import (nnsight mounts a `.save` on every
object and patches torch.Tensor.backward; TransformerLens patches huggingface_hub's config validation), which
must not leak into the rest of a test session.

Tolerances (both sides fp32, tests/tolerances.py): keys within forward_rel_tol(n_layers, d_model) of their scale
max |k|, logits within logit_atol, as tests/research/export/test_export_hf.py compares the export itself.
"""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys

import pytest
import torch

from tests.helpers import REPO, cli_args, probe_tensors
from tests.tolerances import forward_rel_tol, logit_atol

PAGE = REPO / "docs" / "interop.md"
OUT_LINE = 'OUT = "runs/a-hf"'  # the setup block's export folder, pointed at the test's export
PATCHED_LAYER, ZEROED = 1, (0, 0)  # the page's patches: layer 1's keys from the source; layer 0, KV head 0 zeroed
SECTIONS = {"nnsight": "nnsight", "transformer_lens": "TransformerLens"}  # package -> the page's section

# Executes the given files in one namespace and saves every tensor it ends with (lists of tensors and
# TransformerLens' ActivationCache as such) to argv[1].
RUNNER = """
import sys, torch
ns = {"__name__": "__main__"}
for path in sys.argv[2:]:
    with open(path) as f:
        exec(compile(f.read(), path, "exec"), ns)
def keep(v):
    if isinstance(v, torch.Tensor):
        return v.detach().clone()
    if isinstance(v, list) and v and all(isinstance(x, torch.Tensor) for x in v):
        return [x.detach().clone() for x in v]
    if type(v).__name__ == "ActivationCache":
        return {k: t.detach().clone() for k, t in v.items()}
torch.save({k: kept for k, v in ns.items() if (kept := keep(v)) is not None}, sys.argv[1])
"""


def require(package: str) -> None:
    if importlib.util.find_spec(package) is None:
        pytest.skip(f"{package} is not installed (optional: docs/interop.md)")


def page_blocks() -> dict[str, list[str]]:
    """The page's ```python blocks by the `## ` section they stand in ('' before the first)."""
    blocks: dict[str, list[str]] = {}
    section = ""
    for m in re.finditer(r"^## ([^\n]+)$|^```python\n(.*?)^```$", PAGE.read_text(), re.M | re.S):
        if m.group(1) is not None:
            section = m.group(1).strip()
        else:
            blocks.setdefault(section, []).append(m.group(2))
    return blocks


def run_page_code(codes: list[str], tmp_path, name: str) -> tuple[dict, str]:
    """(the namespace's tensors, stdout) after running `codes` in order, each from a file of its own (nnsight
    reads a trace's source lines from its file), in a subprocess of this interpreter."""
    paths = []
    for i, code in enumerate(codes):
        path = tmp_path / f"{name}_{i}.py"
        path.write_text(code)
        paths.append(str(path))
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run([sys.executable, "-c", RUNNER, str(tmp_path / f"{name}.pt"), *paths], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return torch.load(tmp_path / f"{name}.pt"), proc.stdout


def setup_code(out) -> str:
    """The page's setup block with OUT set to `out`."""
    setup = page_blocks()[""]
    assert len(setup) == 1 and setup[0].count(OUT_LINE) == 1
    return setup[0].replace(OUT_LINE, f"OUT = {str(out)!r}")


# ----------------------------------------------------------------------------------------------
# The native model's own view: the probe hook's keys and logits under the page's patches

def load_native(run_dir):
    from configs.files import load_run_config
    from models.llm import MinimalLLM
    from training.checkpoint import latest_checkpoint, load_model_weights
    cfg = load_run_config(run_dir / "config.json")
    model = MinimalLLM(cfg.model)
    load_model_weights(latest_checkpoint(run_dir / "checkpoints").path, model)
    return model.eval()


def probe_sites(model, ids) -> list[dict[str, torch.Tensor]]:
    """Per layer the probe's k_norm and k_rope sites ([K, B, T, D], probe_tensors) and the key projection
    ([B, T, K, D]), on ids."""
    return [{"k_norm": t["k_norm"], "k_rope": t["k_rope"], "k_proj": t.get("k_proj", t["k_norm"]).permute(1, 2, 0, 3)}
            for t in probe_tensors(model, ids, keep_proj=True)]


@torch.no_grad()
def patched_logits(model, ids, layer: int, patch) -> torch.Tensor:
    """Logits with hook_k_norm's output ([B, T, K, D]) of `layer` replaced by patch(output)."""
    handle = model.blocks[layer].attn.hook_k_norm.register_forward_hook(lambda m, i, out: patch(out))
    try:
        return model(ids)
    finally:
        handle.remove()


def assert_keys_equal_probe(keys, sites, cfg):
    """keys [B, K, T, D] per layer (transformers' layout) equal the probe's k_norm site [K, B, T, D]."""
    assert len(keys) == cfg.n_layers
    R = forward_rel_tol(cfg.n_layers, cfg.d_model)
    for k, site in zip(keys, sites):
        ref = site["k_norm"]
        assert k.shape == ref.permute(1, 0, 2, 3).shape
        torch.testing.assert_close(k.permute(1, 0, 2, 3), ref, atol=R * float(ref.abs().max()), rtol=0)


# ----------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def trained(tmp_path_factory, corpus_file, cache_dir):
    """A 6-step fp32 debug run (qk_norm learned, 4 query heads over 2 KV heads: GQA, and a KV head 0 that is
    not the only one) trained through train_llm.py, exported; (native model, export folder)."""
    if not any(importlib.util.find_spec(package) for package in SECTIONS):  # no training only to skip
        pytest.skip("neither nnsight nor transformer_lens is installed (optional: docs/interop.md)")
    import train_llm
    from research.export import export_run
    root = tmp_path_factory.mktemp("interop")
    args = cli_args(corpus_file, cache_dir, root / "run", 6, "--n_heads", "4", "--n_kv_heads", "2")
    args[args.index("--probe_every") + 1], args[args.index("--ckpt_every") + 1] = "0", "6"  # an option is given once
    train_llm.main(args)
    export_run(root / "run", root / "hf")
    return load_native(root / "run"), root / "hf"


def test_the_page_is_a_setup_and_one_example_per_library():
    """Runs without either library: the blocks the other tests execute are there and compile."""
    blocks = page_blocks()
    assert set(blocks) == {"", *SECTIONS.values()}
    for section in SECTIONS.values():
        assert len(blocks[section]) == 1
    setup_code("/tmp/x")
    for section, codes in blocks.items():
        for code in codes:
            compile(code, f"docs/interop.md ({section or 'setup'})", "exec")


@pytest.mark.parametrize("package", list(SECTIONS))
def test_the_pages_example_reads_and_patches_the_keys_the_probe_sees(trained, tmp_path, package):
    """The page's setup and the library's section, run as written (OUT aside): the keys they read are the
    probe's k_norm site, and the clean, patched and zeroed logits the native model's with the same patch."""
    require(package)
    native, out = trained
    cfg = native.cfg
    prefix = {"nnsight": "nn", "transformer_lens": "tl"}[package]
    ns, stdout = run_page_code([setup_code(out), *page_blocks()[SECTIONS[package]]], tmp_path, package)
    source, target = ns["source"], ns["target"]
    assert source.shape == target.shape and target.shape[1] >= 8 and not torch.equal(source, target)

    sites = probe_sites(native, target)
    assert_keys_equal_probe(ns[f"{prefix}_keys"], sites, cfg)

    layer, head = ZEROED
    source_keys = probe_sites(native, source)[PATCHED_LAYER]["k_norm"].permute(1, 2, 0, 3)  # -> [B, T, K, D]
    with torch.no_grad():
        clean = native(target)
    refs = {"clean": clean,
            "patched": patched_logits(native, target, PATCHED_LAYER, lambda keys: source_keys),
            "zeroed": patched_logits(native, target, layer, lambda keys: keys.index_fill(2, torch.tensor(head), 0))}
    atol = logit_atol(clean, cfg.n_layers, cfg.d_model)
    for name, ref in refs.items():
        torch.testing.assert_close(ns[f"{prefix}_{name}"], ref, atol=atol, rtol=0, msg=name)
        if name != "clean":  # the patch is no no-op the tolerance could hide
            assert (ref - clean).abs().max() > 1000 * atol, name
    assert stdout.count("max |logit change|") == 2

    if package == "transformer_lens":  # the page's other hook names: the projection and the keys after RoPE
        cache, R = ns["cache"], forward_rel_tol(cfg.n_layers, cfg.d_model)
        for i, site in enumerate(sites):
            assert torch.equal(cache[f"blocks.{i}.attn.hook_k_normed"], cache[f"blocks.{i}.attn.k_norm.hook_out"])
            for hook, ref in (("hook_k", site["k_proj"]), ("hook_rot_k", site["k_rope"].permute(1, 2, 0, 3))):
                got = cache[f"blocks.{i}.attn.{hook}"]
                torch.testing.assert_close(got, ref, atol=R * float(ref.abs().max()), rtol=0, msg=hook)


NONE_KEYS = {  # the page's names for the keys of a qk_norm none export; [B, K, T, D] each, as the other keys
    "nnsight": """
import nnsight
from nnsight import TransformersModel
lm = TransformersModel(OUT, task="text-generation", dtype=torch.float32, dispatch=True)
B, T = ids.shape
K, D = lm.config.num_key_value_heads, lm.config.head_dim
with lm.trace(ids):
    proj = nnsight.save([layer.self_attn.k_proj.output for layer in lm.model.layers])
keys = [k.view(B, T, K, D).transpose(1, 2) for k in proj]
""",
    "transformer_lens": """
from transformer_lens import TransformerBridge
bridge = TransformerBridge.boot_transformers(OUT, dtype=torch.float32, device="cpu")
_, cache = bridge.run_with_cache(ids)
keys = [cache[f"blocks.{i}.attn.hook_k"].transpose(1, 2) for i in range(bridge.cfg.n_layers)]
""",
}


@pytest.mark.parametrize("package", list(SECTIONS))
def test_a_none_export_has_its_keys_where_the_page_says(tmp_path, package):
    """qk_norm none (ArceeForCausalLM, no k_norm): the probe's k_norm site is the raw projection, which the
    page reads at self_attn.k_proj (nnsight) and attn.hook_k (TransformerLens). An untrained run with random
    weights (4 query heads over 2 KV heads) on random ids."""
    require(package)
    from research.export import export_run
    from tests.research.export.test_export_hf import make_run
    native = make_run(tmp_path / "run", "none")
    export_run(tmp_path / "run", tmp_path / "hf")
    ids = torch.randint(0, native.cfg.vocab_size, (1, 24), generator=torch.Generator().manual_seed(0))
    torch.save(ids, tmp_path / "ids.pt")
    setup = f"import torch\nOUT = {str(tmp_path / 'hf')!r}\nids = torch.load({str(tmp_path / 'ids.pt')!r})\n"
    ns, _ = run_page_code([setup, NONE_KEYS[package]], tmp_path, package)
    assert_keys_equal_probe(ns["keys"], probe_sites(native, ids), native.cfg)
