"""mode budget on several ranks (hpac.harness.dist_train under torchrun, Gloo on loopback): every rank profiles in
step 1 and then replays rank 0's plan (Note [One budget plan for every rank], hpac/distributed.py). Asserted: every rank holds
the same plan text from step 2 on, parity with off (bit for bit) and with the 1-rank run, the counts of a profile
(as full) and of a plan (as selective), and a rank whose region leaves the shared plan failing on every rank with
one message."""
import json
import re

import pytest

from torchrun_harness import TOLERANCE, torchrun, write_config


def _budget_config(tmp_path, parallel, fraction=0.5):
    return write_config(tmp_path, "budget", mode=f"budget, memory_budget: {fraction}", parallel=parallel)


def _check_budget_run(run, nproc):
    assert run["ranks"] == nproc
    held = {tuple(r["budget_plans"]["held"]) for r in run["per_rank"]}
    own = [tuple(r["budget_plans"]["own"]) for r in run["per_rank"]]
    # Every rank's regions hold one plan text per layer, rank 0's own.
    assert held == {own[0]}, (held, own)
    assert len(own[0]) == 2  # both layers are budget regions
    for rank in run["per_rank"]:
        rows = rank["modes"]["budget"]
        assert [r["budget_stage"] for r in rows] == ["profiling"] + ["planned"] * (len(rows) - 1), rows
        for row in rows:
            where = f"rank {rank['rank']} budget step {row['step']}"
            assert row["dloss_1rank"] <= TOLERANCE and row["dgrad_1rank"] <= TOLERANCE, (where, row)
            assert row["dloss_off"] == 0.0 and row["dgrad_off"] == 0.0, (where, row)
    return own


@pytest.mark.parametrize("nproc,parallel", [(2, "{dp: 2, fsdp: true}"), (2, "{tp: 2}"),
                                           (2, "{dp: 2, ep: 2, fsdp: true}"), (4, "{tp: 2, dp: 2, fsdp: true}"),
                                           (4, "{tp: 2, dp: 2, ep: 2, fsdp: true}")])
def test_every_rank_replays_rank0s_plan(tmp_path, nproc, parallel):
    out_json = tmp_path / "run.json"
    rc, out, _ = torchrun("--config", _budget_config(tmp_path, parallel), "--modes", "off,budget", "--steps", "3",
                          "--json", str(out_json), nproc=nproc)
    assert rc == 0, out[-4000:]
    own = _check_budget_run(json.loads(out_json.read_text()), nproc)
    print(f"{nproc} ranks: own plans per rank {[[d[:12] for d in o] for o in own]}, "
          f"{len(set(own))} distinct before sharing")
    for r in range(nproc):
        assert f"[rank {r}] budget: every layer replays rank 0's plan from step 2 on" in out, out[-3000:]
    assert "OK: " in out


@pytest.mark.parametrize("step,message", [
    (1, "hpac.distributed: mode budget: the ranks' regions ran different ops in the profile, so rank 0's plan cannot "
        "serve every rank; no rank trains on. rank 1, layer 0: op "),
    (2, "does not match the region: its op "),
])
def test_rank_leaving_the_shared_plan_fails_on_every_rank(tmp_path, step, message):
    rc, out, _ = torchrun("--config", _budget_config(tmp_path, "{dp: 2, fsdp: true}"), "--modes", "budget",
                          "--steps", "3", "--diverge-rank", "1", "--diverge-step", str(step), timeout=300)
    assert rc != 0
    # Each rank's error line (up to the next rank's line: two ranks write to one pipe).
    found = re.findall(r"\[rank (\d)\] error: (.*?)(?=\[rank \d\] |$)", out, re.M)
    assert sorted(r for r, _ in found) == ["0", "1"], out[-3000:]
    errors = [m for _, m in found]
    # One message, reported by both ranks: in step 1 every rank finds the differing profiles (the first to post
    # names itself), from step 2 on rank 1's region raises.
    assert set(errors) == {errors[0]}, errors
    first = "rank [01]" if step == 1 else "rank 1"
    assert re.match(f"{first}, step {step}, mode budget: ", errors[0]), errors
    assert message in errors[0], errors
    assert "aten::mul.Tensor" in errors[0], errors  # the extra op rank 1 ran
    # Nobody trains on: the plans are compared after step 1; a region leaving the plan stops its step.
    assert "budget step 2:" not in out, out[-3000:]


def test_budget_needs_memory_budget(tmp_path):
    rc, out, _ = torchrun("--config", write_config(tmp_path, "selective"), "--modes", "off,budget", timeout=300)
    assert rc != 0
    for r in (0, 1):
        assert f"[rank {r}] error: " in out and "mode budget needs activation_checkpoint.memory_budget" in out, \
            out[-3000:]
