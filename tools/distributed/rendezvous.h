// hpac/tools/distributed/rendezvous.h
//
// Joining a multi-rank job on c10d (Gloo on CPU): the environment hpac-launch
// sets, the TCPStore, Gloo options, and the check that every rank runs the same
// effective config.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <string>

namespace hpac {
namespace dist {

// The rendezvous environment (set by hpac-launch): HPAC_RANK, HPAC_WORLD_SIZE,
// HPAC_MASTER_ADDR, HPAC_MASTER_PORT, optional HPAC_DIST_TIMEOUT_S (default 60).
struct DistEnv {
  int rank = 0;
  int world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;
  std::chrono::milliseconds timeout{60000};
};

// Reads and validates the environment; throws c10::Error naming the variable,
// its value and what is allowed.
DistEnv readDistEnv();

// A TCPStore on master_addr:master_port (rank 0 serves it).
c10::intrusive_ptr<c10d::Store> connectStore(const DistEnv& env);

// Gloo options over loopback (or master_addr) with the environment's timeout.
c10::intrusive_ptr<c10d::ProcessGroupGloo::Options> glooOptions(const DistEnv& env);

// Every rank publishes `summary` (one "key=value" per line); all ranks compare
// with rank 0's. Throws c10::Error naming the ranks and the differing lines.
void checkSameConfig(c10d::Store& store, int rank, int world_size, const std::string& summary);

}  // namespace dist
}  // namespace hpac
