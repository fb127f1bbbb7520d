// hpac/plugin/version_line.h
//
// The line hpac's command-line tools print for --version. Tools that link
// libhpac report the loaded library's version and the torch it was built for
// (what actually runs); hpac-launch, which has no torch, the version it was
// compiled with.
#pragma once

#ifdef HPAC_TORCH_VERSION
#include "plugin/fallback.h"
#endif

#include <iostream>
#include <string>

namespace hpac {

inline std::string versionLine(const std::string& tool) {
#ifdef HPAC_TORCH_VERSION
  return tool + " " + version() + " (libhpac " + libraryPath() + ", built for torch " + builtForTorch() + ")";
#else
  return tool + " " + HPAC_VERSION;
#endif
}

// Every CLI's --help / -h (prints `usage`) and --version (prints versionLine);
// true when `flag` was one of them and the tool should exit 0.
inline bool printedHelpOrVersion(const std::string& flag, const std::string& tool, const char* usage) {
  if (flag == "--help" || flag == "-h") {
    std::cout << usage << "\n";
    return true;
  }
  if (flag == "--version") {
    std::cout << versionLine(tool) << "\n";
    return true;
  }
  return false;
}

}  // namespace hpac
