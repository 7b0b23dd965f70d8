# SPDX-License-Identifier: Apache-2.0
"""Peer test: per-rank sizes of our FSDP2 plans against PyTorch's real fully_shard.

Each plan is exported by `shardscope plan export --format fsdp2`, applied call by call with
torch.distributed.fsdp.fully_shard on a fake process group of 4 ranks (1D, and HSDP 2x2),
and for every unit we compare with `shardscope plan show --json`:
  * which parameters the unit manages,
  * sharded bytes per rank: sum of padded_sharded_param_size x original itemsize,
  * all-gather (unsharded) bytes per rank: shard size x padded shard x param_dtype itemsize,
  * the post-forward copy under int reshard_after_forward: sharded_post_forward_size.
Dimensions are chosen so dim-0 padding matters (10 rows over 4 ranks, etc.).
"""
import json
import os
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.dirname(__file__))
import peer  # noqa: E402

torch = peer.require("torch")
transformers = peer.require("transformers")
nn = torch.nn
import torch.distributed as dist  # noqa: E402
from torch.distributed.device_mesh import init_device_mesh  # noqa: E402
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

WORLD = 4


class Odd(nn.Module):
    """Dim-0 sizes that do not divide by 4, an uneven tail, a 1-row parameter."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(37, 6)
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(6, 10), nn.GELU(), nn.Linear(10, 6)) for _ in range(3))
        self.gate = nn.Linear(6, 1)
        self.head = nn.Linear(6, 37)

    def forward(self, t):
        x = self.embed(t)
        for b in self.blocks:
            x = x + b(x)
        return self.head(x) * self.gate(x)


def build_odd():
    return Odd()


def apply_fsdp2_export(model, export):
    """Applies a ShardScope fsdp2 export with the real fully_shard."""
    shape = tuple(export["mesh"]["shape"])
    mesh = init_device_mesh("cpu", shape, mesh_dim_names=tuple(export["mesh"]["dim_names"]))
    for call in export["fully_shard"]:
        mods = [model.get_submodule(m) if m else model for m in call["modules"]]
        kw = dict(call["kwargs"])
        if "mp_policy" in kw:
            mp = kw.pop("mp_policy")
            kw["mp_policy"] = MixedPrecisionPolicy(**{k: (getattr(torch, v.split(".")[1]) if isinstance(v, str) else v)
                                                      for k, v in mp.items()})
        fully_shard(mods if len(mods) > 1 else mods[0], mesh=mesh, **kw)
    return model


def torch_unit_sizes(model, export):
    # Lazy init normally runs at the first forward; it settles dtypes and parameter names.
    model._get_fsdp_state()._lazy_init()
    out = {}
    shard = export["mesh"]["shape"][-1]
    for call in export["fully_shard"]:
        first = call["modules"][0]
        mod = model.get_submodule(first) if first else model
        group = mod._get_fsdp_state()._fsdp_param_group
        sharded = unsharded = post = 0
        params = []
        for fp in (group.fsdp_params if group else []):
            numel = fp.padded_sharded_param_size.numel()
            orig = fp.sharded_param.dtype
            pdtype = fp.param_dtype or orig
            sharded += numel * orig.itemsize
            unsharded += shard * numel * pdtype.itemsize
            # True reshards to the shard mesh itself; only an int k keeps a separate copy.
            if fp.post_forward_mesh_info is not None and fp.post_forward_mesh_info is not fp.mesh_info:
                post += fp.sharded_post_forward_size.numel() * pdtype.itemsize
            params.append(fp._param_fqn)
        out[call["unit"]] = {"sharded": sharded, "unsharded": unsharded, "post": post, "params": sorted(params)}
    return out


class Fsdp2Sizes(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=WORLD)
        cls.tmp = tempfile.mkdtemp()
        cls.odd_file = os.path.join(cls.tmp, "odd.json")
        env = dict(os.environ, PYTHONPATH=os.path.dirname(__file__))
        subprocess.run([sys.executable, os.path.join(peer.SOURCE, "scripts", "export_model.py"), "--factory",
                        "test_fsdp2_sizes:build_odd", "--input", "tokens:37", "--seq", "4", "-o", cls.odd_file],
                       check=True, env=env, capture_output=True)

    @classmethod
    def tearDownClass(cls):
        dist.destroy_process_group()

    def run_case(self, label, model_file, build, plan):
        plan = {"format": "shardscope.plan", "version": 1, "api": "fsdp2", **plan}
        path = os.path.join(self.tmp, label.replace(" ", "_") + ".json")
        with open(path, "w") as f:
            json.dump(plan, f)
        ours = peer.shardscope("plan", "show", "--model", model_file, "--plan", path, "--json")
        self.assertEqual(ours["errors"], 0, ours["problems"])
        export = peer.shardscope("plan", "export", "--model", model_file, "--plan", path, "--format", "fsdp2")
        model = apply_fsdp2_export(build(), export)
        theirs = torch_unit_sizes(model, export)
        for u in ours["units"]:
            t = theirs[u["name"]]
            with self.subTest(case=label, unit=u["name"] or "<root>"):
                self.assertEqual(sorted(u["params"]), t["params"])
                self.assertEqual(u["sharded_bytes_per_rank"], t["sharded"])
                self.assertEqual(u["unsharded_bytes_per_rank"], t["unsharded"])
                self.assertEqual(u["post_forward_bytes"], t["post"])
        total = sum(v["sharded"] for v in theirs.values())
        print(f"{label}: {len(theirs)} units, sharded {total} B/rank, equal to fully_shard")

    def test_odd_shapes(self):
        blocks = {"policy": "name_pattern", "patterns": [r"blocks\.\d+"]}
        self.run_case("odd 1D", self.odd_file, build_odd, {"mesh": {"shape": [4]}, "wrap": blocks})
        self.run_case("odd HSDP 2x2", self.odd_file, build_odd, {"mesh": {"shape": [2, 2]}, "wrap": blocks})
        self.run_case("odd bf16 grouped", self.odd_file, build_odd, {
            "mesh": {"shape": [4]}, "wrap": blocks,
            "defaults": {"mixed_precision": {"param_dtype": "bfloat16", "reduce_dtype": "float32"}},
            "units": [{"name": "gate+head", "modules": ["gate", "head"]}]})
        self.run_case("odd int reshard 2", self.odd_file, build_odd, {
            "mesh": {"shape": [4]}, "wrap": blocks, "defaults": {"reshard_after_forward": 2}})

    def test_tiny_llama(self):
        cfg_path = peer.sample("models", "tiny-llama", "config.json")
        cfg = transformers.AutoConfig.from_pretrained(cfg_path)
        build = lambda: transformers.AutoModelForCausalLM.from_config(cfg)  # noqa: E731
        layers = {"policy": "module_class", "classes": ["LlamaDecoderLayer"]}
        self.run_case("llama 1D", cfg_path, build, {"mesh": {"shape": [4]}, "wrap": layers,
                                                   "units": [{"modules": ["model.embed_tokens"]}]})
        self.run_case("llama HSDP bf16 int", cfg_path, build, {
            "mesh": {"shape": [2, 2]}, "wrap": layers,
            "defaults": {"mixed_precision": {"param_dtype": "bfloat16"}, "reshard_after_forward": 2}})


if __name__ == "__main__":
    unittest.main(verbosity=2)
