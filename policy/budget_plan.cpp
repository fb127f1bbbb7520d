#include "policy/budget_plan.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>
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
  bool collective = false;  // Note [Collectives are kept by every plan]
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
    g.collective = g.collective || ops[i].collective;
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

std::vector<bool> deadOps(const std::vector<ProfiledOp>& ops, const std::vector<bool>& save,
                          const std::vector<int64_t>& autograd_saved) {
  std::unordered_set<int64_t> live(autograd_saved.begin(), autograd_saved.end());
  std::vector<bool> dead(ops.size(), false);
  for (size_t i = ops.size(); i-- > 0;) {
    const ProfiledOp& op = ops[i];
    live.insert(op.later_reads.begin(), op.later_reads.end());
    if (save[i]) continue;  // served: its arguments are not read
    bool needed = !op.skippable && !op.view;
    for (int64_t w : op.writes) needed = needed || live.count(w) > 0;
    if (needed) {
      live.insert(op.reads.begin(), op.reads.end());
    } else if (!op.view) {
      dead[i] = true;
    }
  }
  return dead;
}

namespace {

// DP states for a choice among `groups`: kBudgetResolution, more for many groups (each group a choice holds loses
// up to one unit to rounding), at most 2^16.
size_t resolution(size_t groups) {
  return std::min<size_t>(std::max<size_t>(kBudgetResolution, 64 * groups), size_t{1} << 16);
}

// Note [Budget as a knapsack]: the groups to keep within `budget` bytes that
// maximise the summed `value`, by dynamic programming over weights rounded up
// to units of u bytes; only groups with `eligible` set are considered. Groups
// without bytes are always kept.
std::vector<bool> knapsackByKeeping(const std::vector<Group>& groups, int64_t budget, const std::vector<double>& value,
                                    const std::vector<bool>& eligible) {
  std::vector<bool> keep(groups.size(), false);
  const int64_t states = static_cast<int64_t>(resolution(groups.size()));
  const int64_t unit = std::max<int64_t>(1, (budget + states - 1) / states);
  const size_t capacity = static_cast<size_t>(budget / unit);
  std::vector<double> best(capacity + 1, 0.0);        // best value within c units
  std::vector<std::vector<bool>> took(groups.size());  // took[g][c]: group g taken at capacity c
  for (size_t g = 0; g < groups.size(); ++g) {
    const int64_t w = (groups[g].bytes + unit - 1) / unit;
    took[g].assign(capacity + 1, false);
    if (groups[g].bytes == 0) {
      keep[g] = true;  // free: always kept, outside the table
      continue;
    }
    if (!eligible[g] || static_cast<size_t>(w) > capacity) continue;
    for (size_t c = capacity; c >= static_cast<size_t>(w); --c) {
      const double with = best[c - w] + value[g];
      if (with > best[c]) {
        best[c] = with;
        took[g][c] = true;
      }
      if (c == 0) break;
    }
  }
  size_t c = capacity;
  int64_t used = 0;
  for (size_t g = groups.size(); g-- > 0;) {
    if (groups[g].bytes == 0 || !took[g][c]) continue;
    keep[g] = true;
    used += groups[g].bytes;
    c -= static_cast<size_t>((groups[g].bytes + unit - 1) / unit);
  }
  return keep;
}

// Rounding costs each group a choice keeps (or drops) up to one unit of the real budget; what is left of it is
// filled with the eligible groups that still fit, most value per byte first (Note [Budget as a knapsack]).
std::vector<bool> filled(std::vector<bool> keep, const std::vector<Group>& groups, int64_t budget,
                         const std::vector<double>& value, const std::vector<bool>& eligible) {
  int64_t used = 0;
  std::vector<size_t> rest;
  for (size_t g = 0; g < groups.size(); ++g) {
    if (keep[g] && eligible[g]) used += groups[g].bytes;
    if (!keep[g] && eligible[g] && groups[g].bytes > 0) rest.push_back(g);
  }
  std::sort(rest.begin(), rest.end(), [&](size_t a, size_t b) {
    return value[a] * static_cast<double>(groups[b].bytes) > value[b] * static_cast<double>(groups[a].bytes);
  });
  for (size_t g : rest) {
    if (groups[g].bytes > budget - used) continue;
    keep[g] = true;
    used += groups[g].bytes;
  }
  return keep;
}

// Note [Budget as a knapsack], from the other side: the eligible groups to drop, least summed `value` first, so
// that the rest fits `budget`; by dynamic programming over the bytes to free, weights rounded DOWN to units of
// need / kBudgetResolution (what a choice frees is then at least what it counts). Its rounding error is a share of
// what must be freed, not of the budget: the exact side when the budget is most of the total.
std::vector<bool> knapsackByDropping(const std::vector<Group>& groups, int64_t budget,
                                     const std::vector<double>& value, const std::vector<bool>& eligible) {
  std::vector<bool> keep(groups.size(), false);
  int64_t total = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    keep[g] = groups[g].bytes == 0 || eligible[g];
    total += eligible[g] ? groups[g].bytes : 0;
  }
  const int64_t need = total - budget;
  if (need <= 0) return keep;
  const int64_t states = static_cast<int64_t>(resolution(groups.size()));
  const int64_t unit = std::max<int64_t>(1, (need + states - 1) / states);
  const size_t target = static_cast<size_t>((need + unit - 1) / unit);  // units freed, at least
  constexpr double kNone = std::numeric_limits<double>::infinity();
  std::vector<double> least(target + 1, kNone);  // least value dropped to free c units (target: at least)
  least[0] = 0;
  std::vector<std::vector<bool>> took(groups.size());
  std::vector<size_t> from_target(groups.size(), 0);  // the state the target was last reached from, per group
  for (size_t g = 0; g < groups.size(); ++g) {
    took[g].assign(target + 1, false);
    const size_t w = static_cast<size_t>(groups[g].bytes / unit);
    if (!eligible[g] || groups[g].bytes == 0 || w == 0) continue;
    for (size_t c = target + 1; c-- > 0;) {
      if (least[c] == kNone) continue;
      const size_t to = std::min(target, c + w);
      if (least[c] + value[g] < least[to]) {
        least[to] = least[c] + value[g];
        took[g][to] = true;
        if (to == target) from_target[g] = c;
      }
    }
  }
  if (least[target] == kNone) return knapsackByKeeping(groups, budget, value, eligible);  // unreachable in practice
  size_t c = target;
  for (size_t g = groups.size(); g-- > 0 && c > 0;) {
    if (!took[g][c]) continue;
    keep[g] = false;
    c = c == target ? from_target[g] : c - static_cast<size_t>(groups[g].bytes / unit);
  }
  return keep;
}

