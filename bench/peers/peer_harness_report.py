"""docs/results.md "Peer harness" (section peer): off, torch.utils.checkpoint full, the Python-mode SAC and hpac
per sequence length, from bench/results/peer.json (bench/peers/peer_harness.py)."""
from bench.common.report import load, tunables


def peer(r):
    d = load(r, "peer.json")
    out = [f"torch {d['torch']}, {d['threads']} thread(s), GLIBC_TUNABLES={tunables(d)}", "",
           "| seq | off ms | torch_full ms | py_sac ms | hpac ms | off peak MiB | torch_full | py_sac | hpac | "
           "hpac/py_sac time | hpac/torch_full time | hpac/off time |",
           "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for x in d["results"]:
        out.append(f"| {x['seq']} | {x['off']['ms']:.1f} | {x['torch_full']['ms']:.1f} | {x['py_sac']['ms']:.1f} | "
                   f"{x['hpac']['ms']:.1f} | {x['off']['peak_MiB']:.1f} | {x['torch_full']['peak_MiB']:.1f} | "
                   f"{x['py_sac']['peak_MiB']:.1f} | {x['hpac']['peak_MiB']:.1f} | {x['hpac_vs_py_sac_time']:.3f} | "
                   f"{x['hpac_vs_torch_full_time']:.3f} | {x['hpac_vs_off_time']:.3f} |")
    return out
