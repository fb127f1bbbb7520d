"""Tests of hpac.hf on real transformers models (tiny configs, random weights, nothing downloaded).

Run by the CTest entry python.hf (torch 2.13 leg, trainer built): it sets HPAC_LIBRARY, HPAC_CONFIG_LIBRARY and
HPAC_TRAIN. Without transformers (the torch 1.13 leg's Debian Python) every test here skips.
"""
import os
import sys
import warnings

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "plugin", "python"))

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
warnings.filterwarnings("ignore", category=FutureWarning)
