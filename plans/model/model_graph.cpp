// SPDX-License-Identifier: Apache-2.0
#include "plans/model/model_graph.h"

#include <algorithm>
#include <functional>
#include <limits>

namespace shardscope {

std::optional<int64_t> checkedNumel(const Shape& shape) {
    int64_t n = 1;
    for (int64_t d : shape) {
        if (d < 0) return std::nullopt;
        if (d != 0 && n > std::numeric_limits<int64_t>::max() / 64 / d) return std::nullopt;
        n *= d;
    }
    return n;
}

std::string shapeToString(const Shape& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); ++i) {
        if (i) s += ", ";
        s += std::to_string(shape[i]);
    }
    return s + "]";
}

ModuleCost& ModuleCost::operator+=(const ModuleCost& o) {
    fwdFlops += o.fwdFlops;
    bwdFlops += o.bwdFlops;
    fwdMemBytes += o.fwdMemBytes;
    bwdMemBytes += o.bwdMemBytes;
    savedBytes += o.savedBytes;
    windowSavedBytes += o.windowSavedBytes;
    compiled.savedBytes += o.compiled.savedBytes;
    compiled.fwdMemBytes += o.compiled.fwdMemBytes;
    compiled.bwdMemBytes += o.compiled.bwdMemBytes;
    compiled.fwdMemKernels += o.compiled.fwdMemKernels;
    compiled.bwdMemKernels += o.compiled.bwdMemKernels;
    outputBytes += o.outputBytes;
    mmOutputBytes += o.mmOutputBytes;
    addmmOutputBytes += o.addmmOutputBytes;
    sdpaOutputBytes += o.sdpaOutputBytes;
    mmCount += o.mmCount;
    lossVocab += o.lossVocab;
    lossCompiled = lossCompiled || o.lossCompiled;
    upcastElems += o.upcastElems;
    belowFp32SavedBytes += o.belowFp32SavedBytes;
    for (const Gemm& gm : o.gemms)
        addGemm(gm);
    attentionCalls += o.attentionCalls;
    windowAttentionCalls += o.windowAttentionCalls;
    eagerAttentionCalls += o.eagerAttentionCalls;
    fwdMemKernels += o.fwdMemKernels;
    bwdMemKernels += o.bwdMemKernels;
    return *this;
}

void ModuleCost::addGemm(const Gemm& gm) {
    for (Gemm& x : gemms)
        if (x.mPerToken == gm.mPerToken && x.n == gm.n && x.k == gm.k &&
            x.backward == gm.backward && x.float8 == gm.float8) {
            x.calls += gm.calls;
            return;
        }
    gemms.push_back(gm);
}

ModelGraph::ModelGraph() {
    ModuleNode root;
    root.cls = "Module";
    m_modules.push_back(std::move(root));
}

ModuleId ModelGraph::addModule(ModuleId parent, std::string_view localName, std::string_view cls,
                               std::vector<std::string> bases) {
    ModuleNode n;
    n.name = std::string(localName);
    n.cls = std::string(cls);
    n.bases = std::move(bases);
    n.parent = parent;
    const ModuleId id(static_cast<int32_t>(m_modules.size()));
    m_modules.push_back(std::move(n));
    m_modules[parent.index()].children.push_back(id);
    return id;
}

ParamId ModelGraph::addParam(ModuleId owner, std::string_view localName, Shape shape, DType dtype,
                             bool requiresGrad) {
    ParamInfo p;
    p.shape = std::move(shape);
    p.dtype = dtype;
    p.requiresGrad = requiresGrad;
    p.numel = checkedNumel(p.shape).value_or(-1);
    p.owners.push_back({owner, std::string(localName)});
    const ParamId id(static_cast<int32_t>(m_params.size()));
    m_params.push_back(std::move(p));
    m_modules[owner.index()].params.push_back(id);
    return id;
}

void ModelGraph::tieParam(ParamId param, ModuleId owner, std::string_view localName) {
    m_params[param.index()].owners.push_back({owner, std::string(localName)});
    m_modules[owner.index()].params.push_back(param);
}

