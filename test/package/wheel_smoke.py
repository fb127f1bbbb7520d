"""Smoke test of an installed hpac wheel, run by tools/package_test.sh in a fresh virtual environment that holds
only torch, transformers and the wheel (python -I: no PYTHONPATH, no source tree on the path).

Checks: the package loads its own libhpac.so (inside the installed package), __version__ equals the wheel's
metadata, the wheel pins the torch release it was built for, `python -m hpac --help` and the `hpac` command report
version, dispatch key and status; and one training step of a small block under each policy (hpac.checkpoint, and
PyTorch's checkpoint with hpac's context_fn) gives gradients bitwise equal to a real no-checkpoint run (NaN is never
equal), with the selective policies serving ops from hpac's storage; and hpac.hf from the wheel alone: its config
library and registry come from the installed package, and a real transformers Qwen3MoeForCausalLM prepared from a YAML
trains under full and selective with losses and gradients equal to off bit for bit. Prints one line per check; exits 1
on failure.
"""
import importlib.metadata
import os
import subprocess
import sys

import torch
import torch.utils.checkpoint

import hpac

failures = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)


# --- the package and its library --------------------------------------------------------------------------------
package_dir = os.path.dirname(os.path.abspath(hpac.__file__))
library = hpac.load()
check(os.path.realpath(library) == os.path.realpath(os.path.join(package_dir, "lib", "libhpac.so")),
      f"libhpac.so loaded from inside the installed package ({library})")
check(hpac.built_for_torch(library).split("+")[0].rsplit(".", 1)[0] == torch.__version__.split("+")[0].rsplit(".", 1)[0],
      f"packaged library built for torch {hpac.built_for_torch(library)}, running torch {torch.__version__}")
metadata_version = importlib.metadata.version("hpac")
check(hpac.__version__ == metadata_version, f"hpac.__version__ {hpac.__version__} == wheel version {metadata_version}")
requires = importlib.metadata.requires("hpac") or []
major, minor = (int(p) for p in torch.__version__.split("+")[0].split(".")[:2])
torch_pins = [set(r.replace(" ", "")[len("torch"):].split(",")) for r in requires if r.startswith("torch")]
check(torch_pins == [{f">={major}.{minor}", f"<{major}.{minor + 1}"}],
      f"the wheel requires the torch release it was built for: {requires}")
check(hpac.fallback_status() == "registered", f"dispatcher fallback: {hpac.fallback_status()}")

help_text = subprocess.run([sys.executable, "-I", "-m", "hpac", "--help"], capture_output=True, text=True)
check(help_text.returncode == 0 and f"hpac {hpac.__version__}" in help_text.stdout
      and f"dispatch key:   {hpac.dispatch_key()}" in help_text.stdout and "fallback:       registered" in help_text.stdout,
      "python -m hpac --help lists version, dispatch key and status")
command = os.path.join(os.path.dirname(sys.executable), "hpac")
version_text = subprocess.run([command, "--version"], capture_output=True, text=True)
check(version_text.returncode == 0 and version_text.stdout.strip() == f"hpac {hpac.__version__}",
      f"`hpac --version` prints '{version_text.stdout.strip()}'")


# --- one step under each policy against off --------------------------------------------------------------------
class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(32, 64)
        self.down = torch.nn.Linear(64, 32)
        self.dropout = torch.nn.Dropout(0.1)

    def forward(self, x):
        h = torch.nn.functional.gelu(torch.mm(x, self.up.weight.t()) + self.up.bias)
        scores = torch.softmax(torch.bmm(h.unsqueeze(0), h.t().unsqueeze(0)).squeeze(0), -1)
        return self.dropout(self.down(torch.mm(scores, h)) + x)


torch.manual_seed(7)
block = Block()
x0 = torch.randn(16, 32)


def step(run):
    torch.manual_seed(11)  # dropout's mask
    x = x0.clone().requires_grad_(True)
    y = run(x)
    return torch.autograd.grad(y.pow(2).sum(), [x, *block.parameters()])


def identical(a, b):
    return all(p.shape == q.shape and not p.isnan().any() and not q.isnan().any() and torch.equal(p, q)
               for p, q in zip(a, b)) and len(a) == len(b)


