#include "replay/routing_check.h"

#include "policy/op_tables.h"
#include "replay/dispatch_key.h"

#include <ATen/ops/equal.h>
#include <ATen/ops/ne.h>
#include <ATen/ops/nonzero.h>
#include <c10/core/ScalarType.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/util/Exception.h>
#include <c10/util/StringUtil.h>

#include <sstream>
#include <string>

namespace hpac {
namespace {

// The returns that carry the decision: the integer (and bool) tensors, or every tensor when there is none.
std::vector<size_t> decisionReturns(const torch::jit::Stack& stack, size_t num_returns) {
  std::vector<size_t> integer, all;
  for (size_t j = 0; j < num_returns; ++j) {
    const c10::IValue& v = stack[stack.size() - num_returns + j];
    if (!v.isTensor() || !v.toTensor().defined()) continue;
    all.push_back(j);
    if (c10::isIntegralType(v.toTensor().scalar_type(), /*includeBool=*/true)) integer.push_back(j);
  }
  return integer.empty() ? all : integer;
}

std::string describe(const at::Tensor& t) {
  std::ostringstream s;
  s << t.sizes() << " " << t.scalar_type();
  return s.str();
}

std::string element(const at::Tensor& flat, int64_t i) {
  const c10::Scalar v = flat[i].item();
  std::ostringstream s;
  if (v.isFloatingPoint()) {
    s << v.toDouble();
  } else {
    s << v.toLong();
  }
  return s.str();
}

std::string indexOf(int64_t flat, c10::IntArrayRef sizes) {
  std::vector<int64_t> index(sizes.size());
  for (size_t d = sizes.size(); d-- > 0;) {
    index[d] = sizes[d] ? flat % sizes[d] : 0;
    flat = sizes[d] ? flat / sizes[d] : 0;
  }
  std::ostringstream s;
  s << c10::IntArrayRef(index);
  return s.str();
}

std::string opName(const c10::OperatorHandle& op) {
  return messageOpName(op.operator_name());
}

}  // namespace

void RoutingCheck::keep(const c10::OperatorHandle& op, int64_t occurrence, const torch::jit::Stack& stack) {
  const size_t num_returns = op.schema().returns().size();
  c10::impl::ExcludeDispatchKeyGuard hide(dispatchKey());
  std::vector<std::pair<size_t, at::Tensor>> copies;
  for (size_t j : decisionReturns(stack, num_returns)) {
    at::Tensor copy = stack[stack.size() - num_returns + j].toTensor().clone();
    bytes_ += static_cast<int64_t>(copy.nbytes());
    copies.emplace_back(j, std::move(copy));
  }
  kept_.insert_or_assign(Key{opId(op), occurrence}, std::move(copies));
}

void RoutingCheck::verify(const c10::OperatorHandle& op, int64_t occurrence, uint64_t invocation,
                          const torch::jit::Stack& stack) {
  const auto it = kept_.find(Key{opId(op), occurrence});
  if (it == kept_.end()) return;
  const auto kept = std::move(it->second);
  kept_.erase(it);
  const size_t num_returns = op.schema().returns().size();
  c10::impl::ExcludeDispatchKeyGuard hide(dispatchKey());
  for (const auto& [j, forward] : kept) {
    bytes_ -= static_cast<int64_t>(forward.nbytes());
    const c10::IValue& v = stack[stack.size() - num_returns + j];
    const at::Tensor now = v.isTensor() ? v.toTensor() : at::Tensor();
    std::string difference;
    if (!now.defined() || now.sizes() != forward.sizes() || now.scalar_type() != forward.scalar_type()) {
      difference = "is " + (now.defined() ? describe(now) : std::string("undefined")) + " in the recompute, " +
                   describe(forward) + " in the forward";
    } else if (!forward.is_meta() && !at::equal(now, forward)) {  // meta (hpac.plan): shapes only, no values
      const at::Tensor differs = at::ne(now, forward).flatten();
      const at::Tensor where = at::nonzero(differs);
      const int64_t first = where[0][0].item<int64_t>();
      difference = "(" + describe(forward) + ") differs in " + std::to_string(where.size(0)) + " of " +
                   std::to_string(differs.numel()) + " elements (first at " + indexOf(first, forward.sizes()) +
                   ": " + element(forward.flatten(), first) + " in the forward, " + element(now.flatten(), first) +
                   " in the recompute)";
    }
    if (difference.empty()) continue;
    TORCH_CHECK(false, "hpac: ", opName(op), " occurrence ", occurrence, " of invocation ", invocation,
                " routed differently in the recompute than in the forward: return ", j, " ", difference,
                ". Backward would run the experts on other tokens than the forward did, and compute gradients "
                "for another routing than the loss (mixed with the outputs saved in the forward). Keep the "
                "forward's routing with routing: save (activation_checkpoint.routing in the trainer's YAML, "
                "routing=\"save\" in Python), or make the router deterministic (Note [Routing is verified]).");
  }
}

}  // namespace hpac
