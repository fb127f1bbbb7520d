"""activation_checkpoint.memory_target on several ranks (hpac.harness.dist_train under torchrun, Gloo on loopback,
FSDP2): every rank plans the same from the largest bases and kept bytes any rank measured (Note [One step plan for
every rank], plugin/python/hpac/_target.py), each rank's measured step peak stays under the target, and the harness's
own checks hold (bit for bit with off, within tolerance of the 1-rank run). A first run with a target no step
reaches (every layer unwrapped) measures the floor and off's peak per rank as the model predicts them; the second
names a target between the two."""
import json

import pytest

from torchrun_harness import torchrun, write_config

STEPS = 4


def _run(tmp_path, name, nproc, parallel, target):
    config = write_config(tmp_path, name, mode=f"budget, memory_target: {target}", parallel=parallel)
    with open(config) as f:  # activations that set the peak: the shared YAML's 16 tokens x 2 do not
        text = f.read().replace("seq_len: 16, micro_batch: 2", "seq_len: 256, micro_batch: 4")
    with open(config, "w") as f:
        f.write(text)
    out_json = tmp_path / f"{name}.json"
    rc, out, _ = torchrun("--config", config, "--modes", "off,budget", "--steps", str(STEPS), "--json",
                          str(out_json), nproc=nproc)
    assert rc == 0, out[-4000:]
    return [rank["memory_target"]["budget"] for rank in json.loads(out_json.read_text())["per_rank"]]


@pytest.mark.parametrize("nproc,parallel", [(2, "{dp: 2, fsdp: true}"), (4, "{tp: 2, dp: 2, fsdp: true}")])
def test_every_rank_fits_one_plan_under_the_target(tmp_path, nproc, parallel):
    probe = _run(tmp_path, "probe", nproc, parallel, "64GiB")
    assert len(probe) == nproc
    for r in probe:
        assert all(not layer["checkpointed"] for layer in r["layers"])  # nothing needed under 64 GiB
    floor = max(r["uniform"][1]["predicted_bytes"] for r in probe)  # every layer at budget 0
    off = max(r["uniform"][0]["predicted_bytes"] for r in probe)
    assert floor < off
    target = (floor + off) // 2
    ranks = _run(tmp_path, "target", nproc, parallel, f"{target}B")
    plans = {json.dumps([(l["checkpointed"], l["budget_bytes"]) for l in r["layers"]]) for r in ranks}
    assert len(plans) == 1, plans  # one plan on every rank
    assert any(layer["checkpointed"] for layer in ranks[0]["layers"])
    for rank, r in enumerate(ranks):
        planned = [h for h in r["history"] if h["planned"]]
        assert len(planned) == STEPS - 1, r["history"]  # each step closes when its optimizer step ends
        assert len(r["history"]) == STEPS, r["history"]
        for h in r["history"]:  # every step, the profile step included
            assert h["measured_bytes"] <= target, (rank, h, target)
