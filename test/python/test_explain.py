"""hpac.explain and hpac-explain: the recorded decisions against the invocation's stats, bytes of a hand-computed
region, the JSON schema, a well-formed SVG, and bad input named with what is allowed."""
import json
import os
import subprocess
import xml.etree.ElementTree as ET

import pytest
import torch

import hpac
from hpac.harness.blocks import Block

hpac.load(os.environ.get("HPAC_LIBRARY"))

OP_FIELDS = {"phase": str, "op": str, "occurrence": int, "decision": str, "answer": str, "rule": str,
             "output_bytes": int, "kept_bytes": int, "micros": (int, float)}
DECISIONS = {"forward": {"save", "recompute", "ignore"}, "recompute": {"serve", "recompute", "skip", "ignore"}}


def check_schema(data, modes):
    assert data["schema"] == "hpac.explain/1"
    for key in ("source", "region", "mode"):
        assert isinstance(data[key], str) and data[key]
    for key in ("ops_forward", "ops_recompute", "saved", "saved_bytes", "served", "recomputed", "ignored", "unserved"):
        assert isinstance(data["stats"][key], int), key
    assert data["ops"], "no op recorded"
    for row in data["ops"]:
        assert set(row) == set(OP_FIELDS), row
        for key, kind in OP_FIELDS.items():
            assert isinstance(row[key], kind), (key, row)
        assert row["decision"] in DECISIONS[row["phase"]], row
        assert row["output_bytes"] >= 0 and row["kept_bytes"] >= 0 and row["micros"] >= 0
    assert [t["mode"] for t in data["timeline"]] == list(modes)
    for t in data["timeline"]:
        assert t["bytes"] and max(t["bytes"]) == t["peak_bytes"]
        assert 0 <= t["marks"]["backward"] <= len(t["bytes"])
    # The rows agree with the invocation's own counts.
    rows = data["ops"]
    count = lambda phase, d: sum(1 for r in rows if r["phase"] == phase and r["decision"] == d)
    s = data["stats"]
    assert count("forward", "save") == s["saved"]
    assert count("recompute", "serve") == s["served"]
    assert count("recompute", "recompute") == s["recomputed"]


def check_svg(text, modes):
    root = ET.fromstring(text)
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    lines = root.findall("{http://www.w3.org/2000/svg}polyline")
    assert len(lines) == len(modes)
    for line in lines:
        points = line.get("points").split()
        assert len(points) >= 2
        for p in points:
            x, y = (float(v) for v in p.split(","))
            assert 0 <= x <= float(root.get("width")) and 0 <= y <= float(root.get("height"))


def test_explain_moe_block_matches_stats_and_writes_files(tmp_path):
    torch.manual_seed(0)
    block = Block()
    x = torch.randn(2, 16, 32, requires_grad=True)
    out = hpac.explain(block, x, policy="selective", json_path=str(tmp_path / "e.json"),
                       svg_path=str(tmp_path / "e.svg"))
    check_schema(out.data, hpac.EXPLAIN_MODES)
    assert json.loads((tmp_path / "e.json").read_text()) == out.data
    check_svg((tmp_path / "e.svg").read_text(), hpac.EXPLAIN_MODES)
    assert out.data["stats"]["served"] > 0 and out.data["stats"]["recomputed"] > 0
    assert any(r["rule"].startswith("selective rule 2: matmul family") for r in out.data["ops"])
    assert "invocation stats: saved" in out.text


