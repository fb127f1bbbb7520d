"""Multi-rank tests of hpac.distributed and hpac.harness.dist_train (torchrun, Gloo over loopback, 2 ranks): run by
the CTest entry python.dist (torch 2.13 leg, trainer built), which sets HPAC_LIBRARY and HPAC_CONFIG_LIBRARY. Without
transformers (the torch 1.13 leg's Debian Python) every test here skips."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "plugin", "python"))

pytest.importorskip("transformers")
