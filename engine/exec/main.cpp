// SPDX-License-Identifier: Apache-2.0
// shardscope-engine: the LibTorch side of ShardScope, run as its own process so the
// `shardscope` command line never loads LibTorch (0.4 s and ~470 MB at start-up). The
// command line runs it for `doctor` and for each rank of `run`; torchrun, SLURM or mpirun
// can launch `shardscope-engine worker` directly with the torchrun environment.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <string>
#include <vector>

#include <c10/util/Exception.h>

#include "engine/exec/measure.h"
#include "engine/exec/runtime_info.h"
#include "engine/exec/worker.h"

namespace {
const char* kUsage =
    "usage: shardscope-engine runtime-info\n"
    "         prints what LibTorch offers this process (versions, CUDA devices, a real Gloo\n"
    "         all-reduce) as JSON; `shardscope doctor` runs it.\n"
    "       shardscope-engine recorder-cost\n"
    "         times what the CPU recorder adds per allocation and per op (JSON);\n"
    "         scripts/bench_recorder_overhead.py uses it\n"
    "       shardscope-engine measure --out FILE [--device cpu|cuda] [--threads N] [--reps N]\n"
    "                                 [--quick] [--timeout-s S]\n"
    "         microbenchmarks of this machine for `shardscope calibrate --measure` (GEMMs,\n"
    "         copies, attention, launch cost; collectives over the torchrun ranks)\n"
    "       shardscope-engine worker --model CONFIG --plan PLAN [options]\n"
    "         one rank of a real FSDP run; `shardscope run` starts these. Under torchrun:\n"
    "           torchrun --nproc-per-node 2 --no-python shardscope-engine worker \\\n"
    "             --model M --plan P --out 'rank{rank}.json'\n"
    "         options: --steps N (3) --warmup N (1) --batch B --seq S --micro-batches N\n"
    "                  --timeout-s S (60) --threads N (1) --seed N --out FILE (stdout;\n"
    "                  {rank} in FILE becomes the rank)\n"
    "                  --dump-params FILE (rank 0 writes the full parameters after training)\n"
    "                  --dump-initial FILE (the same, before the first step)\n"
    "                  --reference W (no FSDP: one process replays the data of W ranks)\n"
    "                  --device cpu|cuda (cpu: Gloo; cuda: cuda:LOCAL_RANK with NCCL, and\n"
    "                  the GPU work recorded with CUPTI unless --no-device-trace)\n";
}

int main(int argc, char** argv) {
    if (argc >= 2 && std::strcmp(argv[1], "runtime-info") == 0) {
        const std::string out = shardscope::exec::runtimeInfo().dump(2) + "\n";
        std::fwrite(out.data(), 1, out.size(), stdout);
        return 0;
    }
    if (argc >= 2 && std::strcmp(argv[1], "recorder-cost") == 0)
        return shardscope::exec::runRecorderCost();
    const bool measure = argc >= 2 && std::strcmp(argv[1], "measure") == 0;
    if (measure || (argc >= 2 && std::strcmp(argv[1], "worker") == 0)) {
        try {
            const std::vector<std::string> rest(argv + 2, argv + argc);
            return measure ? shardscope::exec::runMeasure(rest) : shardscope::exec::runWorker(rest);
        } catch (const c10::Error& e) {
            std::fprintf(stderr, "shardscope-engine: error: %s\n", e.what_without_backtrace());
            return 1;
        } catch (const std::exception& e) {
            const char* rank = std::getenv("RANK");
            std::fprintf(stderr, "shardscope-engine%s%s: error: %s\n", rank ? " rank " : "",
                         rank ? rank : "", e.what());
            return 1;
        }
    }
    std::fputs(kUsage, stderr);
    return argc >= 2 && (std::strcmp(argv[1], "--help") == 0 || std::strcmp(argv[1], "-h") == 0)
               ? 0
               : 2;
}
