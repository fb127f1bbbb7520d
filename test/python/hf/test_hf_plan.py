"""hpac plan (plugin/python/hpac/plan.py): a whole step planned on the meta device for a machine that is not here.
A meta tensor counts its bytes; a meta step holds, event by event, what the same step holds on CPU; a plan made on
meta and applied by a real run (activation_checkpoint.plan) holds that run's peak within 2 % of its prediction and
trains bitwise as off; a plan made for another model, shapes, dtype or world size is refused naming the difference;
device specs and the command line's errors name what is allowed."""
import gc
import json
import os
import re
import subprocess
import sys

import pytest
import torch

import hpac
import hpac.hf as hf
import hpac.harness.models as hm
import models
from hpac import _devices
import hpac.plan as _plan

YAML = models.QWEN3_MOE_YAML.replace("seq_len: 32, micro_batch: 2", "seq_len: 128, micro_batch: 4")
PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(hpac.__file__)))


def _yaml(tmp_path, mode="off", extra="", name="run.yaml"):
    path = tmp_path / name
    path.write_text(YAML % mode + extra)
    return str(path)


def _python(code, **env):
    """`code` in a fresh process (a pinned roofline, the meta step's global settings) with this test's hpac."""
    path = os.pathsep.join([PACKAGE] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=path, **env))
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_meta_tensor_counts_its_bytes_until_it_dies():
    torch.ops.hpac.track_meta_memory()
    assert torch.ops.hpac.meta_memory_tracked()
    gc.collect()
    before = hpac.cpu_tensor_memory_stats()["current_bytes"]
    t = torch.empty(1000, 3, device="meta")
    u = t.to(torch.bfloat16)
    assert hpac.cpu_tensor_memory_stats()["current_bytes"] - before == 12000 + 6000
    del t, u
    assert hpac.cpu_tensor_memory_stats()["current_bytes"] == before


_EVENTS = """
import json, sys, torch, hpac, hpac.hf as hf
from hpac import _devices
import hpac.plan as _plan
import hpac.harness.models as hm
dev = sys.argv[1] if len(sys.argv) > 1 else {dev!r}
cfg = hf.load_config({config!r})
if dev == "meta":
    torch.ops.hpac.track_meta_memory()
    _devices.set_meta_roofline(_devices.SPECS["h100-sxm"])
else:
    hpac.track_memory()
model = hm.qwen3_moe_model(cfg["model"], 0, device=dev)
ac = dict(cfg["activation_checkpoint"], mode="budget", memory_target={{"bytes": 1 << 40, "text": "1TiB", "where": "t"}},
          cost="estimated")
prep = hf.prepare(model, dict(cfg, activation_checkpoint=ac), log=lambda level, message: None)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
prep.target.watch_optimizer(opt)
ids = torch.zeros(4, 128, dtype=torch.long, device=dev)
import contextlib
with (_plan._traceable(model, []) if dev == "meta" else contextlib.nullcontext()):
    for step in range(3):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
print(json.dumps(prep.target.report()["events"]))
"""


def test_a_meta_step_holds_at_every_event_what_a_cpu_step_holds(tmp_path):
    """The step's events (Note [The step's peak as events]) measured on the meta device and on CPU, no layer
    checkpointed: within 0.5 % each (Note [A meta op holds its outputs]: without it a decomposed log_softmax
    counts its intermediates; Note [Attention on meta as on CPU]: without it attention keeps its scores)."""
    config = _yaml(tmp_path)
    cpu = _python(_EVENTS.format(dev="cpu", config=config))
    meta = _python(_EVENTS.format(dev="meta", config=config))
    assert set(cpu) == set(meta) and len(cpu) == 3 * 4 + 2
    for event, held in cpu.items():
        assert abs(meta[event] - held) <= 0.005 * held, (event, meta[event], held)


