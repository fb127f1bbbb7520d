"""Device specs: what a plan for a device that is not here times its ops on (Note [A device that is not here],
replay/op_cost.h; docs/python.md, "Plan for the machine you will train on").

A spec is a datasheet's numbers: the peak dense matmul rate per dtype (no structured sparsity), the memory bandwidth
and the memory size. An op's estimated time on it is max(flops / peak rate of its dtype, bytes moved / bandwidth):
a roofline at peak, so the plan's recompute times are lower bounds of what the device will take (kernels reach a
fraction of peak; small ops are launch-bound); they rank candidates, they do not predict a step time. Shipped specs
carry their source; any other comes from a YAML file:

    name: my-accelerator
    flops_tflops: {float32: 67, bfloat16: 989}     # dense peak per dtype, 10^12 flop/s; float32 required
    bandwidth_tb_s: 3.35                           # 10^12 bytes/s
    memory_gb: 80                                  # 10^9 bytes, as datasheets write it
    source: "where the numbers come from"
"""
import os
from dataclasses import dataclass, field
from typing import Dict, Union

import torch


@dataclass(frozen=True)
class DeviceSpec:
    name: str
    flops_tflops: Dict[str, float]  # torch dtype name ("float32", "bfloat16", ...) -> dense peak, 10^12 flop/s
    bandwidth_tb_s: float
    memory_gb: float
    source: str
    notes: str = field(default="")

    @property
    def memory_bytes(self) -> int:
        return int(self.memory_gb * 1e9)

    def as_dict(self) -> dict:
        return {"name": self.name, "flops_tflops": dict(self.flops_tflops), "bandwidth_tb_s": self.bandwidth_tb_s,
                "memory_gb": self.memory_gb, "memory_bytes": self.memory_bytes, "source": self.source,
                "notes": self.notes}


# Dense peaks (the datasheets' sparse figures are twice these). float32: the non-tensor-core rate, what torch's
# float32 matmul runs at by default (torch.backends.cuda.matmul.allow_tf32 is False).
SPECS = {
    "h100-sxm": DeviceSpec(
        "h100-sxm", {"float32": 67.0, "bfloat16": 989.4, "float16": 989.4}, 3.35, 80,
        "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column (nvidia.com/en-us/data-center/h100)"),
    "h200-sxm": DeviceSpec(
        "h200-sxm", {"float32": 67.0, "bfloat16": 989.4, "float16": 989.4}, 4.8, 141,
        "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column (nvidia.com/en-us/data-center/h200)"),
    "a100-sxm-80gb": DeviceSpec(
        "a100-sxm-80gb", {"float32": 19.5, "bfloat16": 312.0, "float16": 312.0}, 2.039, 80,
        "NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM column (nvidia.com/en-us/data-center/a100)"),
    "mi300x": DeviceSpec(
        "mi300x", {"float32": 163.4, "bfloat16": 1307.4, "float16": 1307.4}, 5.3, 192,
        "AMD Instinct MI300X accelerator datasheet (amd.com/en/products/accelerators/instinct/mi300/mi300x.html)"),
}

# torch dtype names -> c10's scalar type names (torch.ops.hpac.set_roofline).
_C10 = {"float32": "Float", "bfloat16": "BFloat16", "float16": "Half", "float64": "Double"}
_ALLOWED = (f"allowed: a shipped spec ({', '.join(sorted(SPECS))}) or a YAML file with name, flops_tflops "
            f"(per dtype: {', '.join(_C10)}; float32 required), bandwidth_tb_s, memory_gb, source")


class DeviceSpecError(ValueError):
    """A device spec that is not shipped, not a readable file, or is missing a number."""


def _positive(value, key, where):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise DeviceSpecError(f"hpac: device spec {where}: {key} {value!r} is not a positive number; {_ALLOWED}")
    return float(value)


def device_spec(spec: Union[str, os.PathLike, DeviceSpec]) -> DeviceSpec:
    """A shipped spec by name ('h100-sxm'), or one read from a YAML file; DeviceSpecError naming what is wrong."""
    if isinstance(spec, DeviceSpec):
        return spec
    text = os.fspath(spec)
    if text in SPECS:
        return SPECS[text]
    if not os.path.isfile(text):
        raise DeviceSpecError(f"hpac: device spec {text!r} is neither a shipped spec nor a file; {_ALLOWED}")
    import yaml
    with open(text, encoding="utf-8") as f:
        data = yaml.safe_load(f)
    if not isinstance(data, dict):
        raise DeviceSpecError(f"hpac: device spec {text}: not a mapping; {_ALLOWED}")
    unknown = sorted(set(data) - {"name", "flops_tflops", "bandwidth_tb_s", "memory_gb", "source", "notes"})
    if unknown:
        raise DeviceSpecError(f"hpac: device spec {text}: unknown key(s) {', '.join(unknown)}; {_ALLOWED}")
    flops = data.get("flops_tflops")
    if not isinstance(flops, dict) or "float32" not in flops:
        raise DeviceSpecError(f"hpac: device spec {text}: flops_tflops {flops!r} needs a float32 entry; {_ALLOWED}")
    for dtype in flops:
        if dtype not in _C10:
            raise DeviceSpecError(f"hpac: device spec {text}: flops_tflops names dtype {dtype!r}; {_ALLOWED}")
    return DeviceSpec(
        str(data.get("name") or os.path.basename(text)),
        {k: _positive(v, f"flops_tflops.{k}", text) for k, v in flops.items()},
        _positive(data.get("bandwidth_tb_s"), "bandwidth_tb_s", text),
        _positive(data.get("memory_gb"), "memory_gb", text),
        str(data.get("source") or "(no source given)"), str(data.get("notes") or ""))


def set_meta_roofline(spec: DeviceSpec) -> None:
    """The meta device's ops are timed on `spec` from now on, in this process (Note [A device that is not here])."""
    per_us = 1e12 / 1e6
    dtypes = [d for d in spec.flops_tflops if d != "float32"]
    torch.ops.hpac.set_roofline("meta", spec.flops_tflops["float32"] * per_us, spec.bandwidth_tb_s * per_us,
                                [_C10[d] for d in dtypes], [spec.flops_tflops[d] * per_us for d in dtypes])
