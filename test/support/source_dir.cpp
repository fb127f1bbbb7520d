#include "test/support/source_dir.h"

namespace hpac {

std::string sourcePath(const std::string& relative) { return std::string(HPAC_SOURCE_DIR) + "/" + relative; }

}  // namespace hpac
