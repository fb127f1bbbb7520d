#include "tools/trainer/parallel.h"

#include "tools/distributed/parallel_ops.h"
#include "tools/distributed/rendezvous.h"
#include "tools/trainer/qwen3_moe.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

#include <map>

namespace hpac::trainer {
namespace {

constexpr char kExperts[] = ".mlp.experts.";

bool isAttentionProjection(const std::string& name) {
  for (const char* p : {"q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"}) {
    if (absl::EndsWith(name, absl::StrCat("self_attn.", p))) return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<std::shared_ptr<ParallelRuntime>> connectParallel(const TrainConfig& config,
                                                                 const std::string& summary) {
  auto rt = std::make_shared<ParallelRuntime>();
  rt->spec = config.parallel;
  rt->model = config.model;
  const ParallelSpec& p = rt->spec;
  const std::string layout = absl::StrCat(config.file, ": parallel (", p.where, "): tp (", p.tp, ") x dp (", p.dp,
                                          ") = ", p.worldSize(), " ranks");
  try {
    const dist::DistEnv env = dist::readDistEnv();
    if (env.world_size != p.worldSize()) {
      return absl::FailedPreconditionError(absl::StrCat(layout, ", but the job has ", env.world_size,
                                                        " (hpac-train --nproc N and hpac-launch --nproc N must "
                                                        "start exactly tp x dp ranks)"));
    }
    rt->rank = env.rank;
    rt->world = env.world_size;
    rt->tp_rank = static_cast<int>(env.rank % p.tp);
    rt->dp_rank = static_cast<int>(env.rank / p.tp);
    rt->ep_rank = static_cast<int>(rt->dp_rank % p.ep);
    const int ep_group = static_cast<int>(rt->dp_rank / p.ep);
    rt->store = dist::connectStore(env);
    dist::checkSameConfig(*rt->store, env.rank, env.world_size, summary);
    const auto options = dist::glooOptions(env);
    // Every rank builds its own groups in the same order; a group's
    // constructor waits for its members only.
    auto group = [&](const std::string& name, int64_t group_rank, int64_t size) {
      c10::intrusive_ptr<c10d::ProcessGroup> pg = dist::countingGlooGroup(
          c10::make_intrusive<c10d::PrefixStore>(absl::StrCat("hpac/", name), rt->store), static_cast<int>(group_rank),
          static_cast<int>(size), options, &rt->counts);
      return pg;
    };
    rt->world_pg = group("world", rt->rank, rt->world);
    rt->tp_pg = group(absl::StrCat("tp/", rt->dp_rank), rt->tp_rank, p.tp);
    rt->dp_pg = group(absl::StrCat("dp/", rt->tp_rank), rt->dp_rank, p.dp);
    rt->ep_pg = group(absl::StrCat("ep/", rt->tp_rank, "/", ep_group), rt->ep_rank, p.ep);
    rt->expert_dp_pg = group(absl::StrCat("edp/", rt->tp_rank, "/", rt->ep_rank), ep_group, p.dp / p.ep);
  } catch (const c10::Error& e) {
    return absl::FailedPreconditionError(absl::StrCat(layout, ": ", e.what_without_backtrace()));
  }
  return rt;
}

ShardRule shardRule(const std::string& name, const ParallelRuntime& rt) {
  const ModelSpec& m = rt.model;
  const int64_t tp = rt.spec.tp, tp_rank = rt.tp_rank;
  auto rows = [](int64_t n, int64_t r) {
    return std::function<at::Tensor(const at::Tensor&)>([=](const at::Tensor& t) { return t.narrow(0, r * n, n); });
  };
  auto cols = [](int64_t n, int64_t r) {
    return std::function<at::Tensor(const at::Tensor&)>([=](const at::Tensor& t) { return t.narrow(1, r * n, n); });
  };
  const size_t experts = name.find(kExperts);
  if (experts != std::string::npos) {
    // model.layers.L.mlp.experts.J.{gate,up,down}_proj.weight, J local.
    const size_t begin = experts + sizeof(kExperts) - 1, end = name.find('.', begin);
    const int64_t local = std::stoll(name.substr(begin, end - begin));
    const std::string tail = name.substr(end + 1);
    ShardRule rule{absl::StrCat(name.substr(0, begin), rt.firstExpert() + local, ".", tail), nullptr};
    const int64_t inter = m.moe_intermediate_size / tp;
    rule.slice = absl::StartsWith(tail, "down_proj") ? cols(inter, tp_rank) : rows(inter, tp_rank);
    return rule;
  }
  if (!isAttentionProjection(name)) return {name, [](const at::Tensor& t) { return t; }};
  const int64_t q = m.num_attention_heads / tp * m.head_dim, kv = m.num_key_value_heads / tp * m.head_dim;
  std::function<at::Tensor(const at::Tensor&)> tp_slice;
  if (absl::EndsWith(name, "q_proj.weight")) tp_slice = rows(q, tp_rank);
  else if (absl::EndsWith(name, "o_proj.weight")) tp_slice = cols(q, tp_rank);
  else tp_slice = rows(kv, tp_rank);
  if (!rt.spec.fsdp) return {name, tp_slice};
  const int64_t dp = rt.spec.dp, dp_rank = rt.dp_rank;
  return {name, [=](const at::Tensor& t) {
            const at::Tensor flat = tp_slice(t).reshape({-1});
            const int64_t n = flat.numel() / dp;
            return flat.narrow(0, dp_rank * n, n);
          }};
}

void shardQwen3Moe(Qwen3MoeForCausalLM& model, const std::shared_ptr<ParallelRuntime>& rt) {
  torch::NoGradGuard no_grad;
  std::map<std::string, at::Tensor> full;
  for (const auto& item : model.named_parameters()) full[item.key()] = item.value().detach();
  for (const auto& module : *model.model->layers) {
    auto* layer = module->as<Qwen3MoeDecoderLayerImpl>();
    Qwen3MoeSparseMoeBlockImpl& moe = *layer->mlp;
    torch::nn::ModuleList mine;
    for (int64_t j = 0; j < rt->localExperts(); ++j) mine->push_back(moe.experts[rt->firstExpert() + j]);
    moe.replace_module("experts", mine);
    moe.experts = mine;
    moe.setParallel(rt);
    layer->self_attn->setParallel(rt);
  }
  for (auto& item : model.named_parameters()) {
    const ShardRule rule = shardRule(item.key(), *rt);
    item.value().set_data(rule.slice(full.at(rule.full_name)).clone(at::MemoryFormat::Contiguous));
  }
}

void synchronizeGradients(Qwen3MoeForCausalLM& model, const ParallelRuntime& rt) {
  const ParallelSpec& p = rt.spec;
  for (const auto& item : model.named_parameters()) {
    const at::Tensor& g = item.value().grad();
    if (!g.defined()) continue;
    const std::string& name = item.key();
    if (p.tp > 1 && (absl::EndsWith(name, "q_norm.weight") || absl::EndsWith(name, "k_norm.weight"))) {
      dist::allReduceInPlace(g, rt.tp_pg);
    }
    if (name.find(kExperts) != std::string::npos) {
      if (p.dp / p.ep > 1) dist::allReduceInPlace(g, rt.expert_dp_pg);
      if (p.dp > 1) g.div_(p.dp);
    } else if (!(p.fsdp && isAttentionProjection(name)) && p.dp > 1) {
      dist::allReduceInPlace(g, rt.dp_pg);
      g.div_(p.dp);
    }
  }
}

double allReduceScalar(double value, const c10::intrusive_ptr<c10d::ProcessGroup>& pg, bool max) {
  const at::Tensor t = at::full({1}, value, at::kDouble);
  dist::allReduceInPlace(t, pg, max ? c10d::ReduceOp::MAX : c10d::ReduceOp::SUM);
  return t.item<double>();
}

}  // namespace hpac::trainer
