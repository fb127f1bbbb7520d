// hpac/replay/for_each_tensor.h: the tensors an IValue holds (a tensor, a
// tensor list, or lists of them), visited in order, or mapped.
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

// `v` with every tensor inside it (Tensor, Tensor[], Tensor?[]) replaced by `fn(tensor)`; other values as they are.
template <typename Fn>
c10::IValue mapTensors(const c10::IValue& v, Fn&& fn) {
  if (v.isTensor()) return fn(v.toTensor());
  if (v.isTensorList()) {
    c10::List<at::Tensor> out;
    for (const at::Tensor& t : v.toTensorList()) out.push_back(fn(t));
    return out;
  }
  if (v.isList()) {
    auto list = v.toList();
    c10::impl::GenericList out(list.elementType());
    for (const c10::IValue& e : list) out.push_back(mapTensors(e, fn));
    return out;
  }
  return v;
}

}  // namespace hpac
