"""The whole-step planner (policy/step_plan.h, Note [An exact step plan]) against the exact optimum of a MILP over the
same choices (scipy's milp, HiGHS; a test dependency only), on random problems of up to 12 layers x 18 candidates,
where enumerating every choice (as test/step_plan_test.cpp does for small ones) is out of reach."""
import random

import pytest
import torch

import hpac  # noqa: F401  (loads libhpac: torch.ops.hpac.plan_step)

np = pytest.importorskip("numpy")
optimize = pytest.importorskip("scipy.optimize")


def _events(n, fixed, head, recompute):
    """Note [The step's peak as events]: a forward event per layer ((i + 1, i): the layers before it keep, it holds
    its forward bytes), the head, a backward event per layer (whose recompute grows towards the first layer, as
    gradients pile up)."""
    ev = [(fixed, i + 1, i) for i in range(n)] + [(fixed + head, n, -1)]
    return ev + [(fixed + recompute + 10 * (n - i), i, i) for i in range(n)]


def _milp(layers, events, target):
    """The least summed µs with every event <= target, or None when nothing fits."""
    index = [(j, c) for j, cands in enumerate(layers) for c in range(len(cands))]
    cost = np.array([layers[j][c][2] for j, c in index])
    rows, lo, hi = [], [], []
    for j in range(len(layers)):  # one candidate per layer
        rows.append([1.0 if jj == j else 0.0 for jj, _ in index])
        lo.append(1)
        hi.append(1)
    for base, m, own in events:
        forward = own >= 0 and m == own + 1  # its own layer adds its forward bytes, not its kept bytes
        rows.append([(layers[j][c][0] if j < m and not (forward and j == own) else 0)
                     + (layers[j][c][3 if forward else 1] if j == own else 0) for j, c in index])
        lo.append(-np.inf)
        hi.append(target - base)
    res = optimize.milp(cost, constraints=optimize.LinearConstraint(np.array(rows, dtype=float), lo, hi),
                        integrality=np.ones(len(index)), bounds=optimize.Bounds(0, 1), options={"mip_rel_gap": 0})
    return res.fun if res.success else None


@pytest.mark.parametrize("seed", range(12))
def test_the_step_plan_is_the_milps_optimum(seed):
    rng = random.Random(seed)
    n, k = 4 + seed % 9, 6 + seed % 13
    layers = []
    for _ in range(n):
        off = rng.randint(500, 2000)
        transient = rng.randint(0, off)  # a forward holds its transients and what it has kept so far
        cands = [(off, 0, 0.0, off + rng.randint(0, transient))]  # unwrapped
        for b in range(k - 1):  # kept bytes grow, recompute time falls, as a budget's candidates do
            kept = off * b // (k - 1)
            cands.append((kept, rng.randint(0, kept // 8 + 1), rng.uniform(0.5, 1.0) * 100 * (k - 1 - b) + 20,
                          max(transient, kept + rng.randint(0, transient))))
        layers.append(cands)
    events = _events(n, 100_000, rng.randint(0, 3000), rng.randint(500, 3000))
    floor = max(b for b, _, _ in events)
    target = floor + rng.randint(0, sum(c[0][0] for c in layers))
    flat = [c for cands in layers for c in cands]
    choice, peak, _, micros, fits, exact, _ = torch.ops.hpac.plan_step(
        [len(c) for c in layers], [c[0] for c in flat], [c[1] for c in flat], [float(c[2]) for c in flat],
        [c[3] for c in flat], [e[0] for e in events], [e[1] for e in events], [e[2] for e in events], target)
    best = _milp(layers, events, target)
    assert fits == (best is not None)
    if fits:
        assert exact
        assert peak <= target
        assert micros == pytest.approx(best, rel=1e-9, abs=1e-6)
        # what it reports is what the choice costs
        assert micros == pytest.approx(sum(layers[j][c][2] for j, c in enumerate(choice)))


def test_malformed_problems_are_errors_naming_them():
    with pytest.raises(RuntimeError, match="layer 0 has no candidate plans"):
        torch.ops.hpac.plan_step([0], [], [], [], [], [], [], [], 10)
    with pytest.raises(RuntimeError, match="counts 3 layers' kept bytes; allowed: 0 to 1"):
        torch.ops.hpac.plan_step([1], [1], [0], [0.0], [1], [0], [3], [-1], 10)
