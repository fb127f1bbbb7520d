#include "policy/step_plan.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <limits>

namespace hpac {
namespace {

void checkProblem(const std::vector<std::vector<StepChoice>>& layers, const std::vector<StepEvent>& events) {
  const auto n = static_cast<int64_t>(layers.size());
  for (int64_t j = 0; j < n; ++j) {
    TORCH_CHECK(!layers[j].empty(), "hpac step plan: layer ", j, " has no candidate plans");
    for (const StepChoice& c : layers[j]) {
      TORCH_CHECK(c.kept_bytes >= 0 && c.backward_bytes >= 0 && c.forward_bytes >= 0 && c.recompute_micros >= 0,
                  "hpac step plan: layer ", j,
                  " has a candidate with negative bytes or time");
    }
  }
  for (size_t e = 0; e < events.size(); ++e) {
    const StepEvent& ev = events[e];
    TORCH_CHECK(ev.layers_kept >= 0 && ev.layers_kept <= n, "hpac step plan: event ", e, " counts ",
                ev.layers_kept, " layers' kept bytes; allowed: 0 to ", n);
    TORCH_CHECK(ev.layer < 0 || (ev.layer < n && ev.layers_kept == ev.layer), "hpac step plan: event ", e,
                " is the ", ev.forward ? "forward" : "backward", " of layer ", ev.layer, " with ", ev.layers_kept,
                " layers kept; allowed: layer in [0, ",
                n, ") with exactly the layers before it kept");
  }
}

// What an event of one layer adds for that layer's candidate `c` (Note [The step's peak as events]).
int64_t own(const StepEvent& ev, const StepChoice& c) { return ev.forward ? c.forward_bytes : c.backward_bytes; }

struct State {
  int64_t bytes;
  double micros;
  int64_t parent;  // index in the previous front
  int64_t choice;
};

// Keeps the states no other dominates (no more bytes at no more time), sorted by bytes; of equal ones the first
// made (the earlier candidate: front-ends list the cheaper-to-run ones first).
void prune(std::vector<State>& states) {
  std::stable_sort(states.begin(), states.end(), [](const State& a, const State& b) {
    return a.bytes != b.bytes ? a.bytes < b.bytes : a.micros < b.micros;
  });
  std::vector<State> front;
  double best = std::numeric_limits<double>::infinity();
  for (const State& s : states) {
    if (s.micros < best) {
      front.push_back(s);
      best = s.micros;
    }
  }
  states.swap(front);
}

// Note [An exact step plan]: past the cap, prefix bytes rounded up to a grid that leaves at most `cap` cells.
bool roundFront(std::vector<State>& states, int64_t cap) {
  if (static_cast<int64_t>(states.size()) <= cap) return false;
  const int64_t span = states.back().bytes - states.front().bytes;
  const int64_t unit = std::max<int64_t>(1, span / cap + 1);
  for (State& s : states) s.bytes = (s.bytes + unit - 1) / unit * unit;
  prune(states);
  return true;
}

}  // namespace

int64_t stepPeak(const std::vector<std::vector<StepChoice>>& layers, const std::vector<StepEvent>& events,
                 const std::vector<int64_t>& choice, int64_t* event) {
  checkProblem(layers, events);
  TORCH_CHECK(choice.size() == layers.size(), "hpac step plan: ", choice.size(), " choices for ", layers.size(),
              " layers");
  std::vector<int64_t> prefix(layers.size() + 1, 0);
  for (size_t j = 0; j < layers.size(); ++j) {
    TORCH_CHECK(choice[j] >= 0 && choice[j] < static_cast<int64_t>(layers[j].size()), "hpac step plan: layer ", j,
                " has no candidate ", choice[j]);
    prefix[j + 1] = prefix[j] + layers[j][choice[j]].kept_bytes;
  }
  int64_t peak = std::numeric_limits<int64_t>::min(), at = -1;
  for (size_t e = 0; e < events.size(); ++e) {
    const StepEvent& ev = events[e];
    const int64_t live =
        ev.base_bytes + prefix[ev.layers_kept] + (ev.layer >= 0 ? own(ev, layers[ev.layer][choice[ev.layer]]) : 0);
    if (live > peak) {
      peak = live;
      at = static_cast<int64_t>(e);
    }
  }
  if (event) *event = at;
  return at < 0 ? 0 : peak;
}

StepPlan planStep(const std::vector<std::vector<StepChoice>>& layers, const std::vector<StepEvent>& events,
                  int64_t target_bytes) {
  checkProblem(layers, events);
  const auto n = static_cast<int64_t>(layers.size());
  // Per prefix length m, the largest base among the events that count only layers [0, m): the front after m
  // layers must keep base + bytes <= target.
  std::vector<int64_t> prefix_base(n + 1, std::numeric_limits<int64_t>::min());
  std::vector<std::vector<const StepEvent*>> of_layer(n);
  for (const StepEvent& ev : events) {
    if (ev.layer >= 0) {
      of_layer[ev.layer].push_back(&ev);
    } else {
      prefix_base[ev.layers_kept] = std::max(prefix_base[ev.layers_kept], ev.base_bytes);
    }
  }
  StepPlan plan;
  auto fits = [&](int64_t m, int64_t bytes) {
    return prefix_base[m] == std::numeric_limits<int64_t>::min() || prefix_base[m] + bytes <= target_bytes;
  };
  std::vector<std::vector<State>> fronts(n + 1);
  if (fits(0, 0)) fronts[0].push_back(State{0, 0, -1, -1});
  for (int64_t j = 0; j < n && !fronts[j].empty(); ++j) {
    std::vector<State> next;
    const std::vector<State>& front = fronts[j];
    for (size_t s = 0; s < front.size(); ++s) {
      for (size_t c = 0; c < layers[j].size(); ++c) {
        const StepChoice& choice = layers[j][c];
        bool ok = true;
        for (const StepEvent* ev : of_layer[j]) {
          ok = ok && ev->base_bytes + front[s].bytes + own(*ev, choice) <= target_bytes;
        }
        const int64_t bytes = front[s].bytes + choice.kept_bytes;
        if (ok && fits(j + 1, bytes)) {
          next.push_back(
              State{bytes, front[s].micros + choice.recompute_micros, static_cast<int64_t>(s), static_cast<int64_t>(c)});
        }
      }
    }
    prune(next);
    if (roundFront(next, kStepFrontCap)) plan.exact = false;
    plan.front_states = std::max<int64_t>(plan.front_states, static_cast<int64_t>(next.size()));
    fronts[j + 1] = std::move(next);
  }
  plan.choice.assign(n, 0);
  if (fronts[n].empty()) {
    // Nothing fits: the plan keeping the least (the floor), reported with fits false.
    for (int64_t j = 0; j < n; ++j) {
      const auto& cands = layers[j];
      plan.choice[j] = std::min_element(cands.begin(), cands.end(), [](const StepChoice& a, const StepChoice& b) {
                         return a.kept_bytes != b.kept_bytes ? a.kept_bytes < b.kept_bytes
                                                             : a.backward_bytes < b.backward_bytes;
                       }) - cands.begin();
    }
  } else {
    const auto best = std::min_element(fronts[n].begin(), fronts[n].end(), [](const State& a, const State& b) {
      return a.micros != b.micros ? a.micros < b.micros : a.bytes < b.bytes;
    });
    int64_t at = best - fronts[n].begin();
    for (int64_t j = n; j > 0; --j) {
      const State& s = fronts[j][at];
      plan.choice[j - 1] = s.choice;
      at = s.parent;
    }
  }
  for (int64_t j = 0; j < n; ++j) plan.recompute_micros += layers[j][plan.choice[j]].recompute_micros;
  plan.peak_bytes = stepPeak(layers, events, plan.choice, &plan.peak_event);
  plan.fits = plan.peak_bytes <= target_bytes;
  return plan;
}

}  // namespace hpac
