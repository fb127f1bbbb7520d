#include "tools/launch/launcher.h"

#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

namespace hpac {
namespace dist {
namespace {

int freePort() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    std::cerr << "hpac-launch: cannot find a free loopback port: " << std::strerror(errno) << "\n";
    std::exit(1);
  }
  const int port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

struct Rank {
  pid_t pid = -1;
  int out_fd = -1;
  std::string pending;
  bool running = true;
  int status = 0;
};

void flushLines(int rank, Rank& r, bool all) {
  size_t pos;
  while ((pos = r.pending.find('\n')) != std::string::npos) {
    std::cout << "[rank " << rank << "] " << r.pending.substr(0, pos + 1);
    r.pending.erase(0, pos + 1);
  }
  if (all && !r.pending.empty()) {
    std::cout << "[rank " << rank << "] " << r.pending << "\n";
    r.pending.clear();
  }
  std::cout.flush();
}

// What every rank's environment gets besides its rank number.
struct Rendezvous {
  long nproc;
  std::string addr;
  long port;
  std::string threads;  // OMP_NUM_THREADS
};

// Forks the ranks, each one's stdout and stderr into a pipe of its own;
// false (after saying why) when a pipe cannot be made.
bool startRanks(const Rendezvous& rv, std::vector<char*>& argv, std::vector<Rank>& ranks) {
  for (long r = 0; r < rv.nproc; ++r) {
    int fds[2];
    if (pipe(fds) != 0) {
      std::cerr << "hpac-launch: pipe failed: " << std::strerror(errno) << "\n";
      return false;
    }
    const pid_t pid = fork();
    if (pid == 0) {
      dup2(fds[1], STDOUT_FILENO);
      dup2(fds[1], STDERR_FILENO);
      close(fds[0]);
      close(fds[1]);
      setenv("HPAC_RANK", std::to_string(r).c_str(), 1);
      setenv("HPAC_WORLD_SIZE", std::to_string(rv.nproc).c_str(), 1);
      setenv("HPAC_MASTER_ADDR", rv.addr.c_str(), 1);
      setenv("HPAC_MASTER_PORT", std::to_string(rv.port).c_str(), 1);
      setenv("OMP_NUM_THREADS", rv.threads.c_str(), 1);
      execvp(argv[0], argv.data());
      std::cerr << "hpac-launch: cannot run '" << argv[0] << "': " << std::strerror(errno) << "\n";
      _exit(127);
    }
    close(fds[1]);
    ranks[r].pid = pid;
    ranks[r].out_fd = fds[0];
  }
  return true;
}

// Waits up to 200 ms for output, then echoes what the ranks wrote, line by
// line; a rank's pipe is closed at its end.
void pumpOutput(std::vector<Rank>& ranks) {
  std::vector<pollfd> fds;
  for (auto& r : ranks) {
    if (r.out_fd >= 0) fds.push_back({r.out_fd, POLLIN, 0});
  }
  if (!fds.empty()) poll(fds.data(), fds.size(), 200);
  else usleep(200 * 1000);
  for (size_t k = 0; k < ranks.size(); ++k) {
    Rank& r = ranks[k];
    if (r.out_fd < 0) continue;
    char buf[4096];
    for (const auto& p : fds) {
      if (p.fd != r.out_fd || !(p.revents & (POLLIN | POLLHUP))) continue;
      const ssize_t n = read(r.out_fd, buf, sizeof(buf));
      if (n > 0) {
        r.pending.append(buf, static_cast<size_t>(n));
        flushLines(static_cast<int>(k), r, false);
      } else {
        flushLines(static_cast<int>(k), r, true);
        close(r.out_fd);
        r.out_fd = -1;
      }
    }
  }
}

// The ranks' exits as they happen: the first failure starts the grace
// period, after which the ranks still running are killed.
struct Supervision {
  using Clock = std::chrono::steady_clock;
  long grace_s;
  size_t running;
  Clock::time_point first_failure{};
  bool failed = false, terminated = false;

  void reap(std::vector<Rank>& ranks) {
    for (size_t k = 0; k < ranks.size(); ++k) {
      Rank& r = ranks[k];
      if (!r.running) continue;
      int status = 0;
      if (waitpid(r.pid, &status, WNOHANG) != r.pid) continue;
      r.running = false;
      r.status = status;
      --running;
      if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0) && !failed) {
        failed = true;
        first_failure = Clock::now();
        std::cout << "[hpac-launch] rank " << k << " failed ("
                  << (WIFEXITED(status) ? "exit status " + std::to_string(WEXITSTATUS(status))
                                        : "signal " + std::to_string(WTERMSIG(status)))
                  << "); the other ranks have " << grace_s << " s to finish\n";
      }
    }
  }

  void killAfterGrace(std::vector<Rank>& ranks) {
    if (!failed || terminated || running == 0 || Clock::now() - first_failure <= std::chrono::seconds(grace_s)) {
      return;
    }
    std::cout << "[hpac-launch] terminating " << running << " rank(s) still running after the grace period\n";
    for (auto& r : ranks) {
      if (r.running) kill(r.pid, SIGKILL);
    }
    terminated = true;
  }
};

// The output left in the pipes, then the verdict: 0 when every rank exited 0.
int finish(std::vector<Rank>& ranks) {
  for (size_t k = 0; k < ranks.size(); ++k) {
    if (ranks[k].out_fd >= 0) {
      flushLines(static_cast<int>(k), ranks[k], true);
      close(ranks[k].out_fd);
    }
  }
  std::vector<size_t> bad;
  for (size_t k = 0; k < ranks.size(); ++k) {
    const int s = ranks[k].status;
    if (!(WIFEXITED(s) && WEXITSTATUS(s) == 0)) bad.push_back(k);
  }
  if (bad.empty()) {
    std::cout << "[hpac-launch] all " << ranks.size() << " ranks succeeded\n";
    return 0;
  }
  std::cout << "[hpac-launch] failed ranks:";
  for (size_t k : bad) std::cout << " " << k;
  std::cout << "\n";
  return 1;
}

}  // namespace

int launchRanks(const LaunchOptions& options, const std::vector<std::string>& command) {
  Rendezvous rv{options.nproc, options.master_addr, options.master_port == 0 ? freePort() : options.master_port, ""};
  std::vector<char*> argv;
  for (const std::string& a : command) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  // Ranks share the machine's cores: unless the caller chose, each gets an
  // equal share of intra-op threads (libtorch reads OMP_NUM_THREADS at start).
  const char* preset_threads = std::getenv("OMP_NUM_THREADS");
  const long cores = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
  rv.threads = preset_threads != nullptr ? preset_threads : std::to_string(std::max(1L, cores / rv.nproc));
  std::vector<Rank> ranks(static_cast<size_t>(rv.nproc));
  if (!startRanks(rv, argv, ranks)) return 1;
  std::cout << "[hpac-launch] " << rv.nproc << " ranks, rendezvous " << rv.addr << ":" << rv.port
            << ", OMP_NUM_THREADS=" << rv.threads
            << (preset_threads != nullptr ? " (from the environment)" : " per rank") << "\n";
  Supervision watch{options.grace_s, ranks.size()};
  while (watch.running > 0) {
    pumpOutput(ranks);
    watch.reap(ranks);
    watch.killAfterGrace(ranks);
  }
  return finish(ranks);
}

}  // namespace dist
}  // namespace hpac
