// hpac/replay/for_each_tensor.h: the tensors an IValue holds (a tensor, a
// tensor list, or lists of them), visited in order.
#pragma once

#include <ATen/core/ivalue.h>

namespace hpac {

template <typename Fn>
void forEachTensor(const c10::IValue& v, Fn&& fn) {
  if (v.isTensor()) {
    fn(v.toTensor());
  } else if (v.isTensorList()) {
    for (const at::Tensor& t : v.toTensorList()) fn(t);
  } else if (v.isList()) {
    for (const c10::IValue& e : v.toList()) forEachTensor(e, fn);
  }
}

}  // namespace hpac
