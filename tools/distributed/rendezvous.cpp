#include "tools/distributed/rendezvous.h"

#include <c10/util/Exception.h>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdlib>
#include <functional>
#include <sstream>
#include <vector>

namespace hpac {
namespace dist {
namespace {

int envInt(const char* name, int lo, int hi, int fallback, bool required) {
  const char* v = std::getenv(name);
  if (v == nullptr) {
    TORCH_CHECK(!required, "hpac dist: environment variable ", name,
                " is not set; start the ranks with hpac-launch --nproc N -- <command>");
    return fallback;
  }
  char* end = nullptr;
  const long x = std::strtol(v, &end, 10);
  TORCH_CHECK(end != v && *end == '\0' && x >= lo && x <= hi, "hpac dist: ", name, "='", v,
              "' is not an integer in [", lo, ", ", hi, "]");
  return static_cast<int>(x);
}

std::vector<std::string> lines(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

}  // namespace

DistEnv readDistEnv() {
  DistEnv env;
  env.world_size = envInt("HPAC_WORLD_SIZE", 1, 4096, 1, true);
  env.rank = envInt("HPAC_RANK", 0, env.world_size - 1, 0, true);
  env.master_port = envInt("HPAC_MASTER_PORT", 1, 65535, 0, true);
  if (const char* a = std::getenv("HPAC_MASTER_ADDR")) env.master_addr = a;
  env.timeout = std::chrono::seconds(envInt("HPAC_DIST_TIMEOUT_S", 1, 86400, 60, false));
  return env;
}

c10::intrusive_ptr<c10d::Store> connectStore(const DistEnv& env) {
  c10d::TCPStoreOptions opts;
  opts.port = static_cast<uint16_t>(env.master_port);
  opts.isServer = env.rank == 0;
  opts.numWorkers = env.world_size;
  opts.waitWorkers = true;
  opts.timeout = env.timeout;
  return c10::make_intrusive<c10d::TCPStore>(env.master_addr, opts);
}

c10::intrusive_ptr<c10d::ProcessGroupGloo::Options> glooOptions(const DistEnv& env) {
  auto options = c10d::ProcessGroupGloo::Options::create(env.timeout);
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(env.master_addr));
  return options;
}

void checkSameConfig(c10d::Store& store, int rank, int world_size, const std::string& summary) {
  auto put = [&](const std::string& key, const std::string& value) {
    store.set(key, std::vector<uint8_t>(value.begin(), value.end()));
  };
  auto get = [&](const std::string& key) {
    const auto bytes = store.get(key);
    return std::string(bytes.begin(), bytes.end());
  };
  put("hpac/config/" + std::to_string(rank), summary);
  put("hpac/config_hash/" + std::to_string(rank), std::to_string(std::hash<std::string>()(summary)));
  const std::string hash0 = get("hpac/config_hash/0");
  std::ostringstream diff;
  for (int r = 1; r < world_size; ++r) {
    if (get("hpac/config_hash/" + std::to_string(r)) == hash0) continue;
    const auto a = lines(get("hpac/config/0")), b = lines(get("hpac/config/" + std::to_string(r)));
    for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
      const std::string x = i < a.size() ? a[i] : "(absent)", y = i < b.size() ? b[i] : "(absent)";
      if (x != y) diff << "\n  rank 0: " << x << "\n  rank " << r << ": " << y;
    }
  }
  TORCH_CHECK(diff.str().empty(), "hpac dist: the ranks run different effective configs (every rank must use the same "
                                  "activation_checkpoint mode and plan):", diff.str());
}

}  // namespace dist
}  // namespace hpac
