// hpac-launch: starts N local ranks of a command, rendezvous on loopback.
//
//   hpac-launch --nproc N [--master-addr 127.0.0.1] [--master-port P] [--grace-s S] -- command [args...]
//
// Each rank gets HPAC_RANK, HPAC_WORLD_SIZE, HPAC_MASTER_ADDR, HPAC_MASTER_PORT
// (a free port when --master-port is 0, the default) and OMP_NUM_THREADS
// (cores / N unless set). Every line a rank prints (stdout and stderr) is
// echoed prefixed with "[rank r] ". When a rank exits with an error, the
// others get --grace-s seconds (default 30) to finish, then are terminated,
// and hpac-launch exits 1 naming the failed ranks. No rank ever waits forever
// on a dead peer: the process groups have timeouts of their own
// (HPAC_DIST_TIMEOUT_S), and the launcher bounds the rest.
#include "tools/launch/launcher.h"
#include "plugin/version_line.h"

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

namespace {

const char* kUsage =
    "usage: hpac-launch --nproc N [--master-addr ADDR] [--master-port PORT] [--grace-s S] -- command [args...]\n"
    "       hpac-launch --version";

[[noreturn]] void usageError(const std::string& what) {
  std::cerr << "hpac-launch: " << what << "\n" << kUsage << "\n";
  std::exit(2);
}

long parseInt(const std::string& flag, const std::string& v, long lo, long hi) {
  char* end = nullptr;
  const long x = std::strtol(v.c_str(), &end, 10);
  if (end == v.c_str() || *end != '\0' || x < lo || x > hi) {
    usageError(flag + " expects an integer in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got '" + v +
               "'");
  }
  return x;
}

}  // namespace

int main(int argc, char** argv) {
  long nproc = -1, port = 0, grace_s = 30;
  std::string addr = "127.0.0.1";
  int i = 1;
  for (; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (hpac::printedHelpOrVersion(a, "hpac-launch", kUsage)) return 0;
    if (i + 1 >= argc) usageError(a + " needs a value");
    if (a == "--nproc") {
      nproc = parseInt(a, argv[++i], 1, 64);
    } else if (a == "--master-port") {
      port = parseInt(a, argv[++i], 0, 65535);
    } else if (a == "--grace-s") {
      grace_s = parseInt(a, argv[++i], 1, 3600);
    } else if (a == "--master-addr") {
      addr = argv[++i];
    } else {
      usageError("unknown flag '" + a + "'");
    }
  }
  if (nproc < 1) usageError("--nproc is required");
  if (i >= argc) usageError("no command after --");

  hpac::dist::LaunchOptions options;
  options.nproc = static_cast<int>(nproc);
  options.master_addr = addr;
  options.master_port = static_cast<int>(port);
  options.grace_s = static_cast<int>(grace_s);
  return hpac::dist::launchRanks(options, std::vector<std::string>(argv + i, argv + argc));
}