def test_explain_a_budget_explains_its_plan_not_its_profile():
    torch.manual_seed(0)
    block = Block()
    x = torch.randn(2, 16, 32, requires_grad=True)
    # Just under 1.0: at 1.0 hpac's frame holds what off keeps and no recompute runs (Note [Frames hold what needs
    # no recompute]); explain then shows forward rows only (below).
    budget = hpac.budget(0.99)
    out = hpac.explain(block, x, policy=budget, modes=("off",))
    assert out.data["mode"] == "budget" and budget.stage == "planned"
    rows = out.data["ops"]
    assert all(r["rule"].startswith("budget plan entry") for r in rows if r["phase"] == "forward"
               and r["decision"] != "ignore")
    skipped = [r for r in rows if r["decision"] == "skip"]
    # Note [The recompute stops early]: the recompute ends at the last saved tensor the frame does not hold, so the
    # plan's skips after it are never reached.
    assert len(skipped) == out.data["stats"]["skipped"] > 0
    assert len(skipped) <= budget.status()["skipped_ops"]
    assert sum(r["decision"] == "serve" for r in rows) == out.data["stats"]["served"] > 0
    whole = hpac.budget(1.0)
    out = hpac.explain(block, x, policy=whole, modes=("off",))
    assert whole.status()["skipped_ops"] > 0 and out.data["stats"]["served"] == 0
    assert not [r for r in out.data["ops"] if r["phase"] == "recompute"]


def test_explain_bytes_of_a_hand_computed_region():
    # Save list {mm, transpose, neg}; x [4, 8], w [8, 16], w2 [4, 8] float32:
    # mm 4x16x4 = 256 B new and kept; transpose a view of it: 0 B, listed but recomputed (a view);
    # neg 16x4x4 = 256 B new and kept; mul_ in place: 0, not saved; mm 16x8x4 = 512 B new and kept.
    torch.manual_seed(1)
    x = torch.randn(4, 8, requires_grad=True)
    w = torch.randn(8, 16, requires_grad=True)
    w2 = torch.randn(4, 8, requires_grad=True)

    def region(inp):
        r = torch.neg((inp @ w).transpose(0, 1))
        r.mul_(2)
        return r @ w2

    out = hpac.explain(region, x, policy=["aten::mm", "aten::transpose.int", "aten::neg"], modes=("off", "full"))
    rows = [(r["op"], r["decision"], r["output_bytes"], r["kept_bytes"]) for r in out.data["ops"]
            if r["phase"] == "forward" and r["decision"] != "ignore"]
    assert rows == [("aten::mm", "save", 256, 256), ("aten::transpose.int", "recompute", 0, 0),
                    ("aten::neg", "save", 256, 256), ("aten::mul_.Tensor", "recompute", 0, 0),
                    ("aten::mm", "save", 512, 512)], rows
    check_schema(out.data, ("off", "full"))


@pytest.mark.parametrize("kwargs, message", [
    ({"modes": ("off", "sometimes")}, "unknown mode 'sometimes'; allowed: off, full, selective"),
    ({"policy": "off"}, "checkpoints nothing, so there is nothing to explain"),
    ({"json_path": "/nonexistent-hpac-folder/e.json"}, "cannot write '/nonexistent-hpac-folder/e.json'"),
])
def test_explain_rejects_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        hpac.explain(torch.nn.Linear(2, 2), torch.randn(1, 2), **kwargs)


def test_explain_unknown_policy_kind_is_named():
    with pytest.raises(RuntimeError, match="sometimes"):
        hpac.explain(torch.nn.Linear(2, 2), torch.randn(1, 2), policy="sometimes")


CLI = os.environ.get("HPAC_EXPLAIN")


@pytest.mark.skipif(CLI is None, reason="HPAC_EXPLAIN (the hpac-explain binary) is set by CTest's python.pytest")
def test_cli_json_and_svg(tmp_path):
    run = subprocess.run([CLI, "--mode", "budget", "--blocks", "1", "--json", str(tmp_path / "c.json"), "--svg",
                          str(tmp_path / "c.svg"), "--rows", "3"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    data = json.loads((tmp_path / "c.json").read_text())
    check_schema(data, ("off", "full", "selective", "budget"))
    check_svg((tmp_path / "c.svg").read_text(), ("off", "full", "selective", "budget"))
    assert all(r["rule"].startswith("budget plan entry ") for r in data["ops"]
               if r["phase"] == "forward" and r["decision"] != "ignore")
    assert "more forward rows (JSON has all)" in run.stdout
