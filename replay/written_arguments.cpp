#include "replay/written_arguments.h"

#include "replay/collective_work.h"

namespace hpac {

std::vector<bool> writtenArguments(const c10::FunctionSchema& schema) {
  const auto& args = schema.arguments();
  std::vector<bool> written(args.size(), false);
  for (size_t i = 0; i < args.size(); ++i) {
    written[i] = args[i].alias_info() != nullptr && args[i].alias_info()->isWrite();
  }
  if (isInPlaceCollective(schema) && !args.empty()) written[0] = true;
  return written;
}

int64_t aliasedArgument(const c10::FunctionSchema& schema, size_t return_index) {
  if (isInPlaceCollective(schema)) {
    const auto& ret = schema.returns()[return_index];
    return return_index == 0 && !schema.arguments().empty() && *ret.type() == *schema.arguments()[0].type() ? 0 : -1;
  }
  const auto* ret_alias = schema.returns()[return_index].alias_info();
  if (ret_alias == nullptr || !ret_alias->isWrite()) return -1;
  const auto& args = schema.arguments();
  for (size_t i = 0; i < args.size(); ++i) {
    const auto* a = args[i].alias_info();
    if (a != nullptr && a->beforeSets() == ret_alias->beforeSets()) return static_cast<int64_t>(i);
  }
  return -1;
}

}  // namespace hpac
