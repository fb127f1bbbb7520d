// A libtorch program that does not link hpac: with LD_PRELOAD=libhpac.so it
// must see hpac's ops (and checkpoint regions work through the dispatcher).
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ATen.h>

#include <iostream>

int main() {
  auto op = c10::Dispatcher::singleton().findSchema({"hpac::version", ""});
  if (!op) {
    std::cout << "hpac ops: absent\n";
    return 0;
  }
  torch::jit::Stack stack;
  op->callBoxed(&stack);
  std::cout << "hpac ops: present, version " << stack.back().toStringRef() << "\n";
  auto status = c10::Dispatcher::singleton().findSchemaOrThrow("hpac::fallback_status", "");
  stack.clear();
  status.callBoxed(&stack);
  std::cout << "fallback: " << stack.back().toStringRef() << "\n";
  return 0;
}
