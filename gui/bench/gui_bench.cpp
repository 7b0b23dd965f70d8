// SPDX-License-Identifier: Apache-2.0
// shardscope-gui-bench [--events N] [--ranks R] [--streams S] [--keep FILE]: the desktop
// app's speed, printed as figures (never asserted in tests; these machines are shared and
// noisy).
//  - writes a PyTorch-profiler-style trace of N GPU events (default 1,000,000 on 8 ranks x 8
//    streams, kernels and NCCL collectives) and opens it as the app does (streaming import,
//    timeline rows, HTA summary, off the GUI thread): goal <= 2 s;
//  - repaints the timeline at 1920 px from the whole trace down to a few microseconds, at
//    several places: goal <= 16 ms a repaint, at most about one primitive per pixel column
//    and row (the primitives are counted and printed);
//  - scrolls the tracks in a 1080-pixel scroll area, as the app shows them: goal <= 16 ms
//    a frame.
#include <QApplication>
#include <QCommandLineParser>
#include <QElapsedTimer>
#include <QPainter>
#include <QScrollArea>
#include <QScrollBar>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include "gui/app/document.h"
#include "gui/timeline/timeline_widget.h"
#include "plans/core/atomic_write.h"
#include "plans/model/model_graph.h"
#include "profiler/import/kineto_import.h"
#include "profiler/import/synthetic_trace.h"

using namespace shardscope::gui;

namespace {

double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    if (qgetenv("QT_QPA_PLATFORM").isEmpty()) qputenv("QT_QPA_PLATFORM", "offscreen");
    QApplication app(argc, argv);
    QCommandLineParser cli;
    cli.setApplicationDescription(
        "Measures shardscope-gui: opening a trace of N events and repainting its timeline at "
        "every zoom. Prints figures; asserts nothing.");
    cli.addHelpOption();
    QCommandLineOption eventsOpt("events", "events in the generated trace (default 1000000)", "N",
                                 "1000000");
    QCommandLineOption keepOpt("keep", "write the generated trace here and keep it", "FILE");
    QCommandLineOption ranksOpt("ranks", "ranks in the generated trace (default 8)", "R", "8");
    QCommandLineOption streamsOpt("streams", "GPU streams per rank (default 8)", "S", "8");
    cli.addOption(eventsOpt);
    cli.addOption(ranksOpt);
    cli.addOption(streamsOpt);
    cli.addOption(keepOpt);
    cli.process(app);
    auto positive = [&](const QCommandLineOption& o, int64_t most) -> int64_t {
        bool ok = false;
        const int64_t v = cli.value(o).toLongLong(&ok);
        if (!ok || v <= 0 || v > most) {
            std::fprintf(stderr, "error: --%s: expected an integer from 1 to %lld, got \"%s\"\n",
                         qPrintable(o.names().front()), static_cast<long long>(most),
                         qPrintable(cli.value(o)));
            std::exit(2);
        }
        return v;
    };
    const int64_t events = positive(eventsOpt, int64_t{1} << 32);
    const int ranks = static_cast<int>(positive(ranksOpt, 1024));
    const int streams = static_cast<int>(positive(streamsOpt, 64));
    std::string path = cli.isSet(keepOpt) ? cli.value(keepOpt).toStdString() : std::string();
    if (path.empty()) {
        auto tmp = shardscope::makeTempFile("shardscope-gui-bench", ".json");
        if (!tmp) {
            std::fprintf(stderr, "shardscope-gui-bench: error: %s\n", tmp.error().c_str());
            std::exit(2);
        }
        path = *tmp;
    }
    std::printf("shardscope-gui-bench: %lld events on %d ranks x %d streams\n",
                static_cast<long long>(events), ranks, streams);
    shardscope::SyntheticTraceOptions so;
    so.events = events;
    so.ranks = ranks;
    so.streams = streams;
    shardscope::writeSyntheticTrace(path, so);
    const auto bytes = std::filesystem::file_size(path);
    std::printf("  generated %s (%.1f MB of JSON)\n", path.c_str(),
                static_cast<double>(bytes) / 1e6);

    QElapsedTimer timer;
    timer.start();
    const bool imported = static_cast<bool>(shardscope::importKinetoFile(path));
    const double importS = static_cast<double>(timer.nsecsElapsed()) * 1e-9;
    std::printf("  import alone (profiler/import, streaming): %.2f s, %.0f MB/s%s\n", importS,
                static_cast<double>(bytes) / 1e6 / importS, imported ? "" : " (failed)");
    timer.restart();
    const LoadedFile f = loadFile(QString::fromStdString(path));
    const double openS = static_cast<double>(timer.nsecsElapsed()) * 1e-9;
    if (!f.error.isEmpty() || !f.traceTimeline) {
        std::fprintf(stderr, "error: %s\n", qPrintable(f.error));
        return 1;
    }
    size_t shown = 0;
    for (const auto& r : f.traceTimeline->rows)
        shown += r.events.size();
    std::printf(
        "  open (import, timeline rows, HTA summary): %.2f s, %.0f MB/s, %zu events on %zu rows  "
        "(goal <= 2 s)\n",
        openS, static_cast<double>(bytes) / 1e6 / openS, shown, f.traceTimeline->rows.size());

