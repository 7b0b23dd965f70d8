// SPDX-License-Identifier: Apache-2.0
#include "plans/model/model_json.h"

#include <algorithm>
#include <unordered_map>

#include "plans/core/json_reader.h"
#include "plans/core/strings.h"

namespace shardscope {

namespace {

DType readDType(const JsonReader& r) {
    const std::string s = r.asString();
    auto d = parseDType(s);
    if (!d) r.fail("unknown dtype \"" + s + "\"" + didYouMean(s, dtypeNames()));
    return *d;
}

Shape readShape(const JsonReader& r) {
    Shape s;
    for (size_t i = 0; i < r.size(); ++i)
        s.push_back(r[i].asIntAtLeast(0));
    if (!checkedNumel(s)) r.fail("shape " + shapeToString(s) + " has too many elements");
    return s;
}

ScaledCost readScaled(const JsonReader& r) {
    if (r.size() < 2 || r.size() > 5)
        r.failExpected(
            "[per_token, per_token_seq] or [per_token, per_token_seq, fixed_per_token] (then "
            "per_position and fixed_per_token_seq), an array of two to five non-negative "
            "numbers");
    ScaledCost c{r[0].asNumber(), r[1].asNumber(), r.size() >= 3 ? r[2].asNumber() : 0.0,
                 r.size() >= 4 ? r[3].asNumber() : 0.0, r.size() == 5 ? r[4].asNumber() : 0.0};
    if (c.perToken < 0 || c.perTokenSeq < 0 || c.fixedPerToken < 0 || c.perPosition < 0 ||
        c.fixedPerTokenSeq < 0)
        r.fail("costs must be non-negative");
    return c;
}

nlohmann::json scaledJson(const ScaledCost& c) {
    if (c.fixedPerTokenSeq != 0)
        return nlohmann::json::array(
            {c.perToken, c.perTokenSeq, c.fixedPerToken, c.perPosition, c.fixedPerTokenSeq});
    if (c.perPosition != 0)
        return nlohmann::json::array({c.perToken, c.perTokenSeq, c.fixedPerToken, c.perPosition});
    if (c.fixedPerToken != 0)
        return nlohmann::json::array({c.perToken, c.perTokenSeq, c.fixedPerToken});
    return nlohmann::json::array({c.perToken, c.perTokenSeq});
}

// "kernels": {"gemms": [[m_per_token, n, k, calls, backward], ...], "attention_calls": N,
//              "mem": [forward, backward]}
void readKernels(const JsonReader& r, ModuleCost& c) {
    r.allowOnly({"gemms", "attention_calls", "window_attention_calls", "eager_attention_calls",
                 "mem", "upcast_elems", "loss_vocab"});
    if (auto gs = r.find("gemms")) {
        for (size_t i = 0; i < gs->size(); ++i) {
            const JsonReader x = (*gs)[i];
            if (x.size() < 3 || x.size() > 5)
                x.failExpected("[m_per_token, n, k] or [m_per_token, n, k, calls, backward]");
            ModuleCost::Gemm gm{x[0].asNumber(), x[1].asNumber(), x[2].asNumber(), 1, true};
            if (gm.mPerToken <= 0 || gm.n <= 0 || gm.k <= 0) x.fail("m, n and k must be positive");
            if (x.size() >= 4) gm.calls = static_cast<int32_t>(x[3].asIntAtLeast(1));
            if (x.size() == 5) gm.backward = x[4].asBool();
            c.addGemm(gm);
        }
    }
    if (auto a = r.find("attention_calls"))
        c.attentionCalls = static_cast<int32_t>(std::min<int64_t>(a->asIntAtLeast(0), 1 << 20));
    if (auto a = r.find("window_attention_calls")) {
        c.windowAttentionCalls =
            static_cast<int32_t>(std::min<int64_t>(a->asIntAtLeast(0), 1 << 20));
        if (c.windowAttentionCalls > c.attentionCalls)
            a->fail("more window attention calls than attention_calls (" +
                    std::to_string(c.attentionCalls) + ")");
    }
    if (auto a = r.find("eager_attention_calls"))
        c.eagerAttentionCalls =
            static_cast<int32_t>(std::min<int64_t>(a->asIntAtLeast(0), 1 << 20));
    if (auto m = r.find("mem")) {
        if (m->size() != 2) m->failExpected("[forward, backward], two kernel counts");
        c.fwdMemKernels = static_cast<int32_t>(std::min<int64_t>((*m)[0].asIntAtLeast(0), 1 << 20));
        c.bwdMemKernels = static_cast<int32_t>(std::min<int64_t>((*m)[1].asIntAtLeast(0), 1 << 20));
    }
    if (auto u = r.find("upcast_elems")) {
        c.upcastElems = u->asNumber();
        if (!(c.upcastElems >= 0) || c.upcastElems > 1e12)
            u->failExpected("elements per token, at least 0");
    }
    if (auto v = r.find("loss_vocab")) {
        c.lossVocab = v->asNumber();
        if (!(c.lossVocab >= 0) || c.lossVocab > 1e12)
            v->failExpected("a vocabulary size, at least 0");
    }
}

nlohmann::json kernelsJson(const ModuleCost& c) {
    nlohmann::json k = nlohmann::json::object();
    if (!c.gemms.empty()) {
        auto& gs = k["gemms"] = nlohmann::json::array();
        for (const auto& gm : c.gemms)
            gs.push_back({gm.mPerToken, gm.n, gm.k, gm.calls, gm.backward});
    }
    if (c.attentionCalls > 0) k["attention_calls"] = c.attentionCalls;
    if (c.windowAttentionCalls > 0) k["window_attention_calls"] = c.windowAttentionCalls;
    if (c.eagerAttentionCalls > 0) k["eager_attention_calls"] = c.eagerAttentionCalls;
    if (c.fwdMemKernels > 0 || c.bwdMemKernels > 0)
        k["mem"] = nlohmann::json::array({c.fwdMemKernels, c.bwdMemKernels});
    if (c.upcastElems > 0) k["upcast_elems"] = c.upcastElems;
    if (c.lossVocab > 0) k["loss_vocab"] = c.lossVocab;
    return k;
}

void readCost(const JsonReader& r, ModuleCost& c) {
    r.allowOnly({"fwd_flops", "bwd_flops", "fwd_mem_bytes", "bwd_mem_bytes", "saved_bytes",
                 "window_saved_bytes", "below_fp32_saved_bytes", "compiled", "output_bytes",
                 "input_bytes", "kernels"});
    if (auto x = r.find("kernels")) readKernels(*x, c);
    if (auto x = r.find("fwd_flops")) c.fwdFlops = readScaled(*x);
    if (auto x = r.find("bwd_flops")) c.bwdFlops = readScaled(*x);
    if (auto x = r.find("fwd_mem_bytes")) c.fwdMemBytes = readScaled(*x);
    if (auto x = r.find("bwd_mem_bytes")) c.bwdMemBytes = readScaled(*x);
    if (auto x = r.find("saved_bytes")) c.savedBytes = readScaled(*x);
    if (auto x = r.find("window_saved_bytes")) c.windowSavedBytes = readScaled(*x);
    if (auto x = r.find("below_fp32_saved_bytes")) c.belowFp32SavedBytes = readScaled(*x);
    if (auto x = r.find("compiled")) {
        // The subtree compiled as one region: saved bytes, fused memory-bound bytes and
        // kernel counts ([forward, backward]).
        x->allowOnly({"saved_bytes", "fwd_mem_bytes", "bwd_mem_bytes", "mem"});
        auto& k = c.compiled;
        k.savedBytes = readScaled(x->at("saved_bytes"));
        if (auto y = x->find("fwd_mem_bytes")) k.fwdMemBytes = readScaled(*y);
        if (auto y = x->find("bwd_mem_bytes")) k.bwdMemBytes = readScaled(*y);
        if (auto m = x->find("mem")) {
            if (m->size() != 2) m->failExpected("[forward, backward], two kernel counts");
            k.fwdMemKernels =
                static_cast<int32_t>(std::min<int64_t>((*m)[0].asIntAtLeast(0), 1 << 20));
            k.bwdMemKernels =
                static_cast<int32_t>(std::min<int64_t>((*m)[1].asIntAtLeast(0), 1 << 20));
        }
    }
    if (auto x = r.find("output_bytes")) c.outputBytes = readScaled(*x);
    if (auto x = r.find("input_bytes")) c.inputBytes = readScaled(*x);
}

bool validLocalName(const std::string& s) {
    return !s.empty() && s.find('.') == std::string::npos;
}

ModelGraph parseModel(const JsonReader& r) {
    r.checkFormat(kModelFormat, kModelVersion);
    r.allowOnly({"format", "version", "name", "source", "activation_dtype", "measured_at",
                 "sliding_window", "modules", "total_params"});
    ModelGraph g;
    g.name = r.optString("name").value_or("");
    g.source = r.optString("source").value_or(kModelFormat);
    if (auto a = r.find("activation_dtype")) g.activationDtype = readDType(*a);
    if (auto w = r.find("sliding_window")) g.slidingWindow = w->asIntAtLeast(1);
    if (auto m = r.find("measured_at")) {
        m->allowOnly({"batch", "seq"});
        g.measuredBatch = m->at("batch").asIntAtLeast(1);
        g.measuredSeq = m->at("seq").asIntAtLeast(1);
    }
    const JsonReader mods = r.at("modules");
    if (mods.size() == 0) mods.fail("a model needs at least the root module");
    std::unordered_map<std::string, ModuleId> byName;
    std::vector<std::string> fqnOf;  // by ModuleId, before finalize() assigns names
    struct PendingTie {
        ModuleId owner;
        std::string local;
        std::string target;
        JsonReader where;
    };
    std::vector<PendingTie> ties;
    for (size_t i = 0; i < mods.size(); ++i) {
        const JsonReader m = mods[i];
        m.allowOnly(
            {"name", "class", "bases", "keep_fp32", "params", "tied_params", "buffers", "cost"});
        const std::string fqn = m.getString("name");
        ModuleId id;
        if (i == 0) {
            if (!fqn.empty()) m.at("name").fail("the first module must be the root, named \"\"");
            id = g.root();
        } else {
            if (fqn.empty()) m.at("name").fail("only the first module may be the root \"\"");
            if (byName.count(fqn)) m.at("name").fail("duplicate module \"" + fqn + "\"");
            const size_t dot = fqn.rfind('.');
            const std::string parentName = dot == std::string::npos ? "" : fqn.substr(0, dot);
            const std::string local = dot == std::string::npos ? fqn : fqn.substr(dot + 1);
            if (!validLocalName(local))
                m.at("name").fail("empty name component in \"" + fqn + "\"");
            auto p = byName.find(parentName);
            if (p == byName.end())
                m.at("name").fail("parent module \"" + parentName + "\" must be listed before \"" +
                                  fqn + "\"");
            id = g.addModule(p->second, local, "");
        }
        byName[fqn] = id;
        fqnOf.resize(std::max(fqnOf.size(), id.index() + 1));
        fqnOf[id.index()] = fqn;
        g.setModuleClass(
            id, m.getString("class"),
            m.has("bases") ? m.at("bases").asStringList() : std::vector<std::string>{});
        if (m.optBool("keep_fp32").value_or(false)) g.setKeepFp32(id);
        if (auto ps = m.find("params")) {
            for (size_t k = 0; k < ps->size(); ++k) {
                const JsonReader p = (*ps)[k];
                p.allowOnly({"name", "shape", "dtype", "requires_grad"});
                const std::string local = p.getString("name");
                if (!validLocalName(local))
                    p.at("name").fail("parameter names are local, without dots");
                g.addParam(id, local, readShape(p.at("shape")),
                           p.has("dtype") ? readDType(p.at("dtype")) : DType::Float32,
                           p.optBool("requires_grad").value_or(true));
            }
        }
        if (auto ts = m.find("tied_params")) {
            for (size_t k = 0; k < ts->size(); ++k) {
                const JsonReader t = (*ts)[k];
                t.allowOnly({"name", "same_as"});
                ties.push_back({id, t.getString("name"), t.getString("same_as"), t.at("same_as")});
            }
        }
        if (auto bs = m.find("buffers")) {
            for (size_t k = 0; k < bs->size(); ++k) {
                const JsonReader b = (*bs)[k];
                b.allowOnly({"name", "shape", "dtype", "persistent"});
                g.addBuffer(id, {b.getString("name"), readShape(b.at("shape")),
                                 b.has("dtype") ? readDType(b.at("dtype")) : DType::Float32,
                                 b.optBool("persistent").value_or(true)});
            }
        }
        if (auto c = m.find("cost")) readCost(*c, g.cost(id));
    }
    // Ties refer to canonical names; resolve them against params declared anywhere.
    std::unordered_map<std::string, ParamId> paramByName;
    for (size_t i = 0; i < g.paramCount(); ++i) {
        const auto& o = g.param(ParamId(static_cast<int32_t>(i))).owners[0];
        const std::string& fqn = fqnOf[o.module.index()];
        paramByName[fqn.empty() ? o.localName : fqn + "." + o.localName] =
            ParamId(static_cast<int32_t>(i));
    }
    for (const auto& t : ties) {
        auto it = paramByName.find(t.target);
        if (it == paramByName.end()) {
            std::vector<std::string> names;
            for (const auto& [n, _] : paramByName)
                names.push_back(n);
            t.where.fail("tied parameter refers to unknown parameter \"" + t.target + "\"" +
                         didYouMean(t.target, names));
        }
        g.tieParam(it->second, t.owner, t.local);
    }
    if (Status s = g.finalize(); !s) r.at("modules").fail(s.error());
    if (auto tp = r.find("total_params")) {
        const int64_t declared = tp->asIntAtLeast(0);
        if (declared != g.totalParams())
            tp->fail("declares " + std::to_string(declared) + " parameters but the modules hold " +
                     std::to_string(g.totalParams()));
    }
    return g;
}

}  // namespace

Expected<ModelGraph> modelFromJson(const nlohmann::json& j, const std::string& file) {
    return catchJsonErrors<ModelGraph>([&] { return parseModel(JsonReader(j, file)); });
}

nlohmann::json modelToJson(const ModelGraph& g) {
    nlohmann::json j;
    j["format"] = kModelFormat;
    j["version"] = kModelVersion;
    j["name"] = g.name;
    j["source"] = g.source;
    j["activation_dtype"] = std::string(dtypeName(g.activationDtype));
    if (g.measuredBatch > 0)
        j["measured_at"] = {{"batch", g.measuredBatch}, {"seq", g.measuredSeq}};
    if (g.slidingWindow > 0) j["sliding_window"] = g.slidingWindow;
    j["total_params"] = g.totalParams();
    auto& mods = j["modules"] = nlohmann::json::array();
    for (size_t i = 0; i < g.moduleCount(); ++i) {
        const ModuleId id(static_cast<int32_t>(i));
        const auto& m = g.module(id);
        nlohmann::json mj;
        mj["name"] = m.fqn;
        mj["class"] = m.cls;
        if (!m.bases.empty()) mj["bases"] = m.bases;
        if (m.keepFp32) mj["keep_fp32"] = true;
        nlohmann::json params = nlohmann::json::array(), tied = nlohmann::json::array();
        for (ParamId pid : m.params) {
            const auto& p = g.param(pid);
            std::string local;
            for (const auto& o : p.owners)
                if (o.module == id) local = o.localName;
            if (p.owners[0].module == id && p.owners[0].localName == local) {
                params.push_back({{"name", local},
                                  {"shape", p.shape},
                                  {"dtype", std::string(dtypeName(p.dtype))},
                                  {"requires_grad", p.requiresGrad}});
            } else {
                tied.push_back({{"name", local}, {"same_as", p.name}});
            }
        }
        if (!params.empty()) mj["params"] = params;
        if (!tied.empty()) mj["tied_params"] = tied;
        if (!m.buffers.empty()) {
            auto& bj = mj["buffers"] = nlohmann::json::array();
            for (const auto& b : m.buffers)
                bj.push_back({{"name", b.name},
                              {"shape", b.shape},
                              {"dtype", std::string(dtypeName(b.dtype))},
                              {"persistent", b.persistent}});
        }
        const auto& c = m.cost;
        nlohmann::json cj;
        auto put = [&](const char* k, const ScaledCost& s) {
            if (!s.isZero()) cj[k] = scaledJson(s);
        };
        put("fwd_flops", c.fwdFlops);
        put("bwd_flops", c.bwdFlops);
        put("fwd_mem_bytes", c.fwdMemBytes);
        put("bwd_mem_bytes", c.bwdMemBytes);
        put("saved_bytes", c.savedBytes);
        put("window_saved_bytes", c.windowSavedBytes);
        put("below_fp32_saved_bytes", c.belowFp32SavedBytes);
        if (c.compiled.known()) {
            nlohmann::json k{{"saved_bytes", scaledJson(c.compiled.savedBytes)}};
            if (!c.compiled.fwdMemBytes.isZero())
                k["fwd_mem_bytes"] = scaledJson(c.compiled.fwdMemBytes);
            if (!c.compiled.bwdMemBytes.isZero())
                k["bwd_mem_bytes"] = scaledJson(c.compiled.bwdMemBytes);
            k["mem"] = {c.compiled.fwdMemKernels, c.compiled.bwdMemKernels};
            cj["compiled"] = k;
        }
        put("output_bytes", c.outputBytes);
        put("input_bytes", c.inputBytes);
        if (c.hasKernels() || c.upcastElems > 0 || c.lossVocab > 0) cj["kernels"] = kernelsJson(c);
        if (!cj.empty()) mj["cost"] = cj;
        mods.push_back(std::move(mj));
    }
    return j;
}

Expected<ModelGraph> loadModelFile(const std::string& path, const HfLoadOptions& hf) {
    auto j = readJsonFile(path);
    if (!j) return Error{j.error()};
    return modelFromDocument(*j, path, hf);
}

Expected<ModelGraph> modelFromDocument(const nlohmann::json& j, const std::string& path,
                                       const HfLoadOptions& hf) {
    if (looksLikeHfConfig(j)) return modelFromHfConfig(j, path, hf);
    if (j.is_object() && j.contains("format")) return modelFromJson(j, path);
    return Error{path +
                 ":/: not a model file: expected a Hugging Face config.json (with "
                 "\"model_type\") or a ShardScope model JSON (\"format\": \"" +
                 std::string(kModelFormat) + "\")"};
}

}  // namespace shardscope
