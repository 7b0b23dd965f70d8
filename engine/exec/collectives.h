// SPDX-License-Identifier: Apache-2.0
#pragma once
// How the engine issues c10d collectives and times them: each collective is one op of the
// Recorder, ended when every work of it has completed (from the works' futures, or from a
// watcher thread for works without one), or, in blocking mode, waited for where it was
// issued and timed by Gloo's own spans of its works, as torch.profiler shows PyTorch's.
#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include "engine/exec/recorder.h"

namespace shardscope::exec {

// Gloo's own span of a collective: its worker thread opens a "gloo:<collective>"
// RecordFunction when it starts the work and ends it when the work is done (the ranges
// torch.profiler shows on Gloo's threads, which the trace analysis times PyTorch's
// collectives by). observeGlooSpans registers the observer once per process; it must be
// in place before a work is created.
void observeGlooSpans();
// The spans recorded since the last call, [start, end) in nowNs() time.
std::vector<std::pair<int64_t, int64_t>> takeGlooSpans();

// One collective as c10d works: one work, or N in-place broadcasts/reduces on Gloo.
struct Collective {
    std::vector<c10::intrusive_ptr<c10d::Work>> works;
    void wait() const {
        for (const auto& w : works)
            w->wait();
    }
    [[nodiscard]] bool completed() const {
        for (const auto& w : works)
            if (!w->isCompleted()) return false;
        return true;
    }
    explicit operator bool() const { return !works.empty(); }
};

class Collectives {
public:
    // `blocking`: each collective waited for where it is issued (RuntimeOptions).
    Collectives(Recorder* rec, bool blocking) : m_rec(rec), m_blocking(blocking) {}
    ~Collectives() { stop(); }
    Collectives(const Collectives&) = delete;
    Collectives& operator=(const Collectives&) = delete;

    // A collective's op begins; in blocking mode the Gloo spans of earlier collectives (the
    // losses' all-reduce, a barrier) are dropped, so that its wait takes only its own.
    size_t begin(OpKind kind, Phase phase, Stream stream, int32_t unit, int32_t mb);
    // A collective just issued: waited for here in blocking mode, else stamped when done.
    void issued(const Collective& c, size_t op);
    // Waits for it here and times it by Gloo's spans of its works (first start to last
    // end); without them (another backend), by the wait.
    void waitBlocking(const Collective& c, size_t op);
    // The watcher finishes its waits first: one Gloo work must not be waited on by two
    // threads at once (it raced and corrupted the result).
    void drain();
    void stop();

    // Gloo's all-gather and reduce-scatter go through a temporary as large as the whole
    // output (allgather flattens into one; _reduce_scatter_base clones the input and
    // all-reduces it). On Gloo the engine moves the same bytes with N in-place broadcasts
    // (all-gather) or N in-place reduces (reduce-scatter), one per rank's chunk.
    // Blocking collectives use the calls FSDP2 makes, temporaries included.
    [[nodiscard]] bool inPlaceChunks(const c10d::Backend& pg) const {
        return !m_blocking && pg.getBackendName() == "gloo";
    }
    // `out` gathered from every rank's `input` (`chunk` elements each).
    Collective allGather(c10d::Backend& pg, at::Tensor& out, at::Tensor& input, int64_t chunk);

private:
    void stampWhenDone(const Collective& c, size_t op);
    void watch();

    struct Watched {
        c10::intrusive_ptr<c10d::Work> work;
        size_t op;
        std::shared_ptr<std::atomic<int>> remaining;
    };
    Recorder* m_rec;
    bool m_blocking;
    std::mutex m_mutex;
    std::condition_variable m_cv;
    std::deque<Watched> m_queue;
    bool m_stop = false, m_busy = false;
    std::thread m_watcher;
};

}  // namespace shardscope::exec
