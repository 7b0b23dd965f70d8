# SPDX-License-Identifier: Apache-2.0
"""Benchmark: ShardScope's C++ engine against PyTorch's own FSDP2, side by side.

The same Llama-style model (a Hugging Face config), the same plan (every decoder layer a
unit, reshard_after_forward left to FSDP2's default: True, the root False), the same
micro-batch, AdamW, fp32, 2 CPU ranks over Gloo with one thread each, run one after the
other on this machine:

  * ours:    `shardscope run --json` (shardscope-engine ranks);
  * PyTorch: transformers' LlamaForCausalLM with torch.distributed.fsdp.fully_shard.

Printed: mean step time over the measured steps (slowest rank), and each step's working
memory: the CPU allocator's peak during the last step above what was allocated when it
started (ours from the engine's allocator hook; PyTorch's from the profiler's memory events,
which count the same c10 CPU allocator). Ratios are ours / PyTorch's; goal <= 1 on both.

  python scripts/bench_engine_vs_fsdp2.py [--model CONFIG] [--seq S] [--batch B] [--steps N]
"""
import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pytorch_rank(rank, world, port, cfg_path, batch, seq, warmup, steps, out_dir):
    import torch
    import torch.distributed as dist
    import transformers
    from torch.distributed.fsdp import fully_shard

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    with open(cfg_path) as f:
        cfg = json.load(f)
    config = transformers.LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("architectures", "model_type")})
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).float()
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    gen = torch.Generator().manual_seed(1234)
    total = warmup + steps
    data = torch.randint(0, config.vocab_size, (total + 1, world, batch, seq), generator=gen)

    def step(i):
        tokens = data[i][rank]
        loss = model(input_ids=tokens, labels=tokens).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    times = []
    for i in range(total):
        t0 = time.perf_counter_ns()
        step(i)
        t1 = time.perf_counter_ns()
        if i >= warmup:
            times.append(t1 - t0)
    # One more step under the profiler for the allocator's memory events.
    trace = os.path.join(out_dir, "pytorch_rank%d.json" % rank)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        step(total)
    prof.export_chrome_trace(trace)
    with open(trace) as f:
        events = json.load(f)["traceEvents"]
    peak = max((e["args"].get("Total Allocated", 0) for e in events if e.get("name") == "[memory]"), default=0)
    with open(os.path.join(out_dir, "pytorch_rank%d_result.json" % rank), "w") as f:
        json.dump({"step_times_ns": times, "step_working_bytes": peak}, f)
    # Both ranks leave together and skip interpreter teardown: PyTorch's Gloo/TCPStore
    # teardown in spawned workers sometimes aborted with "terminate called without an
    # active exception" (a joinable thread destroyed) after all the work was done.
    dist.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=os.path.join(ROOT, "samples/models/tiny-llama/config.json"))
    ap.add_argument("--bin", default=os.path.join(ROOT, "build/engine/shardscope"))
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--nproc", type=int, default=2)
    ap.add_argument("--keep", metavar="DIR", help="keep PyTorch's profiler traces and our trace in DIR")
    a = ap.parse_args()
    if not os.path.exists(a.bin):
        sys.exit("error: %s not found; build first (bash scripts/setup.sh test)" % a.bin)
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as tmp:
        plan = {
            "format": "shardscope.plan", "version": 1, "name": "bench: every decoder layer a unit",
            "api": "fsdp2", "mesh": {"shape": [a.nproc]},
            "wrap": {"policy": "module_class", "classes": ["LlamaDecoderLayer"]},
            "training": {"micro_batch_size": a.batch, "seq_len": a.seq},
        }
        plan_path = os.path.join(tmp, "plan.json")
        with open(plan_path, "w") as f:
            json.dump(plan, f)
        print("model %s, %d CPU ranks (Gloo, 1 thread each), micro-batch %d x %d, %d warm-up + %d measured steps"
              % (os.path.relpath(a.model, ROOT), a.nproc, a.batch, a.seq, a.warmup, a.steps), flush=True)

        print("running ShardScope's engine ...", flush=True)
        r = subprocess.run([a.bin, "run", "-m", a.model, "-p", plan_path, "--steps", str(a.steps),
                            "--warmup", str(a.warmup), "--threads", "1", "--json"]
                           + (["--trace", os.path.join(a.keep, "shardscope_trace.json")] if a.keep else []),
                           capture_output=True, text=True)
        if r.returncode != 0:
            sys.exit("error: shardscope run failed:\n" + r.stderr)
        ours = json.loads(r.stdout)
        ours_step = max(sum(x["step_times_ns"]) / len(x["step_times_ns"]) for x in ours["ranks"])
        ours_mem = max(x["last_step_peak_allocated_bytes"] - x["last_step_start_allocated_bytes"] for x in ours["ranks"])

        print("running PyTorch fully_shard ...", flush=True)
        mp.start_processes(pytorch_rank, args=(a.nproc, free_port(), a.model, a.batch, a.seq, a.warmup, a.steps, tmp),
                           nprocs=a.nproc, join=True, start_method="spawn")
        theirs = []
        for rk in range(a.nproc):
            with open(os.path.join(tmp, "pytorch_rank%d_result.json" % rk)) as f:
                theirs.append(json.load(f))
        th_step = max(sum(x["step_times_ns"]) / len(x["step_times_ns"]) for x in theirs)
        th_mem = max(x["step_working_bytes"] for x in theirs)
        if a.keep:
            for rk in range(a.nproc):
                os.replace(os.path.join(tmp, "pytorch_rank%d.json" % rk), os.path.join(a.keep, "pytorch_rank%d.json" % rk))

    print()
    print("%-28s %14s %14s %8s" % ("", "SHARDSCOPE", "PYTORCH FSDP2", "RATIO"))
    print("%-28s %11.2f ms %11.2f ms %8.2f" % ("step time (mean, slowest)", ours_step / 1e6, th_step / 1e6, ours_step / th_step))
    print("%-28s %10.2f MiB %10.2f MiB %8.2f" % ("step working memory (peak)", ours_mem / 2**20, th_mem / 2**20, ours_mem / th_mem))
    print("\nratios are ShardScope / PyTorch; <= 1 means ours is faster or smaller")


if __name__ == "__main__":
    main()
