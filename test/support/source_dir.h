// hpac/test/support/source_dir.h
//
// The project's source folder as the build configured it, for tests that read
// its example and data files (test/support/source_dir.cpp holds the path, so
// no other test object embeds it).
#pragma once

#include <string>

namespace hpac {

// `relative` under the source folder, e.g. sourcePath("examples/training_demo/train.yaml").
std::string sourcePath(const std::string& relative);

}  // namespace hpac