// The better of the two sides (more value kept; ties: fewer bytes). Both fit `budget`.
std::vector<bool> knapsack(const std::vector<Group>& groups, int64_t budget, const std::vector<double>& value,
                           const std::vector<bool>& eligible) {
  std::vector<bool> keeping = filled(knapsackByKeeping(groups, budget, value, eligible), groups, budget, value,
                                     eligible);
  std::vector<bool> dropping = filled(knapsackByDropping(groups, budget, value, eligible), groups, budget, value,
                                      eligible);
  double kept[2] = {0, 0};
  int64_t bytes[2] = {0, 0};
  for (size_t g = 0; g < groups.size(); ++g) {
    kept[0] += keeping[g] ? value[g] : 0;
    bytes[0] += keeping[g] ? groups[g].bytes : 0;
    kept[1] += dropping[g] ? value[g] : 0;
    bytes[1] += dropping[g] ? groups[g].bytes : 0;
  }
  const bool drop = kept[1] > kept[0] || (kept[1] == kept[0] && bytes[1] < bytes[0]);
  return drop ? dropping : keeping;
}

std::vector<bool> saveOf(const std::vector<Group>& groups, const std::vector<bool>& keep, size_t num_ops) {
  std::vector<bool> save(num_ops, false);
  for (size_t g = 0; g < groups.size(); ++g) {
    if (keep[g]) {
      for (size_t i : groups[g].members) save[i] = true;
    }
  }
  return save;
}

