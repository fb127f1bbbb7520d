#include "policy/plan_file.h"

#include "policy/op_tables.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/util/Exception.h>

#include <cstdint>
#include <iterator>
#include <sstream>

namespace hpac {
namespace {

constexpr const char* kPlanHeader = "hpac-budget-plan 1";

// "key value" lines of a plan's header, in this order.
constexpr const char* kPlanKeys[] = {"budget_bytes", "kept_bytes", "total_bytes", "off_bytes",
                                     "groups",       "kept_groups", "saved_micros", "total_micros"};

class PlanReader {
 public:
  PlanReader(const std::string& text, const std::string& source) : in_(text), source_(source) {}

  // The next line that is not blank or a comment; false at the end.
  bool next(std::string* line) {
    while (std::getline(in_, *line)) {
      ++number_;
      const size_t start = line->find_first_not_of(" \t\r");
      if (start == std::string::npos || (*line)[start] == '#') continue;
      return true;
    }
    return false;
  }
  std::string expect(const std::string& what) {
    std::string line;
    TORCH_CHECK(next(&line), "hpac budget: plan '", source_, "' ends after line ", number_, "; expected ", what);
    return line;
  }
  [[noreturn]] void fail(const std::string& line, const std::string& what) const {
    TORCH_CHECK(false, "hpac budget: plan '", source_, "' line ", number_, ": '", line, "' is not ", what);
  }
  template <typename T>
  T value(const std::string& key) {
    const std::string line = expect("'" + key + " <number>'");
    std::istringstream fields(line);
    std::string k;
    T v{};
    std::string rest;
    if (!(fields >> k >> v) || k != key || (fields >> rest)) fail(line, "'" + key + " <number>'");
    return v;
  }
  const std::string& source() const { return source_; }

 private:
  std::istringstream in_;
  const std::string& source_;
  int64_t number_ = 0;
};

}  // namespace

std::string planFileText(const std::vector<ProfiledOp>& profile, const BudgetPlan& plan) {
  std::ostringstream out;
  out << "# hpac budget plan (Note [Plan files], policy/plan_file.h); valid for the region it was made in\n"
      << kPlanHeader << "\n";
  const double values[] = {static_cast<double>(plan.budget_bytes), static_cast<double>(plan.kept_bytes),
                           static_cast<double>(plan.total_bytes),  static_cast<double>(plan.off_bytes),
                           static_cast<double>(plan.groups),       static_cast<double>(plan.kept_groups),
                           plan.saved_micros,                      plan.total_micros};
  for (size_t k = 0; k < std::size(kPlanKeys); ++k) {
    out << kPlanKeys[k] << " ";
    if (k < 6) out << static_cast<int64_t>(values[k]); else out << values[k];
    out << "\n";
  }
  out << "ops " << profile.size() << "\n";
  for (size_t i = 0; i < profile.size(); ++i) {
    const ProfiledOp& p = profile[i];
    const c10::OperatorName* name = &operatorNameOf(p.id);
    int64_t bytes = 0;
    for (const auto& [id, size] : p.storages) bytes += size;
    const bool skip = i < plan.skip.size() && plan.skip[i];
    out << (plan.save[i] ? "keep" : skip ? "skip" : "recompute") << " " << p.occurrence << " " << name->name << " "
        << (name->overload_name.empty() ? "-" : name->overload_name) << " " << p.micros << " " << bytes << "\n";
  }
  return out.str();
}


PlanFile readPlanFile(const std::string& text, const std::string& source) {
  PlanReader reader(text, source);
  const std::string first = reader.expect("'" + std::string(kPlanHeader) + "'");
  const std::string family = "hpac-budget-plan ";
  TORCH_CHECK(first == kPlanHeader || first.rfind(family, 0) != 0, "hpac budget: '", source, "' is a plan of format '",
              first.substr(family.size()), "' (its first line is '", first, "'); this hpac reads format '",
              std::string(kPlanHeader).substr(family.size()), "' only ('", kPlanHeader, "'). Plans are not converted: "
              "make a new one in this version (hpac.budget(fraction) profiles the region; Budget.save_plan writes it)");
  TORCH_CHECK(first == kPlanHeader, "hpac budget: '", source, "' is not an hpac budget plan: its first line is '",
              first, "'; expected '", kPlanHeader, "' (written by Budget.save_plan / BudgetRegion::planText)");
  PlanFile file;
  BudgetPlan& plan = file.plan;
  plan.budget_bytes = reader.value<int64_t>("budget_bytes");
  plan.kept_bytes = reader.value<int64_t>("kept_bytes");
  plan.total_bytes = reader.value<int64_t>("total_bytes");
  plan.off_bytes = reader.value<int64_t>("off_bytes");
  plan.groups = reader.value<int64_t>("groups");
  plan.kept_groups = reader.value<int64_t>("kept_groups");
  plan.saved_micros = reader.value<double>("saved_micros");
  plan.total_micros = reader.value<double>("total_micros");
  TORCH_CHECK(plan.budget_bytes >= 0, "hpac budget: plan '", source, "': budget_bytes ", plan.budget_bytes,
              " is negative; allowed: >= 0");
  const int64_t count = reader.value<int64_t>("ops");
  TORCH_CHECK(count >= 0, "hpac budget: plan '", source, "': ops ", count, " is negative");

  for (int64_t i = 0; i < count; ++i) {
    const std::string line = reader.expect("op " + std::to_string(i) + " of " + std::to_string(count));
    std::istringstream fields(line);
    std::string decision, name, overload, rest;
    ProfiledOp p;
    int64_t bytes = 0;
    if (!(fields >> decision >> p.occurrence >> name >> overload >> p.micros >> bytes) || (fields >> rest) ||
        (decision != "keep" && decision != "recompute" && decision != "skip") || p.occurrence < 0 || bytes < 0) {
      reader.fail(line, "'keep|recompute|skip <occurrence> <ns::op> <overload or -> <micros> <bytes>'");
    }
    if (overload == "-") overload.clear();
    const auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
    TORCH_CHECK(handle.has_value(), "hpac budget: plan '", source, "' op ", i, ": ",
                overload.empty() ? name : name + "." + overload,
                " is not registered in this process (a plan replays only where its ops exist)");
    p.id = opId(*handle);
    p.op = qualifiedOpName(handle->operator_name());
    p.storages.emplace_back(i, bytes);
    plan.save.push_back(decision == "keep");
    plan.skip.push_back(decision == "skip");
    file.profile.push_back(std::move(p));
  }
  std::string extra;
  TORCH_CHECK(!reader.next(&extra), "hpac budget: plan '", source, "' has more than its ", count,
              " ops: '", extra, "'");
  return file;
}

}  // namespace hpac
