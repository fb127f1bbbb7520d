// The tracking CPU allocator lives in the core (replay/) so that Python users
// reach it through torch.ops.hpac too; this header keeps the tools' include path.
#pragma once
#include "replay/tracking_allocator.h"
