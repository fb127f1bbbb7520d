"""scikit-build-core metadata provider (pyproject.toml): the wheel requires the torch release it is built against.

libhpac.so is compiled against one torch's C++ ABI; the package pins the running build's major.minor, so pip keeps
that torch (and refuses to pair the wheel with another release) instead of the loader refusing it at import time.
"""


def torch_requirement(version):
    """'2.13.0+cpu' -> 'torch>=2.13,<2.14'."""
    parts = version.split("+")[0].split(".")
    try:
        major, minor = int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        raise RuntimeError(f"hpac: torch.__version__ '{version}' is not of the form MAJOR.MINOR[.PATCH][+LOCAL]")
    return f"torch>={major}.{minor},<{major}.{minor + 1}"


def dynamic_metadata(field, settings=None):
    if field != "dependencies":
        raise RuntimeError(f"hpac_torch_requirement provides 'dependencies', not '{field}'")
    try:
        import torch
    except ImportError as e:
        raise RuntimeError("hpac: building the Python package needs torch installed in the building Python, "
                           "and pip's --no-build-isolation so that the build sees it") from e
    return [torch_requirement(torch.__version__)]
