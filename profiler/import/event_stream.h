// SPDX-License-Identifier: Apache-2.0
#pragma once
// The trace importer's first stage: a Chrome/Kineto trace file, gzip or plain, read in
// 256 KiB chunks and cut into its events without building the document. Each element of
// "traceEvents" (or of a top-level array) goes to an EventConsumer as raw JSON, in batches
// where it can; every other top-level member goes to it parsed. kineto_import.cpp's
// importer is the consumer.
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "profiler/import/kineto_import.h"

namespace shardscope::trace_stream {

class EventConsumer {
public:
    virtual ~EventConsumer() = default;
    // A top-level member other than "traceEvents" ("baseTimeNanoseconds", "metadata", ...).
    virtual void topLevel(const std::string& key, const nlohmann::ordered_json& value) = 0;
    // `count` events, back to back in [first, last) inside the reader's padded buffer
    // (readable up to readableEnd); returns how many it took (the rest go one at a time).
    virtual size_t consumeBatch(char* first, char* last, size_t count, const char* readableEnd,
                                bool escapes) = 0;
    // One event's JSON, readable `padded` bytes from its start; false with `error` set when
    // it is not valid JSON.
    virtual bool consumeRaw(std::string_view raw, size_t padded, bool escapes,
                            std::string& error) = 0;
};

struct StreamResult {
    bool opened = false;     // the file could be opened
    bool ok = false;         // the JSON was read to its end
    bool trailing = false;   // more data after the trace's JSON
    bool cancelled = false;  // KinetoImportOptions::cancel was set
    bool sawEvents = false;  // a traceEvents array (or a top-level array of events)
    std::string ioError;     // a read error (a truncated or damaged file)
    std::string error;       // where the JSON went wrong
    int64_t offset = 0;      // the byte read up to
};

// Reads `path` and hands its events to `consumer`, reporting progress and honouring
// cancellation as `o` asks.
[[nodiscard]] StreamResult streamEvents(const std::string& path, const KinetoImportOptions& o,
                                        EventConsumer& consumer);

// JSON's whitespace.
inline bool isJsonSpace(char c) {
    return c == ' ' || c == '\n' || c == '\r' || c == '\t';
}

}  // namespace shardscope::trace_stream
