// SPDX-License-Identifier: Apache-2.0
#include "engine/exec/collectives.h"

#include <ATen/record_function.h>

#include <algorithm>
#include <cstring>
#include <exception>

namespace shardscope::exec {

namespace {
struct GlooSpanContext : at::ObserverContext {
    int64_t start = 0;
};
std::mutex g_glooMutex;
std::vector<std::pair<int64_t, int64_t>> g_glooSpans;  // since the last take, [start, end)

std::unique_ptr<at::ObserverContext> glooSpanStart(const at::RecordFunction& fn) {
    const char* name = fn.name();
    if (name == nullptr || std::strncmp(name, "gloo:", 5) != 0) return nullptr;
    auto ctx = std::make_unique<GlooSpanContext>();
    ctx->start = nowNs();
    return ctx;
}
void glooSpanEnd(const at::RecordFunction& /*fn*/, at::ObserverContext* ctx) {
    if (ctx == nullptr) return;
    const int64_t end = nowNs();
    std::lock_guard lock(g_glooMutex);
    g_glooSpans.emplace_back(static_cast<GlooSpanContext*>(ctx)->start, end);
}
}  // namespace

// A global callback: it runs on Gloo's threads.
void observeGlooSpans() {
    static const bool once = [] {
        at::addGlobalCallback(at::RecordFunctionCallback(&glooSpanStart, &glooSpanEnd)
                                  .scopes({at::RecordScope::USER_SCOPE}));
        return true;
    }();
    (void)once;
}

std::vector<std::pair<int64_t, int64_t>> takeGlooSpans() {
    std::lock_guard lock(g_glooMutex);
    return std::exchange(g_glooSpans, {});
}

size_t Collectives::begin(OpKind kind, Phase phase, Stream stream, int32_t unit, int32_t mb) {
    const size_t op = m_rec->begin(kind, phase, stream, unit, mb);
    if (m_blocking) takeGlooSpans();
    return op;
}

void Collectives::issued(const Collective& c, size_t op) {
    if (m_blocking)
        waitBlocking(c, op);
    else
        stampWhenDone(c, op);
}

void Collectives::waitBlocking(const Collective& c, size_t op) {
    c.wait();
    if (op == Recorder::kNone) return;
    const auto spans = takeGlooSpans();
    if (spans.empty()) {
        m_rec->endAt(op, nowNs());
        return;
    }
    int64_t first = spans.front().first, last = spans.front().second;
    for (const auto& [b, e] : spans) {
        first = std::min(first, b);
        last = std::max(last, e);
    }
    m_rec->setStart(op, first);
    m_rec->endAt(op, last);
}

// Works with a future end the op from its callback; the others (Gloo's reduce-scatter)
// go to the watcher thread, which waits on them in issue order.
void Collectives::stampWhenDone(const Collective& c, size_t op) {
    auto remaining = std::make_shared<std::atomic<int>>(static_cast<int>(c.works.size()));
    for (const auto& w : c.works) {
        try {
            w->getFuture()->addCallback([recp = m_rec, op, remaining](c10::ivalue::Future&) {
                if (--*remaining == 0) recp->endAt(op, nowNs());
            });
            continue;
        } catch (const c10::Error&) {
        }
        std::lock_guard lock(m_mutex);
        if (!m_watcher.joinable()) m_watcher = std::thread([this] { watch(); });
        m_queue.push_back({w, op, remaining});
        m_cv.notify_all();
    }
}

void Collectives::watch() {
    for (;;) {
        Watched item;
        {
            std::unique_lock lock(m_mutex);
            m_cv.wait(lock, [&] { return m_stop || !m_queue.empty(); });
            if (m_queue.empty()) return;
            item = m_queue.front();
            m_queue.pop_front();
            m_busy = true;
        }
        try {
            item.work->wait();
        } catch (const std::exception&) {
            // The thread that needs the result sees the error on its own wait.
        }
        if (--*item.remaining == 0) m_rec->endAt(item.op, nowNs());
        std::lock_guard lock(m_mutex);
        m_busy = false;
        m_cv.notify_all();  // drain() may be waiting
    }
}

void Collectives::stop() {
    {
        std::lock_guard lock(m_mutex);
        m_stop = true;
        m_cv.notify_all();
    }
    if (m_watcher.joinable()) m_watcher.join();
}

void Collectives::drain() {
    std::unique_lock lock(m_mutex);
    m_cv.wait(lock, [&] { return m_queue.empty() && !m_busy; });
}

Collective Collectives::allGather(c10d::Backend& pg, at::Tensor& out, at::Tensor& input,
                                  int64_t chunk) {
    Collective c;
    if (!inPlaceChunks(pg)) {
        c.works.push_back(pg._allgather_base(out, input));
        return c;
    }
    for (int64_t src = 0; src < pg.getSize(); ++src) {
        std::vector<at::Tensor> t{out.narrow(0, src * chunk, chunk)};
        c10d::BroadcastOptions bo;
        bo.rootRank = src;
        c.works.push_back(pg.broadcast(t, bo));
    }
    return c;
}

}  // namespace shardscope::exec