    TimelineWidget w;
    w.resize(1920 + TimelineWidget::kLabelWidth, 1080);
    w.setData(f.traceTimeline);
    w.show();
    QApplication::processEvents();
    const int64_t end = f.traceTimeline->endNs;
    std::printf("\n  repaint at %d px (median of 15):\n  %14s %10s %10s %12s %16s\n",
                w.viewport().widthPx, "visible span", "where", "ms", "primitives",
                "per px per row");
    double worst = 0, worstDensity = 0;
    for (const double frac : {1.0, 1e-1, 1e-2, 1e-3, 1e-4, 1e-5}) {
        for (const double where : {0.0, 0.5, 0.9}) {
            const int64_t span =
                std::max<int64_t>(1000, static_cast<int64_t>(frac * static_cast<double>(end)));
            const auto start = static_cast<int64_t>(where * static_cast<double>(end - span));
            w.setViewport(start, start + span);
            std::vector<double> ms;
            for (int i = 0; i < 15; ++i) {
                QElapsedTimer t;
                t.start();
                w.repaint();
                ms.push_back(static_cast<double>(t.nsecsElapsed()) * 1e-6);
            }
            const size_t prims = w.lastDrawList().size();
            const double density =
                static_cast<double>(prims) /
                (static_cast<double>(w.viewport().widthPx) *
                 static_cast<double>(std::max<size_t>(1, w.visibleRows().size())));
            const double m = median(ms);
            worst = std::max(worst, m);
            worstDensity = std::max(worstDensity, density);
            char spanText[32];
            std::snprintf(spanText, sizeof spanText, "%.3f ms", static_cast<double>(span) * 1e-6);
            std::printf("  %14s %9.0f%% %10.2f %12zu %16.3f\n", spanText, where * 100, m, prims,
                        density);
        }
    }
    std::printf(
        "\n  slowest repaint %.2f ms (goal <= 16 ms); at most %.3f primitives per pixel column "
        "and row (goal: about 1)\n",
        worst, worstDensity);

    // Scrolling the tracks as the app shows them: in a scroll area of 1080 px, a step of the
    // scroll bar and the repaint it causes, down the rows and back, at a 16 ms view.
    {
        QScrollArea area;
        auto* tw = new TimelineWidget;
        tw->setData(f.traceTimeline);
        area.setWidget(tw);
        area.setWidgetResizable(true);
        area.resize(1920 + TimelineWidget::kLabelWidth, 1080);
        area.show();
        QApplication::processEvents();
        const auto span = std::max<int64_t>(1000, end / 100);
        tw->setViewport(end / 2, end / 2 + span);
        QScrollBar* bar = area.verticalScrollBar();
        std::vector<double> ms;
        const int step = TimelineWidget::kRowHeight * 3;
        for (int pass = 0; pass < 2; ++pass)
            for (int v = 0; v <= bar->maximum(); v += step) {
                QElapsedTimer t;
                t.start();
                bar->setValue(pass == 0 ? v : bar->maximum() - v);
                area.viewport()->repaint();
                ms.push_back(static_cast<double>(t.nsecsElapsed()) * 1e-6);
            }
        if (ms.empty()) {
            std::printf("\n  scrolling: the %zu rows fit 1080 px, nothing to scroll\n",
                        f.traceTimeline->rows.size());
        } else {
            std::printf(
                "\n  scrolling %zu rows by 3 rows a frame in 1080 px: median %.2f ms, slowest "
                "%.2f ms a frame over %zu frames (goal <= 16 ms)\n",
                f.traceTimeline->rows.size(), median(ms), *std::max_element(ms.begin(), ms.end()),
                ms.size());
        }
    }
    if (!cli.isSet(keepOpt)) std::filesystem::remove(path);

    // The plan editor: an edit re-resolves and re-simulates the plan (80 blocks, 512 GPUs).
    Document doc;
    const QString src = QString::fromUtf8(SHARDSCOPE_SOURCE_DIR);
    for (const char* f :
         {"/samples/models/llama3-70b/config.json", "/samples/plans/llama-per-block.json",
          "/samples/clusters/h100-sxm-64x8.json"}) {
        const LoadedFile lf = loadFile(src + f);
        if (!lf.error.isEmpty()) {
            std::fprintf(stderr, "error: %s\n", qPrintable(lf.error));
            return 1;
        }
        doc.apply(lf);
    }
    if (!doc.resolved || !doc.simulation) {
        std::fprintf(stderr, "error: the 70B sample plan did not simulate\n");
        return 1;
    }
    const shardscope::ModuleId mlp = *doc.model->findModule("model.layers.40.mlp");
    std::vector<double> edits;
    for (int i = 0; i < 20; ++i) {
        QElapsedTimer t;
        t.start();
        QString why;
        if (!doc.setModuleIsUnit(mlp, i % 2 == 0, &why)) {
            std::fprintf(stderr, "error: edit refused: %s\n", qPrintable(why));
            return 1;
        }
        edits.push_back(static_cast<double>(t.nsecsElapsed()) * 1e-6);
    }
    std::printf(
        "\n  plan edit (tick a module) on Llama-3-70B, 80 blocks, 512 GPUs: %.2f ms median to "
        "resolve, simulate and build the timeline (goal <= 100 ms)\n",
        median(edits));
    return 0;
}
