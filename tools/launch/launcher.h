// hpac/tools/launch/launcher.h
//
// Starts N local ranks of a command (hpac-launch, hpac-train --nproc N): each
// rank gets HPAC_RANK, HPAC_WORLD_SIZE, HPAC_MASTER_ADDR, HPAC_MASTER_PORT,
// and OMP_NUM_THREADS (cores / N unless already set);
// every line it prints (stdout and stderr) is echoed prefixed with
// "[rank r] ". When a rank exits with an error, the others get `grace_s`
// seconds to finish, then are killed. No rank waits forever on a dead peer:
// the process groups have timeouts of their own (HPAC_DIST_TIMEOUT_S), and
// the launcher bounds the rest.
#pragma once

#include <string>
#include <vector>

namespace hpac {
namespace dist {

struct LaunchOptions {
  int nproc = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;  // 0: a free loopback port
  int grace_s = 30;
};

// Runs `command` (argv, command[0] looked up in PATH) as `nproc` ranks and
// waits for all of them. Returns 0 when every rank exited 0, else 1 (after
// naming the failed ranks on stdout).
int launchRanks(const LaunchOptions& options, const std::vector<std::string>& command);

}  // namespace dist
}  // namespace hpac