// Note [The recompute's fixed cost]: the last op a recompute served `save` reaches; -1: none (the frame holds every
// saved tensor and backward never re-runs the region). A profile that did not say where autograd saved: every op.
int64_t stopOf(const std::vector<ProfiledOp>& ops, const std::vector<bool>& save, bool stops_early) {
  std::unordered_set<int64_t> held;
  for (size_t i = 0; stops_early && i < ops.size(); ++i) {
    if (!save[i]) continue;
    for (const auto& [id, bytes] : ops[i].storages) held.insert(id);
  }
  int64_t stop = -1;
  bool positions = false;
  for (size_t i = 0; i < ops.size(); ++i) {
    for (int64_t id : ops[i].autograd_saves) {
      positions = true;
      if (held.count(id) == 0) stop = static_cast<int64_t>(i);
    }
  }
  return positions ? stop : static_cast<int64_t>(ops.size()) - 1;
}

// What a recompute served `keep` still spends (Note [Dead ops are skipped], Note [The recompute's fixed cost]).
struct Recompute {
  const std::vector<int64_t>& autograd_saved;
  bool stops_early;
};
double recomputeMicros(const std::vector<ProfiledOp>& ops, const std::vector<Group>& groups,
                       const std::vector<bool>& keep, const Recompute& frame) {
  const std::vector<bool> save = saveOf(groups, keep, ops.size());
  const std::vector<bool> dead = deadOps(ops, save, frame.autograd_saved);
  const int64_t stop = stopOf(ops, save, frame.stops_early);
  double micros = 0;
  for (int64_t i = 0; i <= stop; ++i) micros += ops[i].gap_micros + (save[i] || dead[i] ? 0 : ops[i].micros);
  return micros;
}

// Note [The recompute's fixed cost]: per op p during which autograd saved something, the plan keeping every group
// that holds what autograd saved after p, the rest of `budget` filled by the knapsack over the other groups.
std::vector<std::vector<bool>> stopPlans(const std::vector<ProfiledOp>& ops, const std::vector<Group>& groups,
                                         int64_t budget, const std::vector<double>& value) {
  std::unordered_map<int64_t, size_t> group_of;  // storage id -> group
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i : groups[g].members) {
      for (const auto& [id, bytes] : ops[i].storages) group_of.emplace(id, g);
    }
  }
  std::vector<std::vector<bool>> plans;
  std::vector<bool> tail(groups.size(), false);  // groups holding what autograd saved after p
  int64_t used = 0;
  for (size_t p = ops.size(); p-- > 0;) {
    if (ops[p].autograd_saves.empty()) continue;
    if (used <= budget) {
      std::vector<bool> eligible(groups.size());
      for (size_t g = 0; g < groups.size(); ++g) eligible[g] = !tail[g] && !groups[g].collective;
      std::vector<bool> keep = knapsack(groups, budget - used, value, eligible);
      for (size_t g = 0; g < groups.size(); ++g) keep[g] = keep[g] || tail[g] || groups[g].collective;
      plans.push_back(std::move(keep));
    }
    for (int64_t id : ops[p].autograd_saves) {
      const auto it = group_of.find(id);
      if (it == group_of.end() || tail[it->second] || groups[it->second].collective) continue;
      tail[it->second] = true;
      used += groups[it->second].bytes;
    }
  }
  return plans;
}

// Note [Planning with the dataflow]: adds, one at a time, the group that
// removes the most recompute time per byte, while one fits.
std::vector<bool> greedy(const std::vector<ProfiledOp>& ops, const std::vector<Group>& groups, int64_t budget,
                         const Recompute& frame) {
  std::vector<bool> keep(groups.size(), false);
  for (size_t g = 0; g < groups.size(); ++g) keep[g] = groups[g].bytes == 0 || groups[g].collective;
  int64_t used = 0;  // collectives' bytes are outside `budget` (Note [Collectives are kept by every plan])
  double now = recomputeMicros(ops, groups, keep, frame);
  while (true) {
    size_t best = groups.size();
    double best_ratio = 0, best_micros = now;
    for (size_t g = 0; g < groups.size(); ++g) {
      if (keep[g] || used + groups[g].bytes > budget) continue;
      keep[g] = true;
      const double micros = recomputeMicros(ops, groups, keep, frame);
      keep[g] = false;
      const double ratio = (now - micros) / static_cast<double>(groups[g].bytes);
      if (ratio > best_ratio) {
        best = g;
        best_ratio = ratio;
        best_micros = micros;
      }
    }
    if (best == groups.size()) return keep;
    keep[best] = true;
    used += groups[best].bytes;
    now = best_micros;
  }
}