void ModelGraph::addBuffer(ModuleId owner, BufferInfo buffer) {
    m_modules[owner.index()].buffers.push_back(std::move(buffer));
}

Status ModelGraph::finalize() {
    // Pre-order over children as registered (named_modules order); iterative so deep
    // trees from untrusted files cannot exhaust the stack.
    const size_t n = m_modules.size();
    std::vector<int32_t> order;
    order.reserve(n);
    std::vector<int32_t> newIndex(n, -1);
    std::vector<int32_t> stack{0};
    while (!stack.empty()) {
        const int32_t m = stack.back();
        stack.pop_back();
        if (newIndex[m] >= 0) return Error{"module tree is not a tree (module visited twice)"};
        newIndex[m] = static_cast<int32_t>(order.size());
        order.push_back(m);
        const auto& ch = m_modules[m].children;
        for (auto it = ch.rbegin(); it != ch.rend(); ++it)
            stack.push_back(it->value);
    }
    if (order.size() != n) return Error{"module tree has unreachable modules"};

    std::vector<ModuleNode> sorted;
    sorted.reserve(n);
    for (int32_t old : order) {
        ModuleNode node = std::move(m_modules[old]);
        if (node.parent.valid()) node.parent = ModuleId(newIndex[node.parent.index()]);
        for (auto& c : node.children)
            c = ModuleId(newIndex[c.index()]);
        sorted.push_back(std::move(node));
    }
    m_modules = std::move(sorted);
    for (auto& p : m_params)
        for (auto& o : p.owners)
            o.module = ModuleId(newIndex[o.module.index()]);

    // Names, depths, subtree ends (children follow their parent in pre-order).
    m_moduleIndex.clear();
    for (size_t i = 0; i < n; ++i) {
        auto& node = m_modules[i];
        if (i == 0) {
            node.fqn.clear();
            node.depth = 0;
        } else {
            const auto& parent = m_modules[node.parent.index()];
            node.fqn = parent.fqn.empty() ? node.name : parent.fqn + "." + node.name;
            node.depth = parent.depth + 1;
        }
        node.subtreeEnd = static_cast<int32_t>(i + 1);
        if (!m_moduleIndex.emplace(node.fqn, static_cast<int32_t>(i)).second)
            return Error{"duplicate module name \"" + node.fqn + "\""};
    }
    for (size_t i = n; i-- > 1;) {
        auto& parent = m_modules[m_modules[i].parent.index()];
        parent.subtreeEnd = std::max(parent.subtreeEnd, m_modules[i].subtreeEnd);
    }

    // Parameters in named_parameters() order: pre-order over modules, direct params in
    // registration order, each tied parameter at its first occurrence.
    std::vector<int32_t> paramOrder;
    std::vector<int32_t> paramNew(m_params.size(), -1);
    for (const auto& node : m_modules)
        for (ParamId p : node.params)
            if (paramNew[p.index()] < 0) {
                paramNew[p.index()] = static_cast<int32_t>(paramOrder.size());
                paramOrder.push_back(p.value);
            }
    if (paramOrder.size() != m_params.size()) return Error{"parameter without an owner"};
    std::vector<ParamInfo> params;
    params.reserve(m_params.size());
    for (int32_t old : paramOrder)
        params.push_back(std::move(m_params[old]));
    m_params = std::move(params);
    for (auto& node : m_modules)
        for (auto& p : node.params)
            p = ParamId(paramNew[p.index()]);

    m_paramIndex.clear();
    for (size_t i = 0; i < m_params.size(); ++i) {
        auto& p = m_params[i];
        if (p.numel < 0)
            return Error{"parameter shape " + shapeToString(p.shape) + " is negative or too large"};
        // Owners sorted by module pre-order so the first is the canonical name.
        std::stable_sort(
            p.owners.begin(), p.owners.end(),
            [](const ParamOwner& a, const ParamOwner& b) { return a.module < b.module; });
        for (size_t k = 0; k < p.owners.size(); ++k) {
            const auto& o = p.owners[k];
            const auto& mfqn = m_modules[o.module.index()].fqn;
            const std::string full = mfqn.empty() ? o.localName : mfqn + "." + o.localName;
            if (k == 0) p.name = full;
            if (!m_paramIndex.emplace(full, static_cast<int32_t>(i)).second)
                return Error{"duplicate parameter name \"" + full + "\""};
        }
    }

    // Subtree sums: a parameter counts in every subtree that contains any of its owners,
    // once. Walk each parameter's owners' ancestor chains and mark.
    m_subtreeNumel.assign(n, 0);
    m_subtreeBytes.assign(n, 0);
    std::vector<int32_t> mark(n, -1);
    for (size_t i = 0; i < m_params.size(); ++i) {
        const auto& p = m_params[i];
        for (const auto& o : p.owners) {
            for (int32_t m = o.module.value; m >= 0;
                 m = m_modules[m].parent.valid() ? m_modules[m].parent.value : -1) {
                if (mark[m] == static_cast<int32_t>(i)) break;
                mark[m] = static_cast<int32_t>(i);
                if (m_subtreeNumel[m] > std::numeric_limits<int64_t>::max() / 2 - p.numel)
                    return Error{"total parameter count overflows"};
                m_subtreeNumel[m] += p.numel;
                m_subtreeBytes[m] += p.bytes();
            }
        }
    }
    return {};
}

