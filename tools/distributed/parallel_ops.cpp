#include "tools/distributed/parallel_ops.h"

#include "replay/torch_compat.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/custom_function.h>
#if !HPAC_TORCH_AT_LEAST(2, 0)
#include <torch/csrc/distributed/c10d/Ops.hpp>
#endif

namespace hpac {
namespace dist {
namespace {

struct CopyToTp : public torch::autograd::Function<CopyToTp> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            c10::intrusive_ptr<c10d::ProcessGroup> pg) {
    ctx->saved_data["pg"] = c10::IValue(pg);
    return x.clone();
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    auto pg = ctx->saved_data["pg"].toCustomClass<c10d::ProcessGroup>();
    const at::Tensor g = grad[0].contiguous().clone();
    allReduceInPlace(g, pg);
    return {g, at::Tensor()};
  }
};

struct ReduceFromTp : public torch::autograd::Function<ReduceFromTp> {
  static at::Tensor forward(torch::autograd::AutogradContext*, const at::Tensor& x,
                            c10::intrusive_ptr<c10d::ProcessGroup> pg) {
    const at::Tensor out = x.contiguous().clone();
    allReduceInPlace(out, pg);
    return out;
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext*,
                                                 torch::autograd::variable_list grad) {
    return {grad[0], at::Tensor()};
  }
};

// Rows [offset(counts, r), + counts[r]) of a buffer laid out rank after rank.
std::vector<int64_t> offsets(const std::vector<int64_t>& counts) {
  std::vector<int64_t> o(counts.size() + 1, 0);
  for (size_t r = 0; r < counts.size(); ++r) o[r + 1] = o[r] + counts[r];
  return o;
}

// The exchange itself. Every send is posted before any receive is waited (a
// rank blocked in a receive never holds back a send its peer waits for), and
// only non-empty chunks travel: both sides know every count, so they skip the
// same messages. One tag; messages between a pair of ranks match in order.
at::Tensor exchangeRows(const at::Tensor& x, const std::vector<int64_t>& send_counts,
                        const std::vector<int64_t>& recv_counts, const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
  const int n = pg->getSize(), rank = pg->getRank();
  TORCH_CHECK(static_cast<int>(send_counts.size()) == n && static_cast<int>(recv_counts.size()) == n,
              "hpac dist: allToAll needs one send and one receive count per rank of the group (", n, "), got ",
              send_counts.size(), " and ", recv_counts.size());
  TORCH_CHECK(send_counts[rank] == recv_counts[rank], "hpac dist: allToAll keeps ", send_counts[rank],
              " rows on rank ", rank, " but expects to receive ", recv_counts[rank], " from itself");
  const std::vector<int64_t> so = offsets(send_counts), ro = offsets(recv_counts);
  TORCH_CHECK(x.size(0) == so[n], "hpac dist: allToAll sends ", so[n], " rows but the input has ", x.size(0));
  const at::Tensor src = x.contiguous();
  std::vector<int64_t> shape = src.sizes().vec();
  shape[0] = ro[n];
  at::Tensor out = at::empty(shape, src.options());
  constexpr int kTag = 0;
  std::vector<std::vector<at::Tensor>> sent;
  std::vector<c10::intrusive_ptr<c10d::Work>> sends;
  for (int k = 1; k < n; ++k) {
    const int dst = (rank + k) % n;
    if (send_counts[dst] == 0) continue;
    sent.push_back({src.narrow(0, so[dst], send_counts[dst])});
    sends.push_back(send(pg, sent.back(), dst, kTag));
  }
  if (send_counts[rank] > 0) out.narrow(0, ro[rank], recv_counts[rank]).copy_(src.narrow(0, so[rank], send_counts[rank]));
  for (int k = 1; k < n; ++k) {
    const int from = (rank - k + n) % n;
    if (recv_counts[from] == 0) continue;
    std::vector<at::Tensor> into{out.narrow(0, ro[from], recv_counts[from])};
    recv(pg, into, from, kTag)->wait();
  }
  for (auto& w : sends) w->wait();
  return out;
}

struct AllToAll : public torch::autograd::Function<AllToAll> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, std::vector<int64_t> send,
                            std::vector<int64_t> recv, c10::intrusive_ptr<c10d::ProcessGroup> pg) {
    ctx->saved_data["pg"] = c10::IValue(pg);
    ctx->saved_data["send"] = c10::IValue(send);
    ctx->saved_data["recv"] = c10::IValue(recv);
    return exchangeRows(x, send, recv, pg);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    auto pg = ctx->saved_data["pg"].toCustomClass<c10d::ProcessGroup>();
    const std::vector<int64_t> send = ctx->saved_data["send"].toIntVector();
    const std::vector<int64_t> recv = ctx->saved_data["recv"].toIntVector();
    return {exchangeRows(grad[0], recv, send, pg), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

struct FsdpGather : public torch::autograd::Function<FsdpGather> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& local,
                            c10::intrusive_ptr<c10d::ProcessGroup> pg, std::vector<int64_t> shape) {
    ctx->saved_data["pg"] = c10::IValue(pg);
    // The buffers come from empty_like and the result is a view: ops hpac ignores.
    std::vector<std::vector<at::Tensor>> outs(1);
    for (int r = 0; r < pg->getSize(); ++r) outs[0].push_back(at::empty_like(local));
    std::vector<at::Tensor> in{local};
    allGather(pg, outs, in)->wait();
    return at::cat(outs[0]).view(shape);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    auto pg = ctx->saved_data["pg"].toCustomClass<c10d::ProcessGroup>();
    // Gloo has no reduce_scatter on 1.13: all-reduce, keep this rank's slice.
    const at::Tensor g = grad[0].reshape({-1}).clone();
    allReduceInPlace(g, pg);
    const int64_t n = g.numel() / pg->getSize();
    return {g.narrow(0, pg->getRank() * n, n).div(pg->getSize()), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

void allReduceInPlace(const at::Tensor& t, const c10::intrusive_ptr<c10d::ProcessGroup>& pg, c10d::ReduceOp op) {
  std::vector<at::Tensor> one{t};
  c10d::AllreduceOptions opts;
  opts.reduceOp = op;
  allReduce(pg, one, opts)->wait();
}

at::Tensor copyToTensorParallel(const at::Tensor& x, const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
  return pg->getSize() == 1 ? x : CopyToTp::apply(x, pg);
}

at::Tensor reduceFromTensorParallel(const at::Tensor& x, const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
  return pg->getSize() == 1 ? x : ReduceFromTp::apply(x, pg);
}

void allReduceGradients(const std::vector<at::Tensor>& params, const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
  if (pg->getSize() == 1) return;
  std::vector<at::Tensor> grads;
  for (const at::Tensor& p : params) {
    if (p.grad().defined()) grads.push_back(p.grad());
  }
  for (at::Tensor& g : grads) {
    allReduceInPlace(g, pg);
    g.div_(pg->getSize());
  }
}

at::Tensor allToAll(const at::Tensor& x, const std::vector<int64_t>& send_counts,
                    const std::vector<int64_t>& recv_counts, const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
  return AllToAll::apply(x, send_counts, recv_counts, pg);
}

at::Tensor exchangeCounts(const at::Tensor& counts, const c10::intrusive_ptr<c10d::ProcessGroup>& pg) {
  TORCH_CHECK(counts.dim() == 2 && counts.size(0) == pg->getSize() && counts.scalar_type() == at::kLong,
              "hpac dist: exchangeCounts needs an int64 table with one row per rank (", pg->getSize(), "), got ",
              counts.sizes(), " ", counts.scalar_type());
  const std::vector<int64_t> one(static_cast<size_t>(pg->getSize()), 1);
  return exchangeRows(counts, one, one, pg);
}

at::Tensor fsdpGather(const at::Tensor& local, const c10::intrusive_ptr<c10d::ProcessGroup>& pg,
                      const std::vector<int64_t>& shape) {
  return FsdpGather::apply(local, pg, shape);
}

// On torch 2.x the ProcessGroup's own methods dispatch to the c10d ops; on 1.13
// they call the backend directly and c10d::ops::* is the dispatcher route.
#if HPAC_TORCH_AT_LEAST(2, 0)
#define HPAC_C10D_CALL(method, ...) pg->method(__VA_ARGS__)
#else
#define HPAC_C10D_CALL(method, ...) c10d::ops::method(pg, __VA_ARGS__)
#endif

c10::intrusive_ptr<c10d::Work> allReduce(const c10::intrusive_ptr<c10d::ProcessGroup>& pg,
                                         std::vector<at::Tensor>& tensors, const c10d::AllreduceOptions& opts) {
  return HPAC_C10D_CALL(allreduce, tensors, opts);
}
c10::intrusive_ptr<c10d::Work> allGather(const c10::intrusive_ptr<c10d::ProcessGroup>& pg,
                                         std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs) {
  return HPAC_C10D_CALL(allgather, outputs, inputs);
}
c10::intrusive_ptr<c10d::Work> send(const c10::intrusive_ptr<c10d::ProcessGroup>& pg, std::vector<at::Tensor>& tensors,
                                    int dst, int tag) {
  return HPAC_C10D_CALL(send, tensors, dst, tag);
}
c10::intrusive_ptr<c10d::Work> recv(const c10::intrusive_ptr<c10d::ProcessGroup>& pg, std::vector<at::Tensor>& tensors,
                                    int src, int tag) {
  return HPAC_C10D_CALL(recv, tensors, src, tag);
}

#undef HPAC_C10D_CALL

}  // namespace dist
}  // namespace hpac