_APPLY = """
import json, torch, hpac, hpac.hf as hf
import hpac.harness.models as hm
hpac.track_memory()
torch.set_num_threads(1)
def train(config, set_to_none=True):
    cfg = hf.load_config(config)
    model = hm.qwen3_moe_model(cfg["model"], 1234)
    messages = []
    prep = hf.prepare(model, cfg, log=lambda level, message: messages.append((level, message)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    peaks, losses = [], []
    for step in range(4):
        ids = hm.token_batch(cfg["model"]["vocab_size"], 4, 128, 1, step)
        hpac.reset_cpu_tensor_peak()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=set_to_none)
        peaks.append(hpac.cpu_tensor_memory_stats()["peak_bytes"])
        losses.append(loss.item())
    report = prep.target.report() if prep.target is not None else None
    del model, opt, prep, loss
    return peaks, losses, report, messages
off = train({off!r})
planned = train({planned!r})
kept = train({planned!r}, set_to_none=False)
print(json.dumps({{"off": off, "planned": planned, "kept": kept}}))
"""


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """Plans made by `python -m hpac plan` for the test model: a probe (fixed modes full and off), then a target
    half way from full's peak to off's (above full's floor with the gradients kept through the forward too)."""
    folder = tmp_path_factory.mktemp("plans")
    config = _yaml(folder)
    probe = _plan.plan(config, "1GiB", modes=("off", "full"))
    lo, hi = probe["modes"]["full"]["peak_bytes"], probe["modes"]["off"]["peak_bytes"]
    assert lo < hi
    target = int(lo + (hi - lo) / 2)
    path = folder / "plan.json"
    done = subprocess.run([sys.executable, "-m", "hpac", "plan", config, "--memory-target", f"{target}B",
                           "--out", str(path), "--quiet"], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=PACKAGE))
    assert done.returncode == 0, done.stderr
    with open(path) as f:
        return folder, config, target, json.load(f)


def test_a_plan_made_on_meta_holds_in_a_real_run_and_trains_as_off(plans):
    folder, config, target, plan = plans
    assert any(layer["checkpointed"] for layer in plan["layers"])
    planned = folder / "planned.yaml"  # the plan's path is relative to the YAML's folder
    planned.write_text((YAML % "budget").replace("{mode: budget}", "{mode: budget, plan: plan.json}"))
    rates = _devices.SPECS["h100-sxm"]
    pinned = f"{rates.flops_tflops['float32'] * 1e6:.6g}:{rates.bandwidth_tb_s * 1e6:.6g}"
    out = _python(_APPLY.format(off=config, planned=str(planned)), HPAC_ROOFLINE=pinned)
    assert max(out["off"][0]) > target  # the plan had something to do
    # Note [A plan file is a first plan]: the file runs as its target, its layers the first plan where this run's
    # profile step predicts them within it; every step is held to the target, the first included, whether the loop
    # frees the gradients before each forward (zero_grad's default) or keeps them (set_to_none=False).
    for run in ("planned", "kept"):
        peaks, losses, report, messages = out[run]
        assert report["target_bytes"] == target
        assert losses == out["off"][1], run  # bitwise: the plan's regions recompute what off computes
        assert max(peaks) <= target, (run, peaks, target, messages)
        assert all(row["measured_bytes"] <= target for row in report["history"]), (run, report["history"])
        applied = any(f"the plan of {planned.parent / 'plan.json'}, checked" in m for _, m in messages)
        replanned = any(level == "warning" and "is not applied" in m for level, m in messages)
        assert applied != replanned, (run, messages)  # one or the other, said
        if applied:
            assert [x["checkpointed"] for x in report["layers"]] == [x["checkpointed"] for x in plan["layers"]]
        assert abs(plan["predicted_bytes"] - max(peaks)) <= 0.02 * max(peaks), (plan["predicted_bytes"], peaks)


