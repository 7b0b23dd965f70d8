#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Record real PyTorch FSDP profiler traces on local CPU ranks (Gloo) or GPUs (NCCL, --device
cuda), one file per rank.

    record_fsdp_trace.py --model samples/models/tiny-llama/config.json \\
        --plan samples/plans/tiny-llama-2rank.json --out /tmp/traces

FSDP2: the plan is exported with `shardscope plan export --format fsdp2` and applied with
samples/apply_plan.py, exactly as a user's training script would. FSDP1 (`--fsdp1`): the
plan exported with `--format fsdp1` and applied by samples/apply_fsdp1.py
(FullyShardedDataParallel with the export's policy, strategy and prefetch). The model is the Hugging Face model built from the config (random
weights, fp32 masters), trained with AdamW on random tokens under torch.profiler
(record_shapes, profile_memory): one warm-up step, then `--steps` profiled steps, each a
ProfilerStep#N range, the last one complete. Writes DIR/rank<R>.pt.trace.json and
DIR/record.json (what ran: the plan, the export, the world size).

The traces are what tests feed to `shardscope trace overlap / plan recover / trace diff`:
real FSDP labels (FSDP::all_gather (model.layers.2), FullyShardedDataParallel._pre_forward
...), c10d and Gloo collectives, and CPU memory events, from the PyTorch in our venv.
"""
import argparse
import json
import os
import socket
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "samples"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_model(config_path, torch):
    import transformers
    with open(config_path) as f:
        cfg = json.load(f)
    config = transformers.AutoConfig.for_model(**{k: v for k, v in cfg.items() if k not in ("architectures", "_name_or_path")})
    config.use_cache = False
    torch.manual_seed(1234)
    return transformers.AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").float(), config


def rank_main(rank, world, port, args, export, plan):
    from apply_plan import apply_plan, prepare_micro_batch
    import torch
    import torch.distributed as dist
    from torch.profiler import ProfilerActivity, profile, schedule

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if cuda and args.memory_history:
        # Every allocation and free of the caching allocator from the first one on, without
        # stacks: what tests replay through ShardScope's allocator model.
        torch.cuda.memory._record_memory_history(enabled="all", context=None, stacks="python",
                                                 max_entries=4_000_000)
    # On a GPU the random initialisation runs there (a 2-billion-parameter model takes a
    # minute on the host); fully_shard then shards the parameters where they are.
    with torch.device(device):
        model, config = build_model(args.model, torch)
    if args.fsdp1:
        from apply_fsdp1 import apply_fsdp1
        model = apply_fsdp1(model, export, device_id=device)
    else:
        model = apply_plan(model, export, device_type=device.type)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    training = plan.get("training", {})
    accumulation = plan.get("gradient_accumulation", {})
    micro = int(accumulation.get("micro_batches", 1))
    sync_every = bool(accumulation.get("sync_every_micro_batch", False))
    batch = args.batch or int(training.get("micro_batch_size", 1))
    seq = args.seq or int(training.get("seq_len", 64))
    gen = torch.Generator().manual_seed(100 + rank)

    straggle = None  # (rank, profiled step, seconds): that rank sleeps before the step's forward
    if args.straggle:
        sr, ss, ms = (int(x) for x in args.straggle.split(":"))
        straggle = (sr, ss, ms / 1000.0)
    calls = [0]

    def step():
        calls[0] += 1  # 1: the warm-up step; the profiled steps follow
        if straggle and rank == straggle[0] and calls[0] == straggle[1] + 2:
            import time
            time.sleep(straggle[2])
        for mb in range(micro):
            last = mb == micro - 1
            if not args.fsdp1:
                prepare_micro_batch(model, export, mb)  # as a user's script applies the plan
            tokens = torch.randint(0, config.vocab_size, (batch, seq), generator=gen).to(device)
            if args.fsdp1 and micro > 1 and not (last or sync_every):
                with model.no_sync():
                    model(input_ids=tokens, labels=tokens).loss.backward()
            else:
                model(input_ids=tokens, labels=tokens).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    if args.time_only:
        # No profiler: the steps as the training job runs them, each timed from a device
        # synchronisation to the next (rank 0 prints them; the warm-up step is not timed).
        import time
        step()
        if cuda:
            torch.cuda.synchronize()
        times = []
        for _ in range(args.steps):
            t0 = time.perf_counter()
            step()
            if cuda:
                torch.cuda.synchronize()
            times.append(1e3 * (time.perf_counter() - t0))
        if rank == 0:
            print("unprofiled steps (ms): " + " ".join(f"{t:.2f}" for t in times))
            with open(os.path.join(args.out, "steps.json"), "w") as f:
                json.dump({"step_ms": times}, f)
        dist.barrier()
        dist.destroy_process_group()
        return
    sched = schedule(wait=0, warmup=1, active=args.steps, repeat=1)
    path = os.path.join(args.out, f"rank{rank}.pt.trace.json")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities, schedule=sched, record_shapes=True,
                 profile_memory=not args.no_profile_memory,
                 on_trace_ready=lambda p: p.export_chrome_trace(path)) as prof:
        for _ in range(1 + args.steps):
            step()
            prof.step()
    if cuda and args.memory_history and rank == 0:
        write_memory_history(torch, args.memory_history)
    dist.barrier()
    dist.destroy_process_group()


def write_memory_history(torch, path):
    """The caching allocator's history as compact JSON (gzip when the name ends in .gz):
    [action, address, size, stream] per event, and PyTorch's own peaks."""
    import gzip
    snap = torch.cuda.memory._snapshot()
    events = [[e["action"], e["addr"], e["size"], e["stream"]] for e in snap["device_traces"][torch.cuda.current_device()]]
    out = {"format": "shardscope.cuda_memory_history", "torch": torch.__version__,
           "device": torch.cuda.get_device_name(), "events": events,
           "max_memory_allocated": torch.cuda.max_memory_allocated(),
           "max_memory_reserved": torch.cuda.max_memory_reserved(),
           "segments_at_end": sum(s["total_size"] for s in snap["segments"])}
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "wt") as f:
        json.dump(out, f, separators=(",", ":"))
    print(f"wrote {len(events)} allocator events to {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="Hugging Face config.json")
    ap.add_argument("--plan", required=True, help="ShardScope plan JSON (FSDP2 plans are exported and applied)")
    ap.add_argument("--out", required=True, help="folder for rank<R>.pt.trace.json and record.json")
    ap.add_argument("--steps", type=int, default=2, help="profiled steps after one warm-up step [2]")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cpu: Gloo ranks on CPU; cuda: rank R on cuda:R with NCCL, GPU kernels profiled too [cpu]")
    ap.add_argument("--memory-history", metavar="FILE",
                    help="with --device cuda: also write rank 0's caching-allocator history (every "
                         "allocation and free from the first) as JSON, gzipped if FILE ends in .gz")
    ap.add_argument("--batch", type=int, default=0, help="micro-batch size (default: the plan's)")
    ap.add_argument("--seq", type=int, default=0, help="sequence length (default: the plan's)")
    ap.add_argument("--straggle", metavar="RANK:STEP:MS",
                    help="rank RANK sleeps MS ms before the forward of profiled step STEP (0-based): a "
                         "straggler whose peers wait in that step's first collective")
    ap.add_argument("--mesh-dim-names", metavar="A,B|none",
                    help="name the DeviceMesh's dimensions so (or leave them unnamed: none), as a "
                         "user's own script may, instead of the export's names")
    ap.add_argument("--fsdp1", action="store_true", help="wrap with FSDP1 (ModuleWrapPolicy) instead of FSDP2")
    ap.add_argument("--no-profile-memory", action="store_true",
                    help="profile without memory events (profile_memory=False): less profiler work per allocation")
    ap.add_argument("--time-only", action="store_true",
                    help="no profiler: time --steps steps after a warm-up one (device-synchronised) and "
                         "write steps.json instead of traces")
    ap.add_argument("--shardscope", default=os.path.join(ROOT, "build", "engine", "shardscope"),
                    help="the shardscope binary used to export the plan")
    args = ap.parse_args()
    with open(args.plan) as f:
        plan = json.load(f)
    plan["_path"] = args.plan
    world = 1
    for n in plan["mesh"]["shape"]:
        world *= int(n)
    os.makedirs(args.out, exist_ok=True)
    # The plan as the user's script gets it: `shardscope plan export`, applied by
    # samples/apply_plan.py (FSDP2) or samples/apply_fsdp1.py (FSDP1).
    fmt = "fsdp1" if args.fsdp1 else "fsdp2"
    r = subprocess.run([args.shardscope, "plan", "export", "-m", args.model, "-p", args.plan, "-f", fmt],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"error: shardscope plan export failed:\n{r.stderr}")
    export = json.loads(r.stdout)
    if args.mesh_dim_names and "mesh" in export:
        names = [] if args.mesh_dim_names == "none" else args.mesh_dim_names.split(",")
        if names and len(names) != len(export["mesh"]["shape"]):
            raise SystemExit(f"error: --mesh-dim-names: {len(names)} names for a "
                             f"{len(export['mesh']['shape'])}-dimensional mesh")
        export["mesh"]["dim_names"] = names
    import torch.multiprocessing as mp
    mp.start_processes(rank_main, args=(world, free_port(), args, export, plan), nprocs=world,
                       join=True, start_method="spawn")
    plan.pop("_path")
    if args.time_only:
        return
    record = {"format": "shardscope.recorded_fsdp_trace", "api": "fsdp1" if args.fsdp1 else "fsdp2",
              "device": args.device, "batch": args.batch or None, "seq": args.seq or None,
              "world": world, "steps": args.steps, "plan": plan, "export": export,
              "files": [f"rank{r}.pt.trace.json" for r in range(world)]}
    with open(os.path.join(args.out, "record.json"), "w") as f:
        json.dump(record, f, indent=1)
    print(f"wrote {world} traces to {args.out}")


if __name__ == "__main__":
    main()