// Note [Planning with the dataflow]: starts from every group holding what
// autograd saved (the recompute then runs next to nothing) and drops, one at a
// time, the group whose loss adds the least recompute time per byte freed,
// until the rest fits.
std::vector<bool> shrink(const std::vector<ProfiledOp>& ops, const std::vector<Group>& groups, int64_t budget,
                         const std::vector<bool>& holds_saved, const Recompute& frame) {
  std::vector<bool> keep(groups.size(), false);
  int64_t used = 0;
  for (size_t g = 0; g < groups.size(); ++g) {
    keep[g] = groups[g].bytes == 0 || holds_saved[g] || groups[g].collective;
    used += keep[g] && !groups[g].collective ? groups[g].bytes : 0;  // collectives: outside `budget`
  }
  double now = recomputeMicros(ops, groups, keep, frame);
  while (used > budget) {
    size_t best = groups.size();
    double best_cost = 0, best_micros = now;
    for (size_t g = 0; g < groups.size(); ++g) {
      if (!keep[g] || groups[g].bytes == 0 || groups[g].collective) continue;
      keep[g] = false;
      const double micros = recomputeMicros(ops, groups, keep, frame);
      keep[g] = true;
      const double cost = (micros - now) / static_cast<double>(groups[g].bytes);
      if (best == groups.size() || cost < best_cost) {
        best = g;
        best_cost = cost;
        best_micros = micros;
      }
    }
    keep[best] = false;
    used -= groups[best].bytes;
    now = best_micros;
  }
  return keep;
}

// A plan's totals before anything is kept.
BudgetPlan emptyPlan(const std::vector<Group>& groups, int64_t budget_bytes) {
  BudgetPlan plan;
  plan.budget_bytes = std::max<int64_t>(budget_bytes, 0);
  plan.groups = static_cast<int64_t>(groups.size());
  for (const Group& g : groups) {
    plan.total_bytes += g.bytes;
    plan.total_micros += g.micros;
  }
  return plan;
}

// What keeping the groups `keep` saves, holds and lets the recompute skip.
void fillPlan(const std::vector<ProfiledOp>& ops, const std::vector<Group>& groups, const std::vector<bool>& keep,
              const std::vector<int64_t>* autograd_saved, bool stops_early, BudgetPlan* plan) {
  plan->save = saveOf(groups, keep, ops.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    if (!keep[g]) continue;
    ++plan->kept_groups;
    plan->kept_bytes += groups[g].bytes;
    plan->saved_micros += groups[g].micros;
  }
  if (autograd_saved != nullptr) {
    plan->skip = deadOps(ops, plan->save, *autograd_saved);
    for (size_t i = 0; i < ops.size(); ++i) plan->skipped_micros += plan->skip[i] ? ops[i].micros : 0;
    plan->recompute_micros = recomputeMicros(ops, groups, keep, Recompute{*autograd_saved, stops_early});
  }
}

}  // namespace