off = step(block)
runs = {}
for policy in ("full", "selective", ["aten::mm"]):
    runs[f"hpac.checkpoint policy={policy}"] = (policy, lambda x, p=policy: hpac.checkpoint(block, x, policy=p))
    runs[f"torch checkpoint context_fn={policy}"] = (policy, lambda x, p=policy: torch.utils.checkpoint.checkpoint(
        block, x, use_reentrant=False, context_fn=hpac.context_fn(p)))
for name, (policy, run) in runs.items():
    hpac.reset_global_stats()
    grads = step(run)
    stats = hpac.global_stats()
    served_as_expected = stats["served"] > 0 if policy != "full" else stats["served"] == 0
    check(identical(grads, off) and served_as_expected and stats["recomputes"] == 1,
          f"{name}: gradients equal off bit for bit; saved {stats['saved']}, served {stats['served']}, "
          f"recomputed {stats['recomputed']}")


# --- hpac.hf from the wheel alone: config parser, registry and route planner inside the package ------------------
import hpac.hf as hf  # noqa: E402
import hpac.harness.compare as hc  # noqa: E402
import hpac.harness.models as hm  # noqa: E402
import transformers  # noqa: E402

transformers.logging.set_verbosity_error()
config_library = hf.load_config_library()
check(config_library is not None and os.path.realpath(config_library)
      == os.path.realpath(os.path.join(package_dir, "lib", "libhpac_config.so")),
      f"hpac.hf loads libhpac_config.so from inside the installed package ({config_library})")
# yaml-cpp and abseil: a wheel (auditwheel repair) carries them in hpac.libs/ beside the package; a build from the sdist
# links the build machine's. Either way the process maps what the config library reports it was built with.
with open("/proc/self/maps") as maps:
    mapped = sorted({line.split()[-1] for line in maps if "yaml-cpp" in line or "libabsl_" in line})
bundled = os.path.realpath(os.path.join(package_dir, "..", "hpac.libs"))
from_wheel = os.path.isdir(bundled)
check(mapped and all(os.path.realpath(m).startswith(bundled + os.sep) == from_wheel for m in mapped),
      f"yaml-cpp and abseil loaded from {'the wheel (hpac.libs/)' if from_wheel else 'the system (a source build)'}: "
      f"{', '.join(os.path.basename(m) for m in mapped)}")
built_with = torch.ops.hpac_config.built_with()
check(built_with.startswith("yaml-cpp ") and ", abseil " in built_with and f"built with {built_with}" in
      subprocess.run([sys.executable, "-I", "-m", "hpac"], capture_output=True, text=True).stdout,
      f"python -m hpac names the config library's yaml-cpp and abseil ({built_with})")
registry = hf.load_registry()
check(os.path.realpath(registry["file"]) == os.path.realpath(os.path.join(package_dir, "share", "hpac",
                                                                          "model_registry.yaml")),
      f"the model registry comes from the installed package ({registry['file']})")
config = hf.parse_config("model: {preset: qwen3_moe_tiny, num_layers: 2}\n"
                         "train: {seq_len: 16, micro_batch: 2, steps: 2}\n", "wheel.yaml")
spec, train = config["model"], config["train"]


def build_qwen3_moe():
    return hm.qwen3_moe_model(spec, train["seed"])


hf_runs = hc.train_compare(
    build_qwen3_moe, config,
    lambda step: hm.token_batch(spec["vocab_size"], train["micro_batch"], train["seq_len"], train["seed"], step),
    steps=train["steps"], lr=train["lr"], track_memory=False, registry=registry)
for row in hc.summary(hf_runs):
    recomputed = row["mode"] == "off" or (row["route"] != "off" and row["recomputed"] > 0)
    check(row["max_dloss"] == 0 and row["max_dgrad"] == 0 and recomputed,
          f"hpac.hf {row['mode']} on transformers {transformers.__version__} Qwen3MoeForCausalLM: route "
          f"{row['route']}, wrapped {row['wrapped']}, recomputed {row['recomputed']}, max |dloss| {row['max_dloss']:.3g}, max |dgrad| "
          f"{row['max_dgrad']:.3g} vs off")

print(f"{len(failures)} failed" if failures else "OK: the installed wheel checkpoints with each policy, gradients "
      "equal to off; hpac.hf trains a transformers model without a build tree")
sys.exit(1 if failures else 0)
