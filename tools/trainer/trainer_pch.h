// Precompiled header of hpac_trainer (and hpac-train, REUSE_FROM).
#pragma once
#include <torch/torch.h>
#include <yaml-cpp/yaml.h>
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
