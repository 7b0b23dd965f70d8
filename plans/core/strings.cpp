// SPDX-License-Identifier: Apache-2.0
#include "plans/core/strings.h"

#include <algorithm>
#include <cinttypes>
#include <cstdio>

namespace shardscope {

size_t editDistance(std::string_view a, std::string_view b) {
    std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
    for (size_t j = 0; j <= b.size(); ++j)
        prev[j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
        cur[0] = i;
        for (size_t j = 1; j <= b.size(); ++j) {
            const size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
            cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
        }
        std::swap(prev, cur);
    }
    return prev[b.size()];
}

std::string nearestName(std::string_view name, const std::vector<std::string>& candidates) {
    std::string best;
    size_t bestD = SIZE_MAX;
    for (const auto& c : candidates) {
        const size_t d = editDistance(name, c);
        if (d < bestD) {
            bestD = d;
            best = c;
        }
    }
    const size_t limit = std::max<size_t>(2, name.size() / 3);
    return bestD <= limit ? best : std::string();
}

std::string didYouMean(std::string_view name, const std::vector<std::string>& candidates) {
    const std::string n = nearestName(name, candidates);
    return n.empty() ? std::string() : " (did you mean \"" + n + "\"?)";
}

std::string formatBytes(int64_t bytes) {
    static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    double v = static_cast<double>(bytes < 0 ? -bytes : bytes);
    int u = 0;
    while (v >= 1024.0 && u < 5) {
        v /= 1024.0;
        ++u;
    }
    char buf[64];
    if (u == 0)
        std::snprintf(buf, sizeof buf, "%s%" PRId64 " B", bytes < 0 ? "-" : "",
                      bytes < 0 ? -bytes : bytes);
    else
        std::snprintf(buf, sizeof buf, "%s%.2f %s", bytes < 0 ? "-" : "", v, units[u]);
    return buf;
}

std::string formatCount(int64_t n) {
    static const char* units[] = {"", "K", "M", "B", "T"};
    double v = static_cast<double>(n < 0 ? -n : n);
    int u = 0;
    while (v >= 1000.0 && u < 4) {
        v /= 1000.0;
        ++u;
    }
    char buf[64];
    if (u == 0)
        std::snprintf(buf, sizeof buf, "%" PRId64, n);
    else
        std::snprintf(buf, sizeof buf, "%s%.2f%s", n < 0 ? "-" : "", v, units[u]);
    return buf;
}

std::string withThousands(int64_t n) {
    std::string digits = std::to_string(n < 0 ? -n : n);
    std::string out;
    const size_t len = digits.size();
    for (size_t i = 0; i < len; ++i) {
        out.push_back(digits[i]);
        if ((len - i - 1) % 3 == 0 && i + 1 < len) out.push_back(',');
    }
    return n < 0 ? "-" + out : out;
}

bool startsWith(std::string_view s, std::string_view p) {
    return s.size() >= p.size() && s.substr(0, p.size()) == p;
}
bool endsWith(std::string_view s, std::string_view p) {
    return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

std::vector<std::string> split(std::string_view s, char sep) {
    std::vector<std::string> out;
    size_t start = 0;
    while (true) {
        const size_t pos = s.find(sep, start);
        out.emplace_back(s.substr(start, pos == std::string_view::npos ? s.npos : pos - start));
        if (pos == std::string_view::npos) break;
        start = pos + 1;
    }
    return out;
}

std::string toLower(std::string_view s) {
    std::string r(s);
    for (char& ch : r)
        if (ch >= 'A' && ch <= 'Z') ch = static_cast<char>(ch - 'A' + 'a');
    return r;
}

std::string trim(std::string_view s) {
    size_t b = 0, e = s.size();
    while (b < e && (s[b] == ' ' || s[b] == '\t' || s[b] == '\n' || s[b] == '\r'))
        ++b;
    while (e > b && (s[e - 1] == ' ' || s[e - 1] == '\t' || s[e - 1] == '\n' || s[e - 1] == '\r'))
        --e;
    return std::string(s.substr(b, e - b));
}

}  // namespace shardscope
