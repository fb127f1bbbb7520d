"""The route planner through hpac.hf's door (hpac.hf.plan_routes -> torch.ops.hpac_config.plan_routes), on the
table of cases the C++ front end's test reads too (test/trainer/route_cases.json, test/trainer/route_plan_test.cpp):
the same facts give the plan the rules ask for in both languages."""
import json
import os

import pytest

import hpac.hf as hf

_TABLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "trainer", "route_cases.json")
with open(_TABLE) as f:
    CASES = {c["name"]: c for c in json.load(f)["cases"]}


def _expect_messages(messages, expected):
    if not expected:
        assert messages == []
    at = 0
    for level, text in expected:
        while at < len(messages) and not (messages[at][0] == level and text in messages[at][1]):
            at += 1
        assert at < len(messages), f"no {level} message containing {text!r} (in order) in {messages}"
        at += 1


def test_the_table_has_cases():
    assert len(CASES) >= 20


@pytest.mark.parametrize("name", sorted(CASES))
def test_case(name):
    case = CASES[name]
    expect = case["expect"]
    if "error" in expect:
        with pytest.raises(ValueError) as e:
            hf.plan_routes(case["facts"])
        assert expect["error"] in str(e.value)
        return
    plan = hf.plan_routes(case["facts"])
    for key, value in expect.items():
        if key == "layers":
            assert [[l["mode"], l["layer"], l["native"], l["submodules"]] for l in plan["layers"]] == value
        elif key == "messages":
            _expect_messages(plan["messages"], value)
        else:
            assert plan[key] == value, key


def test_facts_that_are_not_facts_name_the_key():
    facts = dict(CASES["selective_wraps_every_layer_whole"]["facts"])
    facts["model"] = {k: v for k, v in facts["model"].items() if k != "how"}
    with pytest.raises(ValueError, match="route facts: model.how: missing"):
        hf.plan_routes(facts)
