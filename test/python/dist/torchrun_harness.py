"""What the torchrun tests share: the tiny Qwen3-MoE YAML, the 2-rank layouts, and torchrun() running
hpac.harness.dist_train (or a script) on 2 Gloo ranks over loopback, one thread each."""
import os
import signal
import subprocess
import sys
import time

REPO = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
TOLERANCE = 1e-5
MODEL = """\
model: {preset: qwen3_moe_tiny, num_layers: 2, hidden_size: 64, num_attention_heads: 4, num_key_value_heads: 2,
        head_dim: 16, moe_intermediate_size: 32, num_experts: 4, num_experts_per_tok: 2, vocab_size: 128}
train: {seq_len: 16, micro_batch: 2, steps: 2, lr: 1.0e-3, seed: 1234}
activation_checkpoint: {mode: %s}
parallel: %s
"""
LAYOUTS = {"dp2_fsdp": "{dp: 2, fsdp: true}", "tp2": "{tp: 2}", "ep2_dp2_fsdp": "{dp: 2, ep: 2, fsdp: true}"}


def write_config(tmp_path, name, mode="selective", parallel="{dp: 2, fsdp: true}", compile_on=False):
    path = tmp_path / f"{name}.yaml"
    text = MODEL % (mode, parallel)
    path.write_text(text.replace("seed: 1234}", "seed: 1234, compile: true}") if compile_on else text)
    return str(path)


def torchrun(*args, timeout=600, target=("-m", "hpac.harness.dist_train"), nproc=2):
    """Runs `target` (a module after -m, or a script path) with args on nproc ranks; returns (exit status, output,
    seconds) and prints the command and every "[rank N]" line."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.path.join(REPO, "plugin", "python"))
    # The agent binds its store on port 0 itself (c10d rendezvous on 127.0.0.1:0; torch 2.13 hands the ranks that
    # store's port). A port picked here (bind, close, pass --master-port) could be taken by any other process on the
    # machine before torchrun's agent, seconds later under load, binds it again (EADDRINUSE, the job fails to start).
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
           "--rdzv-endpoint", "127.0.0.1:0", "--local-addr", "127.0.0.1", *target, *args]
    start = time.monotonic()
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out = "".join(p.communicate(timeout=timeout))  # stdout, then stderr
    except subprocess.TimeoutExpired:
        _kill_tree(p.pid)  # the agent and every rank (each rank runs in a session of its own)
        out = "".join(p.communicate())
        raise AssertionError(f"{os.environ.get('PYTEST_CURRENT_TEST', 'torchrun')}: {nproc} ranks still running after "
                             f"the {timeout} s limit (this job takes about a tenth of it on a loaded 2-core "
                             f"machine); where each rank was, its last line:\n{rank_phases(out)}\n$ {' '.join(cmd)}"
                             f"\n{out[-3000:]}") from None
    print(f"$ {' '.join(cmd)}  ({time.monotonic() - start:.1f} s, exit {p.returncode})")
    print("\n".join(line for line in out.splitlines() if line.startswith("[rank ")))
    if p.returncode != 0:
        print(f"where each rank was, its last line:\n{rank_phases(out)}")
    return p.returncode, out, time.monotonic() - start


def _kill_tree(pid):
    """SIGKILL to `pid` and every process below it (read from /proc: torchrun starts each rank in a session of its
    own, so neither killing the agent nor its process group reaches them, and they would hold the pipes open)."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    todo, tree = [pid], []
    while todo:
        tree.append(todo.pop())
        todo += children.get(tree[-1], [])
    for p in tree:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def rank_phases(out):
    """Each rank's last "[rank N]" line in `out` (the phase it reached), or that it printed none."""
    last = {}
    for line in out.splitlines():
        if line.startswith("[rank "):
            last[line.split("]", 1)[0] + "]"] = line
    return "\n".join(last[k] for k in sorted(last)) or "(no rank printed a line)"
