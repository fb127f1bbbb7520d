"""The budget planner against the exact optimum of its additive objective (Note [An exact oracle for the planner],
policy/budget_plan.h; the MILP in plan_oracle.py): on hand-made profiles (torch.ops.hpac.plan_budget) and on profiles
recorded from real regions (Budget.profile's groups), hpac's plan fits the budget and leaves at most 1 % more kernel
time to recompute than the optimum, which fits too. With dead-op skipping, hpac's plan recomputes no more than the
additive optimum's plan does when hpac replays it (skipping what that choice lets it skip), and the optimum's plan,
written as a plan file, replays with off's gradients bit for bit."""
import random

import pytest
import torch

import hpac
from hpac._loader import _major_minor

if _major_minor(torch.__version__) < (2, 0):  # only on the 1.13 leg: Debian's python3 there has no scipy
    pytest.skip("the MILP oracle needs scipy, which the torch 1.13 leg's Debian python3 lacks; it runs on the pip leg",
                allow_module_level=True)

import hpac.harness.plan_oracle as plan_oracle  # noqa: E402
from hpac.harness.blocks import Block  # noqa: E402
from hpac.harness.parity import assert_same  # noqa: E402

TOLERANCE = 0.01  # the bound: within 1 % of the optimum's recompute time


def _hand_made(kind: str, seed: int):
    """(storage_counts, ids, bytes, micros, view, collective) of a synthetic profile."""
    rng = random.Random(seed)
    counts, ids, sizes, micros, view, collective = [], [], [], [], [], []
    n = {"independent": 80, "shared": 120, "many_small": 600}[kind]
    next_id = 0
    for i in range(n):
        if kind == "many_small":  # an MoE layer's expert loop: many similar outputs, a few large ones
            size = rng.choice([4096, 4096 + 64, 6144]) if i % 40 else rng.randint(1 << 20, 4 << 20)
        else:
            size = int(rng.lognormvariate(11, 1.5))
        storages = []
        if kind == "shared" and i and rng.random() < 0.25:  # an in-place result or second output: a shared storage
            storages.append((rng.randrange(next_id), size))
        storages.append((next_id, size))
        next_id += 1
        is_view = kind == "shared" and rng.random() < 0.1
        counts.append(len(storages))
        ids += [s for s, _ in storages]
        sizes += [b for _, b in storages]
        micros.append(size ** 0.8 / 100 * rng.uniform(0.2, 3.0) if not is_view else 0.0)
        view.append(int(is_view))
        collective.append(int(kind == "shared" and rng.random() < 0.03))
    return counts, ids, sizes, micros, view, collective


@pytest.mark.parametrize("kind, seed", [("independent", 1), ("independent", 2), ("shared", 3), ("shared", 4),
                                        ("many_small", 5)])
@pytest.mark.parametrize("fraction", [0.05, 0.3, 0.6, 0.9])
def test_the_planner_is_within_one_percent_of_the_optimum_on_hand_made_profiles(kind, seed, fraction):
    profile = _hand_made(kind, seed)
    save, group_of, group_bytes, group_micros, collective = torch.ops.hpac.plan_budget(*profile, 0)
    budget = int(fraction * sum(group_bytes))
    save, group_of, group_bytes, group_micros, collective = torch.ops.hpac.plan_budget(*profile, budget)
    assert all(g >= 0 or not s for s, g in zip(save, group_of))  # views are never kept
    ours = plan_oracle.keep_of_save(save, group_of, len(group_bytes))
    best = plan_oracle.optimum(group_bytes, group_micros, collective, budget)
    forced = sum(b for b, c in zip(group_bytes, collective) if c)
    assert plan_oracle.kept_bytes(ours, group_bytes, collective) <= max(budget - forced, 0)
    assert plan_oracle.kept_bytes(best, group_bytes, collective) <= max(budget - forced, 0)
    ours_left = plan_oracle.recompute_micros(ours, group_micros)
    best_left = plan_oracle.recompute_micros(best, group_micros)
    assert best_left <= ours_left + 1e-6, "the MILP is the optimum: nothing beats it"
    assert ours_left <= best_left * (1 + TOLERANCE) + 1e-6, (ours_left, best_left)


def _regions(fraction, skip_dead):
    """Recorded profiles: the test MoE block and a dense block, each a region planned at `fraction` from one
    profiled step (estimated costs: the profile is the same in every run)."""
    torch.manual_seed(0)
    dense = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64),
                                torch.nn.LayerNorm(64))
    cases = []
    for name, module, x in (("moe", Block(), torch.randn(2, 16, 32)), ("dense", dense, torch.randn(4, 32, 64))):
        b = hpac.budget(fraction, cost="estimated", skip_dead=skip_dead)
        x = x.requires_grad_(True)
        torch.manual_seed(3)
        hpac.checkpoint(module, x, policy=b).pow(2).mean().backward()
        assert b.stage == "planned"
        cases.append((name, module, x, b))
    return cases


@pytest.mark.parametrize("fraction", [0.2, 0.5, 0.8])
def test_the_planner_is_within_one_percent_of_the_optimum_on_recorded_profiles(fraction):
    for name, _, _, b in _regions(fraction, skip_dead=False):
        g = plan_oracle.region_groups(b)
        st = b.status()
        text = b._region.plan_text()
        save = [int(r["decision"] == "keep") for r in plan_oracle.plan_decisions(text)]
        ours = plan_oracle.keep_of_save(save, g["group_of"], len(g["bytes"]))
        best = plan_oracle.optimum(g["bytes"], g["micros"], g["collective"], st["budget_bytes"])
        assert plan_oracle.kept_bytes(best, g["bytes"], g["collective"]) <= st["budget_bytes"], name
        assert st["kept_bytes"] <= st["budget_bytes"], name
        ours_left = plan_oracle.recompute_micros(ours, g["micros"])
        best_left = plan_oracle.recompute_micros(best, g["micros"])
        assert best_left <= ours_left + 1e-6, name
        assert ours_left <= best_left * (1 + TOLERANCE) + 1e-6, (name, ours_left, best_left)


@pytest.mark.parametrize("fraction", [0.2, 0.5, 0.8])
def test_with_skipping_hpac_recomputes_no_more_than_the_additive_optimum_and_both_replay(fraction, tmp_path):
    for name, module, x, b in _regions(fraction, skip_dead=True):
        ours = plan_oracle.plan_recompute_micros(b._region.plan_text())
        text = plan_oracle.optimal_plan_text(b)
        theirs = plan_oracle.plan_recompute_micros(text)
        assert ours <= theirs * (1 + TOLERANCE) + 1e-6, (name, ours, theirs)
        path = tmp_path / f"{name}-{fraction}.plan"
        path.write_text(text)
        replayed = hpac.budget(plan=str(path))

        def step(run):
            module.zero_grad(set_to_none=True)
            x.grad = None
            torch.manual_seed(3)
            run().pow(2).mean().backward()
            return [x.grad] + [p.grad for p in module.parameters()]

        off = step(lambda: module(x))
        for _ in range(2):
            hpac.reset_global_stats()
            assert_same(step(lambda: hpac.checkpoint(module, x, policy=replayed)), off)
            assert hpac.global_stats()["saved"] == sum(r["decision"] == "keep"
                                                       for r in plan_oracle.plan_decisions(text))
