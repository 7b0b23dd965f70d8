# SPDX-License-Identifier: Apache-2.0
"""Peer test: our FSDP1 auto-wrap against PyTorch's own torch.distributed.fsdp.wrap.

PyTorch's _recursive_wrap runs with a marker wrapper that records which modules it wraps
and flags their parameters as flattened, as FullyShardedDataParallel does. Our plans with
the same policy (`shardscope plan show --json`) must choose exactly the same modules, for
size_based_auto_wrap_policy at several thresholds, ModuleWrapPolicy, and the mixed-
precision BatchNorm rule (_or_policy with _wrap_module_cls_individually).
"""
import functools
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
from torch.distributed.fsdp.wrap import (ModuleWrapPolicy, _or_policy, _recursive_wrap,  # noqa: E402
                                         _wrap_module_cls_individually, size_based_auto_wrap_policy)


class Mixed(nn.Module):
    """Nested containers, a force-leaf MultiheadAttention, BatchNorm, tied weights, frozen parts."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(500, 16)
        self.stages = nn.ModuleList([
            nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 16)),
            nn.ModuleDict({"attn": nn.MultiheadAttention(16, 2), "norm": nn.LayerNorm(16)}),
            nn.ModuleList([nn.Sequential(nn.Conv1d(16, 32, 3, padding=1), nn.BatchNorm1d(32),
                                         nn.Conv1d(32, 16, 3, padding=1)) for _ in range(2)]),
        ])
        self.frozen = nn.Linear(16, 200)
        self.frozen.requires_grad_(False)
        self.head = nn.Linear(16, 500, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        x = self.embed(tokens)
        x = self.stages[0](x)
        a, _ = self.stages[1]["attn"](x, x, x)
        x = self.stages[1]["norm"](x + a)
        y = x.transpose(1, 2)
        for conv in self.stages[2]:
            y = conv(y)
        x = y.transpose(1, 2)
        return self.head(x) + self.frozen(x).sum(-1, keepdim=True)


def build_mixed():
    return Mixed()


def torch_wrapped(model, policy):
    names = {m: n for n, m in model.named_modules()}
    wrapped = []

    class Marker(nn.Module):
        def __init__(self, module, **kwargs):
            super().__init__()
            self.module = module
            wrapped.append(names[module])
            for p in module.parameters():
                p._fsdp_flattened = True  # what FSDP's _set_fsdp_flattened does

    _recursive_wrap(model, auto_wrap_policy=policy, wrapper_cls=Marker, ignored_modules=set(),
                    ignored_params=set(), only_wrap_children=True)
    return wrapped


def our_wrapped(model_file, wrap, mixed_precision=False):
    plan = {"format": "shardscope.plan", "version": 1, "api": "fsdp1", "mesh": {"shape": [2]}, "wrap": wrap}
    if mixed_precision:
        plan["defaults"] = {"mixed_precision": {"param_dtype": "bfloat16"}}
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(plan, f)
    try:
        r = peer.shardscope("plan", "show", "--model", model_file, "--plan", f.name, "--json")
    finally:
        os.unlink(f.name)
    return [u["name"] for u in r["units"] if not u["is_root"]]


class WrapPeer(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.mkdtemp()
        cls.mixed_file = os.path.join(cls.tmp, "mixed.json")
        env = dict(os.environ, PYTHONPATH=os.path.dirname(__file__))
        subprocess.run([sys.executable, os.path.join(peer.SOURCE, "scripts", "export_model.py"), "--factory",
                        "test_wrap_peer:build_mixed", "--input", "tokens:500", "--seq", "8", "-o",
                        cls.mixed_file], check=True, env=env, capture_output=True)
        cls.llama_file = peer.sample("models", "tiny-llama", "config.json")

    def models(self):
        cfg = transformers.AutoConfig.from_pretrained(self.llama_file)
        return [("mixed", self.mixed_file, build_mixed),
                ("tiny-llama", self.llama_file, lambda: transformers.AutoModelForCausalLM.from_config(cfg))]

    def check(self, name, ours, theirs):
        # PyTorch wraps in post-order; our units are listed in forward (pre-)order.
        self.assertEqual(sorted(ours), sorted(theirs), name)
        print(f"{name}: {len(theirs)} units agree")

    def test_size_based(self):
        for name, file, build in self.models():
            for threshold in (100, 1000, 4000, 20000, 200000, 10 ** 8):
                with self.subTest(model=name, min_num_params=threshold):
                    policy = functools.partial(size_based_auto_wrap_policy, min_num_params=threshold)
                    self.check(f"{name} size>={threshold}", our_wrapped(file, {"policy": "size", "min_num_params": threshold}),
                               torch_wrapped(build(), policy))

    def test_module_wrap_policy(self):
        cases = {"mixed": [["Sequential"], ["Linear"], ["MultiheadAttention", "BatchNorm1d"]],
                 "tiny-llama": [["LlamaDecoderLayer"], ["LlamaMLP", "LlamaAttention"], ["Linear"]]}
        for name, file, build in self.models():
            for classes in cases[name]:
                with self.subTest(model=name, classes=classes):
                    model = build()
                    types = {type(m) for m in model.modules() if type(m).__name__ in classes}
                    self.check(f"{name} {classes}", our_wrapped(file, {"policy": "module_class", "classes": classes}),
                               torch_wrapped(model, ModuleWrapPolicy(types)))

    def test_batchnorm_rule_under_mixed_precision(self):
        from torch.nn.modules.batchnorm import _BatchNorm
        for threshold in (1000, 20000):
            policy = functools.partial(_or_policy, policies=[
                functools.partial(size_based_auto_wrap_policy, min_num_params=threshold),
                functools.partial(_wrap_module_cls_individually, module_classes=(_BatchNorm,))])
            theirs = torch_wrapped(build_mixed(), policy)
            self.assertTrue(any("1." in t or t.endswith(".1") for t in theirs))
            self.check(f"mixed bn-rule size>={threshold}",
                       our_wrapped(self.mixed_file, {"policy": "size", "min_num_params": threshold}, True), theirs)


if __name__ == "__main__":
    unittest.main(verbosity=2)
