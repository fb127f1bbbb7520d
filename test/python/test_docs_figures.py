"""The docs' figure check (python3 -m bench.report, CTest docs.figures_match_json) on documents of its own: an inline
figure (<!-- fig SET.KEY -->value<!-- /fig -->) takes its value from the committed JSON, a wrong value or an unknown
key fails --check, --write mends it, and a figure outside both a region and an inline figure fails."""
import json
import os
import subprocess
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
RESULTS = os.path.join(ROOT, "bench", "results")


def report(*args):
    return subprocess.run([sys.executable, "-m", "bench.report", "--results", RESULTS, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def serve_ns():
    """The value the figure set sac_peer gives serve_ns, read here from the JSON itself."""
    with open(os.path.join(RESULTS, "sac_peer.json")) as f:
        return f"{json.load(f)['per_op']['extra_ns_per_op_over_plain']['hpac_serve']:+.0f} ns"


def test_an_inline_figure_is_checked_and_written_from_the_json(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("Serving costs about the plain op (<!-- fig sac_peer.serve_ns -->+12345 ns<!-- /fig -->).\n")
    wrong = report("--check", str(doc))
    assert wrong.returncode == 1 and "differs from the JSON" in wrong.stderr, wrong.stderr
    assert report("--write", str(doc)).returncode == 0
    assert doc.read_text() == (f"Serving costs about the plain op (<!-- fig sac_peer.serve_ns -->{serve_ns()}"
                               "<!-- /fig -->).\n")
    right = report("--check", str(doc))
    assert right.returncode == 0, right.stderr


def test_an_unknown_figure_and_a_stray_figure_fail(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text("A <!-- fig sac_peer.no_such_key -->1<!-- /fig --> and <!-- fig no_set.x -->2<!-- /fig -->.\n"
                   "A figure in the prose itself: 1.5 MiB.\n")
    done = report("--check", str(doc))
    assert done.returncode == 1
    assert "figure set 'sac_peer' has no figure 'no_such_key'" in done.stderr, done.stderr
    assert "unknown figure set 'no_set'" in done.stderr, done.stderr
    assert "line 2 quotes a figure outside" in done.stderr, done.stderr