def test_a_plan_for_another_run_is_refused_naming_the_difference(plans, tmp_path):
    folder, config, target, plan = plans
    path = str(folder / "plan.json")

    def prepare(text, model=None):
        cfg = hf.parse_config(text.replace("{mode: off}", f"{{mode: budget, plan: {path}}}"), "p.yaml")
        model = model or models.qwen3_moe(cfg["model"])
        return model, hf.prepare(model, cfg, log=lambda level, message: None)

    with pytest.raises(_plan.PlanError, match=r"made for model num_hidden_layers 4, this run has 3"):
        prepare((YAML % "off").replace("num_layers: 4", "num_layers: 3"))
    with pytest.raises(_plan.PlanError, match=r"made for train\.seq_len 128, this run has 64"):
        prepare((YAML % "off").replace("seq_len: 128", "seq_len: 64"))
    cfg = hf.parse_config(YAML % "off", "p.yaml")
    with pytest.raises(_plan.PlanError, match=r"made for dtype 'float32', this run has 'bfloat16'"):
        prepare(YAML % "off", models.qwen3_moe(cfg["model"]).to(torch.bfloat16))
    model, prep = prepare(YAML % "off")
    ids = hm.token_batch(cfg["model"]["vocab_size"], 2, 128, 1, 0)
    with pytest.raises(_plan.PlanError, match=r"micro_batch x seq_len \(4, 128\), this call has \(2, 128\)"):
        model(input_ids=ids, labels=ids)
    hf.unprepare(model, prep)
    model(input_ids=ids, labels=ids)  # the guard went with the preparation


