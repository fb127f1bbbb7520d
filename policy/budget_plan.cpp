#include "policy/budget_plan.h"

#include <algorithm>
#include <numeric>
#include <unordered_map>
#include <unordered_set>

namespace hpac {
namespace {

// Union-find over profiled ops: two ops are one group when their outputs share a storage.
class Groups {
 public:
  explicit Groups(size_t n) : parent_(n) { std::iota(parent_.begin(), parent_.end(), 0); }
  size_t find(size_t i) {
    while (parent_[i] != i) i = parent_[i] = parent_[parent_[i]];
    return i;
  }
  void unite(size_t a, size_t b) { parent_[find(a)] = find(b); }

 private:
  std::vector<size_t> parent_;
};

struct Group {
  std::vector<size_t> members;
  int64_t bytes = 0;
  double micros = 0;
};

std::vector<Group> groupsOf(const std::vector<ProfiledOp>& ops) {
  Groups uf(ops.size());
  std::unordered_map<int64_t, size_t> owner;  // storage id -> first op holding it
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].view) continue;  // never kept (Note [Views are recomputed], replay/invocation.cpp)
    for (const auto& [id, bytes] : ops[i].storages) {
      const auto [it, inserted] = owner.emplace(id, i);
      if (!inserted) uf.unite(i, it->second);
    }
  }
  std::unordered_map<size_t, size_t> index;  // root -> group
  std::vector<Group> groups;
  std::unordered_map<int64_t, bool> counted;
  for (size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].view) continue;
    const auto [it, inserted] = index.emplace(uf.find(i), groups.size());
    if (inserted) groups.emplace_back();
    Group& g = groups[it->second];
    g.members.push_back(i);
    g.micros += ops[i].micros;
    for (const auto& [id, bytes] : ops[i].storages) {
      if (!counted[id]) {
        counted[id] = true;
        g.bytes += bytes;
      }
    }
  }
  return groups;
}

}  // namespace

int64_t totalOutputBytes(const std::vector<ProfiledOp>& ops) {
  int64_t total = 0;
  for (const Group& g : groupsOf(ops)) total += g.bytes;
  return total;
}

int64_t offKeptBytes(const std::vector<ProfiledOp>& ops, const std::vector<int64_t>& autograd_saved) {
  std::unordered_set<int64_t> saved(autograd_saved.begin(), autograd_saved.end());
  int64_t bytes = 0;
  for (const ProfiledOp& op : ops) {
    if (op.view) continue;  // a view's storage is its base's: counted with the op that made it, if any
    for (const auto& [id, size] : op.storages) {
      if (saved.erase(id) > 0) bytes += size;  // erase: each storage once
    }
  }
  return bytes;
}

BudgetPlan planBudget(const std::vector<ProfiledOp>& ops, int64_t budget_bytes) {
  const std::vector<Group> groups = groupsOf(ops);
  BudgetPlan plan;
  plan.save.assign(ops.size(), false);
  plan.budget_bytes = std::max<int64_t>(budget_bytes, 0);
  plan.groups = static_cast<int64_t>(groups.size());
  for (const Group& g : groups) {
    plan.total_bytes += g.bytes;
    plan.total_micros += g.micros;
  }

  std::vector<bool> keep(groups.size(), false);
  if (plan.budget_bytes >= plan.total_bytes) {
    keep.assign(groups.size(), true);
  } else {
    // Note [Budget as a knapsack]: weights rounded up to units of u bytes.
    const int64_t unit = std::max<int64_t>(1, (plan.budget_bytes + kBudgetResolution - 1) / kBudgetResolution);
    const size_t capacity = static_cast<size_t>(plan.budget_bytes / unit);
    std::vector<double> best(capacity + 1, 0.0);              // best value within c units
    std::vector<std::vector<bool>> took(groups.size());        // took[g][c]: group g taken at capacity c
    for (size_t g = 0; g < groups.size(); ++g) {
      const int64_t w = (groups[g].bytes + unit - 1) / unit;
      took[g].assign(capacity + 1, false);
      if (groups[g].bytes == 0) {
        keep[g] = true;  // free: always kept, outside the table
        continue;
      }
      if (static_cast<size_t>(w) > capacity) continue;
      for (size_t c = capacity; c >= static_cast<size_t>(w); --c) {
        const double with = best[c - w] + groups[g].micros;
        if (with > best[c]) {
          best[c] = with;
          took[g][c] = true;
        }
        if (c == 0) break;
      }
    }
    size_t c = capacity;
    for (size_t g = groups.size(); g-- > 0;) {
      if (groups[g].bytes == 0 || !took[g][c]) continue;
      keep[g] = true;
      c -= static_cast<size_t>((groups[g].bytes + unit - 1) / unit);
    }
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    if (!keep[g]) continue;
    ++plan.kept_groups;
    plan.kept_bytes += groups[g].bytes;
    plan.saved_micros += groups[g].micros;
    for (size_t i : groups[g].members) plan.save[i] = true;
  }
  return plan;
}

}  // namespace hpac
