// SPDX-License-Identifier: Apache-2.0
// shardscope-gui [FILES...] [--screenshot PNG]
#include <QApplication>
#include <QCheckBox>
#include <QCommandLineParser>
#include <QLineEdit>
#include <QScreen>
#include <QScrollArea>
#include <QScrollBar>
#include <QTimer>

#include <cstdio>

#include "gui/app/main_window.h"
#include "gui/app/recommend_view.h"
#include "gui/timeline/timeline_widget.h"

int main(int argc, char** argv) {
    // Without a display, --help, --version and --screenshot still work (offscreen); only
    // showing the window needs one, and the app says so instead of Qt aborting.
    const bool display = qEnvironmentVariableIsSet("DISPLAY") ||
                         qEnvironmentVariableIsSet("WAYLAND_DISPLAY") ||
                         qEnvironmentVariableIsSet("QT_QPA_PLATFORM");
    if (!display) qputenv("QT_QPA_PLATFORM", "offscreen");
    QApplication app(argc, argv);
    QApplication::setApplicationName("shardscope-gui");
    QApplication::setApplicationVersion(SHARDSCOPE_VERSION);
    QCommandLineParser cli;
    cli.setApplicationDescription(
        "ShardScope desktop app. Open models (Hugging Face config.json or ShardScope model JSON),\n"
        "plans, clusters, ShardScope traces and PyTorch profiler traces. Tabs:\n"
        "  Plan & timeline  the module tree and units (editable: tick modules, wrap policy,\n"
        "                   per-unit settings), the simulated step or a trace per stream and\n"
        "                   rank, memory beneath; click an op, shift-drag a range\n"
        "  Compare          two steps or traces on one time axis, with their differences\n"
        "  Recommend        the plan search's Pareto front; load or export a plan\n"
        "Keys on the timeline: wheel or W/S zoom, drag or A/D pan, F fit, Esc clear.");
    cli.addHelpOption();
    cli.addVersionOption();
    cli.addPositionalArgument("files", "model, plan and cluster JSON files to open", "[FILES...]");
    QCommandLineOption shot("screenshot",
                            "save a PNG of the window once the files are loaded, then quit", "PNG");
    cli.addOption(shot);
    QCommandLineOption selectOp("select-op", "select this op (its details panel) once loaded",
                                "OP");
    QCommandLineOption selectRange(
        "select-range", "select a time range once loaded, in ms: START:END", "START:END");
    QCommandLineOption tab("tab", "show this tab: plan, compare or recommend", "TAB");
    cli.addOption(selectOp);
    cli.addOption(selectRange);
    QCommandLineOption search("search",
                              "run the Recommend tab's plan search once loaded (the screenshot "
                              "waits for it)");
    QCommandLineOption flows("flows", "show launch-to-kernel flows once loaded");
    QCommandLineOption view("view", "zoom the timeline to this range once loaded, in ms: START:END",
                            "START:END");
    QCommandLineOption find("find",
                            "type TEXT in the timeline's search box once loaded and go to its "
                            "first match (Enter)",
                            "TEXT");
    QCommandLineOption pin("pin",
                           "pin the track named TRACK once loaded (\"rank 3 \u00b7 compute\" or "
                           "\"compute\"; the option repeats)",
                           "TRACK");
    QCommandLineOption scrollDown("scroll-to-end", "scroll the tracks to their end once loaded");
    cli.addOption(pin);
    cli.addOption(scrollDown);
    cli.addOption(flows);
    cli.addOption(view);
    cli.addOption(find);
    cli.addOption(tab);
    cli.addOption(search);
    cli.process(app);

    if (!display && cli.value(shot).isEmpty()) {
        std::fprintf(stderr,
                     "shardscope-gui: no display: neither DISPLAY nor WAYLAND_DISPLAY is set. Run "
                     "it in a desktop session, under xvfb-run, or render the window to a file "
                     "with --screenshot PNG.\n");
        return 2;
    }
    // A screenshot run is unattended: a file that cannot be opened is reported on stderr, not
    // in a modal dialog that would block it.
    if (cli.isSet(shot)) qputenv("SHARDSCOPE_GUI_NO_DIALOGS", "1");
    shardscope::gui::MainWindow w;
    w.show();
    const QString png = cli.value(shot);
    const QString op = cli.value(selectOp), range = cli.value(selectRange),
                  tabName = cli.value(tab);
    const bool runSearch = cli.isSet(search);
    const bool showFlows = cli.isSet(flows);
    const QString viewRange = cli.value(view);
    const QString findText = cli.value(find);
    const QStringList pins = cli.values(pin);
    const bool toEnd = cli.isSet(scrollDown);
    auto shoot = [&w, png] {
        if (png.isEmpty()) return;
        // Let the layout settle for one event loop turn before grabbing.
        QTimer::singleShot(200, &w, [&w, png] {
            const bool ok = w.grab().save(png);
            std::fprintf(ok ? stdout : stderr, ok ? "saved %s\n" : "could not save %s\n",
                         qPrintable(png));
            QApplication::exit(ok ? 0 : 1);
        });
    };
    w.openFiles(cli.positionalArguments(), [&w, op, range, tabName, runSearch, shoot, showFlows,
                                            viewRange, findText, pins, toEnd] {
        if (showFlows) w.flowsBox()->setChecked(true);
        for (const QString& name : pins) {
            const auto& rows = w.timeline()->data()->rows;
            for (size_t r = 0; rows.size() > r; ++r) {
                if (rows[r].depth == 0 && (name.toStdString() == trackName(rows[r]) ||
                                           name.toStdString() == rows[r].name))
                    w.timeline()->setPinned(static_cast<int>(r), true);
            }
        }
        if (toEnd) {
            QScrollBar* bar = w.timelineScroll()->verticalScrollBar();
            bar->setValue(bar->maximum());
        }
        if (!viewRange.isEmpty()) {
            const QStringList p = viewRange.split(':');
            if (p.size() == 2)
                w.timeline()->setViewport(static_cast<int64_t>(p[0].toDouble() * 1e6),
                                          static_cast<int64_t>(p[1].toDouble() * 1e6));
        }
        if (!op.isEmpty()) w.selectOp(op.toInt());
        if (!findText.isEmpty()) {
            w.searchEdit()->setText(findText);
            w.findNext();
        }
        if (!range.isEmpty()) {
            const QStringList p = range.split(':');
            if (p.size() == 2)
                w.selectRange(static_cast<int64_t>(p[0].toDouble() * 1e6),
                              static_cast<int64_t>(p[1].toDouble() * 1e6));
        }
        if (!tabName.isEmpty()) w.showTab(tabName);
        if (runSearch) {
            w.showTab("recommend");
            QObject::connect(w.recommendView(), &shardscope::gui::RecommendView::finished, &w,
                             shoot);
            w.recommendView()->start();
            return;
        }
        shoot();
    });
    if (!png.isEmpty() && cli.positionalArguments().isEmpty()) {
        QTimer::singleShot(200, &w, [&w, png] { QApplication::exit(w.grab().save(png) ? 0 : 1); });
    }
    return QApplication::exec();
}