def test_plan_files_that_are_not_plans_are_refused(tmp_path):
    with pytest.raises(_plan.PlanError, match=r"no such file; allowed: a plan written by"):
        _plan.load(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(_plan.PlanError, match=r"bad.json: not JSON at line 1, column 2"):
        _plan.load(tmp_path / "bad.json")
    (tmp_path / "old.json").write_text('{"format": "hpac-step-plan 0"}')
    with pytest.raises(_plan.PlanError, match=r"format is 'hpac-step-plan 0' .*; allowed: a record written by .*"
                                              r"hpac-step-plan 2, or hpac-step-plan 1"):
        _plan.load(tmp_path / "old.json")
    (tmp_path / "region.plan").write_text('{"format": "hpac-budget-plan 1"}')
    with pytest.raises(_plan.PlanError, match=r"format is 'hpac-budget-plan 1'"):
        _plan.load(tmp_path / "region.plan")


def test_a_version_1_plan_is_read_as_version_2(plans, tmp_path):
    """Note [The step record's format]: hpac 0.1's plan files keep working; their keys read under version 2's names."""
    folder, config, target, plan = plans
    v1 = {("memory_target_bytes" if k == "target_bytes" else "meta_measured_bytes" if k == "measured_bytes" else
           "meta_measured_event" if k == "measured_event" else k): v
          for k, v in plan.items() if k not in ("planned_at_step", "margin_bytes", "error", "history")}
    v1["format"] = "hpac-step-plan 1"
    (tmp_path / "v1.json").write_text(json.dumps(v1))
    back = _plan.load(tmp_path / "v1.json")
    assert back["format"] == _plan.FORMAT and back["target_bytes"] == plan["target_bytes"] == target
    assert back["measured_bytes"] == plan["measured_bytes"] and back["layers"] == plan["layers"]
    assert _plan.load(folder / "plan.json") == json.loads(json.dumps(plan))  # version 2 reads back as written


def test_the_parser_takes_plan_with_mode_budget_alone():
    c = hf.parse_config("activation_checkpoint:\n  mode: budget\n  plan: p.json\n", "b.yaml")
    assert c["activation_checkpoint"]["plan"] == {"path": "p.json", "where": "b.yaml:3:9"}
    with pytest.raises(RuntimeError, match=r"b\.yaml:3:9: activation_checkpoint\.plan: 'p\.json' is set beside "
                                           r"memory_target"):
        hf.parse_config("activation_checkpoint:\n  mode: budget\n  plan: p.json\n  memory_target: 8GiB\n", "b.yaml")
    with pytest.raises(RuntimeError, match=r"'p\.json' is set but mode is 'full'; allowed only with "
                                           r"activation_checkpoint\.mode: budget"):
        hf.parse_config("activation_checkpoint:\n  mode: full\n  plan: p.json\n", "b.yaml")


def test_a_device_spec_times_each_dtype_at_its_own_rate(tmp_path):
    """Note [A device that is not here]: a matmul on meta is estimated at its dtype's peak from the spec."""
    spec = tmp_path / "dev.yaml"
    spec.write_text("name: slow\nflops_tflops: {float32: 1, bfloat16: 4}\nbandwidth_tb_s: 1000\nmemory_gb: 16\n"
                    "source: a test\n")
    out = _python(f"""
import json, torch, hpac
from hpac import _devices
torch.ops.hpac.track_meta_memory()
_devices.set_meta_roofline(_devices.device_spec({str(spec)!r}))
torch.ops.hpac.meta_ops_in_regions(True)
rows = {{}}
for dtype in (torch.float32, torch.bfloat16):
    b = hpac.budget(bytes=0, cost="estimated")
    w = torch.empty(256, 512, device="meta", dtype=dtype, requires_grad=True)
    x = torch.empty(128, 256, device="meta", dtype=dtype, requires_grad=True)
    hpac.checkpoint(lambda t: torch.mm(t, w).sum(), x, policy=b).backward()
    rows[str(dtype)] = [p["estimated_micros"] for p in b.profile() if p["op"] == "aten::mm"][0]
print(json.dumps(rows))
""")
    flops = 2 * 128 * 256 * 512
    assert out["torch.float32"] == pytest.approx(flops / 1e6)       # 1 TFLOP/s = 10^6 flop per µs
    assert out["torch.bfloat16"] == pytest.approx(flops / 4e6)


@pytest.mark.parametrize("text, message", [
    ("flops_tflops: {bfloat16: 4}\nbandwidth_tb_s: 1\nmemory_gb: 1\n", r"needs a float32 entry"),
    ("flops_tflops: {float32: 1}\nbandwidth_tb_s: 0\nmemory_gb: 1\n", r"bandwidth_tb_s 0 is not a positive number"),
    ("flops_tflops: {float32: 1, int4: 9}\nbandwidth_tb_s: 1\nmemory_gb: 1\n", r"names dtype 'int4'"),
    ("flops_tflops: {float32: 1}\nbandwidth_tb_s: 1\nmemory_gb: 1\nclock: 3\n", r"unknown key\(s\) clock"),
])
def test_bad_device_specs_name_what_is_allowed(tmp_path, text, message):
    spec = tmp_path / "dev.yaml"
    spec.write_text(text)
    with pytest.raises(_devices.DeviceSpecError, match=message + r".*allowed: a shipped spec \(a100-sxm-80gb, "):
        _devices.device_spec(str(spec))
    with pytest.raises(_devices.DeviceSpecError, match=r"'tpu9' is neither a shipped spec nor a file"):
        _devices.device_spec("tpu9")


def test_the_command_line_plans_and_says_what_was_wrong(tmp_path):
    config = _yaml(tmp_path)
    env = dict(os.environ, PYTHONPATH=PACKAGE)
    ok = subprocess.run([sys.executable, "-m", "hpac", "plan", config, "--memory-target", "1GiB", "--report",
                         "--out", str(tmp_path / "p.json"), "--plot", str(tmp_path / "p.svg")],
                        capture_output=True, text=True, env=env)
    assert ok.returncode == 0, ok.stderr
    assert "plan (measured): step 1 of 1 on the meta device" in ok.stderr  # progress
    assert "model.layers.3" in ok.stdout and (tmp_path / "p.json").exists()
    assert (tmp_path / "p.svg").read_text().count("<path") > 10  # matplotlib drew the step
    bad = subprocess.run([sys.executable, "-m", "hpac", "plan", config, "--device", "tpu9"], capture_output=True,
                         text=True, env=env)
    assert bad.returncode == 2 and "error: hpac: device spec 'tpu9' is neither" in bad.stderr
    low = subprocess.run([sys.executable, "-m", "hpac", "plan", config, "--memory-target", "1MiB", "--quiet"],
                         capture_output=True, text=True, env=env)
    assert low.returncode == 2 and "is below this step's floor" in low.stderr


def test_a_real_runs_report_names_its_layers_and_the_largest_holders_when_over(plans):
    """The same report from a real run under memory_target (Preparation.step_report), and, for a step over its
    target, the largest holders of its peak."""
    folder, config, target, plan = plans
    cfg = hf.parse_config((YAML % "budget").replace("{mode: budget}", f"{{mode: budget, memory_target: {target}B}}"),
                          "r.yaml")
    hpac.track_memory()
    model = models.qwen3_moe(cfg["model"])
    prep = hf.prepare(model, cfg, log=lambda level, message: None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(3):
        ids = hm.token_batch(cfg["model"]["vocab_size"], 4, 128, 1, step)
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    report = prep.step_report()
    assert [x["path"] for x in report["layers"]] == [f"model.layers.{i}" for i in range(4)]
    assert report["measured_bytes"] <= target
    assert sum(x["ops"]["recomputed"] for x in report["layers"] if x["checkpointed"]) > 0
    text = _plan.report_text(report)
    assert "measured on cpu" in text and "over the target" not in text
    over = dict(report, target_bytes=report["measured_bytes"] // 2)
    text = _plan.report_text(over)
    biggest = max([v for k, v in report["fixed"].items() if isinstance(v, int)] +
                  [x["kept_bytes"] if x["checkpointed"] else x["off_bytes"] for x in report["layers"]])
    assert "over the target by" in text and f"the largest holders: " in text
    assert _plan.holders(over)[0][1] == biggest
    hf.unprepare(model, prep)


def test_a_plan_frees_its_meta_step_and_names_one_ranks_parts_below_the_floor(tmp_path):
    """plan() returns with nothing of its meta models alive (their bytes count in the tracker a real run's target
    reads), and a target below the floor of a sharded step names the parameters and gradients one rank holds."""
    config = _yaml(tmp_path)
    hpac.track_memory()
    gc.collect()
    before = hpac.cpu_tensor_memory_stats()["current_bytes"]
    _plan.plan(config, "1GiB", world_size=2, modes=("full",))
    assert hpac.cpu_tensor_memory_stats()["current_bytes"] == before  # no gc.collect() of ours: plan() leaves nothing behind
    model = models.qwen3_moe(hf.load_config(config)["model"])
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    del model
    with pytest.raises(_plan.PlanError, match="below this step's floor") as e:
        _plan.plan(config, "1MiB", world_size=2)
    named = re.search(r"\(parameters ([\d.]+) MiB; .*gradients up to ([\d.]+) MiB", str(e.value))
    assert named, str(e.value)
    for value in named.groups():
        assert abs(float(value) - params / 2 / 2**20) < 0.01, (str(e.value), params)


class _Stack(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(),
                                                              torch.nn.Linear(256, 64)) for _ in range(3))

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x.square().mean()


def _meta_roofline():
    try:
        return tuple(torch.ops.hpac.roofline("meta"))
    except RuntimeError:
        return None


def test_plan_leaves_the_process_as_it_found_it(tmp_path):
    """Note [plan() leaves the process as it found it]: plan() between two steps of a real CPU memory target leaves
    the next step's bytes, the RNG state, transformers' logging level, the meta allocator and the rooflines as they
    were."""
    import transformers
    hpac.track_memory()
    torch.manual_seed(1)
    model = _Stack()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    target = hpac.fit_memory_target(model, model.layers, "1GiB", optimizer=opt)
    x = torch.randn(32, 64)

    def step():
        model(x).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        gc.collect()  # what earlier tests left in cycles: not this step's
        return torch.ops.hpac.memory_stats()["current_bytes"]

    for _ in range(3):
        step()
    transformers.logging.set_verbosity_info()
    rng, level = torch.get_rng_state(), transformers.logging.get_verbosity()
    meta_tracked, roofline = torch.ops.hpac.meta_memory_tracked(), _meta_roofline()
    live = step()  # with the RNG state above alive
    _plan.plan(_yaml(tmp_path), "1GiB")
    assert torch.equal(torch.get_rng_state(), rng)
    assert transformers.logging.get_verbosity() == level
    assert torch.ops.hpac.meta_memory_tracked() == meta_tracked
    assert _meta_roofline() == roofline
    assert torch.ops.hpac.memory_stats()["current_bytes"] == live
    assert step() == live
    history = target.history
    assert history[-1]["measured_bytes"] == history[-2]["measured_bytes"], history[-2:]
    target.remove()
    transformers.logging.set_verbosity_error()