std::optional<ModuleId> ModelGraph::findModule(std::string_view fqn) const {
    auto it = m_moduleIndex.find(std::string(fqn));
    if (it == m_moduleIndex.end()) return std::nullopt;
    return ModuleId(it->second);
}

std::optional<ParamId> ModelGraph::findParam(std::string_view fqn) const {
    auto it = m_paramIndex.find(std::string(fqn));
    if (it == m_paramIndex.end()) return std::nullopt;
    return ParamId(it->second);
}

std::vector<std::string> ModelGraph::moduleNames() const {
    std::vector<std::string> out;
    out.reserve(m_modules.size());
    for (const auto& m : m_modules)
        out.push_back(m.fqn);
    return out;
}

bool ModelGraph::isInstance(ModuleId m, std::string_view cls) const {
    const auto& node = m_modules[m.index()];
    if (node.cls == cls) return true;
    for (const auto& b : node.bases)
        if (b == cls) return true;
    return false;
}

bool ModelGraph::isContainer(ModuleId m) const {
    return isInstance(m, "ModuleList") || isInstance(m, "ModuleDict");
}

std::vector<ModuleId> ModelGraph::keepFp32Modules() const {
    std::vector<ModuleId> out;
    for (size_t m = 0; m < m_modules.size(); ++m)
        if (m_modules[m].keepFp32 && !m_modules[m].params.empty())
            out.emplace_back(static_cast<int32_t>(m));
    return out;
}

int64_t ModelGraph::totalParamBytes() const {
    return m_subtreeBytes.empty() ? 0 : m_subtreeBytes[0];
}

int64_t ModelGraph::trainableParams() const {
    int64_t n = 0;
    for (const auto& p : m_params)
        if (p.requiresGrad) n += p.numel;
    return n;
}

std::vector<ParamId> ModelGraph::subtreeParams(ModuleId m) const {
    std::vector<ParamId> out;
    for (size_t i = 0; i < m_params.size(); ++i)
        for (const auto& o : m_params[i].owners)
            if (isAncestorOrSelf(m, o.module)) {
                out.emplace_back(static_cast<int32_t>(i));
                break;
            }
    return out;
}

ModuleCost ModelGraph::subtreeCost(ModuleId m) const {
    ModuleCost c;
    for (int32_t i = m.value; i < m_modules[m.index()].subtreeEnd; ++i)
        c += m_modules[i].cost;
    c.outputBytes = m_modules[m.index()].cost.outputBytes;
    return c;
}

ModuleId ModelGraph::lca(ModuleId a, ModuleId b) const {
    while (!isAncestorOrSelf(a, b))
        a = m_modules[a.index()].parent;
    return a;
}

ModuleId ModelGraph::ownersLca(ParamId p) const {
    const auto& owners = m_params[p.index()].owners;
    ModuleId l = owners.front().module;
    for (const auto& o : owners)
        l = lca(l, o.module);
    return l;
}

}  // namespace shardscope
