#pragma once
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <yaml-cpp/yaml.h>
#include "absl/status/statusor.h"