BudgetPlan planBudget(const std::vector<ProfiledOp>& ops, int64_t budget_bytes,
                      const std::vector<int64_t>* autograd_saved, bool stops_early) {
  const std::vector<Group> groups = groupsOf(ops);
  BudgetPlan plan = emptyPlan(groups, budget_bytes);
  std::vector<double> micros(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) micros[g] = groups[g].micros;

  // Note [Collectives are kept by every plan]: kept first, the rest planned within what is left.
  int64_t forced_bytes = 0;
  std::vector<bool> free_choice(groups.size(), true);
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].collective) {
      forced_bytes += groups[g].bytes;
      free_choice[g] = false;
    }
  }
  const int64_t left = std::max<int64_t>(plan.budget_bytes - forced_bytes, 0);
  auto withForced = [&](std::vector<bool> k) {
    for (size_t g = 0; g < groups.size(); ++g) k[g] = k[g] || groups[g].collective;
    return k;
  };
  std::vector<bool> keep(groups.size(), true);
  if (plan.budget_bytes < plan.total_bytes) {
    keep = withForced(knapsack(groups, left, micros, free_choice));
    if (autograd_saved != nullptr) {
      // Note [Planning with the dataflow]
      // The knapsack counts only the kernels of what it keeps; with skipping
      // (Note [Dead ops are skipped]) keeping what autograd saved also spares
      // the ops that only feed it, which the knapsack cannot see. So four plans
      // compete, judged by the kernel time their recompute really spends: the
      // knapsack over every group, the knapsack over the groups holding what
      // autograd saved, a greedy that keeps adding the group removing the most
      // recompute time per byte, and one that starts from everything autograd
      // saved and drops the group costing the least time per byte until the
      // rest fits. The best is kept (ties: fewer bytes). Each fits the budget;
      // none is proven optimal for the dataflow objective — the knapsack's
      // bound holds for its own objective.
      std::unordered_set<int64_t> saved(autograd_saved->begin(), autograd_saved->end());
      std::vector<bool> holds_saved(groups.size(), false);
      for (size_t g = 0; g < groups.size(); ++g) {
        for (size_t i : groups[g].members) {
          for (const auto& [id, bytes] : ops[i].storages) holds_saved[g] = holds_saved[g] || saved.count(id) > 0;
        }
        holds_saved[g] = holds_saved[g] && !groups[g].collective;
      }
      auto bytesOf = [&](const std::vector<bool>& k) {
        int64_t b = 0;
        for (size_t g = 0; g < groups.size(); ++g) b += k[g] ? groups[g].bytes : 0;
        return b;
      };
      const Recompute frame{*autograd_saved, stops_early};
      double best = recomputeMicros(ops, groups, keep, frame);
      std::vector<std::vector<bool>> others = stopPlans(ops, groups, left, micros);
      others.push_back(withForced(knapsack(groups, left, micros, holds_saved)));
      others.push_back(greedy(ops, groups, left, frame));
      others.push_back(shrink(ops, groups, left, holds_saved, frame));
      for (std::vector<bool>& other : others) {
        const double t = recomputeMicros(ops, groups, other, frame);
        if (t < best || (t == best && bytesOf(other) < bytesOf(keep))) {
          best = t;
          keep = std::move(other);
        }
      }
    }
  }
  fillPlan(ops, groups, keep, autograd_saved, stops_early, &plan);
  return plan;
}

PlanGroups planGroups(const std::vector<ProfiledOp>& ops) {
  PlanGroups out;
  out.group_of.assign(ops.size(), -1);
  const std::vector<Group> groups = groupsOf(ops);
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i : groups[g].members) out.group_of[i] = static_cast<int64_t>(g);
    out.bytes.push_back(groups[g].bytes);
    out.micros.push_back(groups[g].micros);
    out.collective.push_back(groups[g].collective);
  }
  return out;
}

BudgetPlan planKeeping(const std::vector<ProfiledOp>& ops, int64_t budget_bytes, const std::vector<bool>& keep,
                       const std::vector<int64_t>* autograd_saved, bool stops_early) {
  const std::vector<Group> groups = groupsOf(ops);
  TORCH_CHECK(keep.size() == groups.size(), "hpac budget: a plan keeping groups needs one flag per group: ",
              keep.size(), " given, the profile has ", groups.size());
  BudgetPlan plan = emptyPlan(groups, budget_bytes);
  std::vector<bool> kept(keep);
  for (size_t g = 0; g < groups.size(); ++g) kept[g] = kept[g] || groups[g].bytes == 0 || groups[g].collective;
  fillPlan(ops, groups, kept, autograd_saved, stops_early, &plan);
  return plan;
}

}  // namespace hpac
