import gc
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "plugin", "python"))


@pytest.fixture(scope="module")
def only_new_objects_scanned():
    """For modules that call gc.collect() dozens of times per test (the lifetime tests): in the whole suite's process
    each call scanned every object the earlier modules left (imports, models, transformers), about 5x the module's
    own time. The objects alive before the module are collected once and then frozen (gc.freeze: no later collection
    scans them, so none of them can be what a test watches die), and given back to the collector after it."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()
