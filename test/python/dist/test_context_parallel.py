"""Context parallel (parallel.cp): torch 2.13's context_parallel does not run on CPU (Note [Context parallel needs
CUDA], hpac/harness/parallel.py), so the runner refuses cp > 1 on CPU before the first step on every rank, and refuses
the layouts and attentions it cannot split. The probe records torch's own behaviour: when torch learns the CPU
attention kernel the first test turns red, and the refusal should go."""
import copy
import sys

import pytest

import hpac.harness.parallel as hp
import hpac.hf as hf
import hpac.harness.models as hm
from torchrun_harness import REPO, torchrun, write_config

PROBE = f"{REPO}/test/python/dist/context_parallel_probe.py"


def test_torch_context_parallel_raises_on_cpu():
    rc, out, _ = torchrun(target=(PROBE,), timeout=300)
    for r in (0, 1):
        line = next((l for l in out.splitlines() if l.startswith(f"[rank {r}] context_parallel on cpu")), None)
        assert line is not None, out[-3000:]
        assert "NotImplementedError: Operator aten._scaled_dot_product_flash_attention_for_cpu.default does not " \
               "have a sharding strategy registered" in line, \
            f"torch's context_parallel changed on CPU ({line}): revisit Note [Context parallel needs CUDA]"
    assert rc != 0


def test_cp_refused_on_cpu_on_every_rank(tmp_path):
    rc, out, _ = torchrun("--config", write_config(tmp_path, "cp2", parallel="{cp: 2}"), timeout=300)
    assert rc != 0
    for r in (0, 1):
        assert f"[rank {r}] error: " in out and "parallel.cp 2 on device cpu: torch " in out, out[-3000:]
    assert "aten._scaled_dot_product_flash_attention_for_cpu, which DTensor cannot shard" in out, out[-3000:]
    assert "allowed: cp 1 on CPU, or --device cuda" in out
    assert " step 1:" not in out


def _config(tmp_path, parallel, seq_len=16):
    path = tmp_path / "c.yaml"
    text = open(write_config(tmp_path, "base", parallel=parallel)).read().replace("seq_len: 16", f"seq_len: {seq_len}")
    path.write_text(text)
    return hf.load_config(str(path))


@pytest.mark.parametrize("parallel,world,device,message", [
    ("{cp: 2}", 4, "cuda", "parallel: tp 1 x cp 2 x dp 1 = 2 ranks, but the job has 4"),
    ("{cp: 2, tp: 2}", 4, "cuda", "parallel.cp 2 with tp 2 and ep 1 is not supported by the torchrun runner; "
                                  "allowed: cp > 1 with tp 1 and ep 1"),
    ("{cp: 2, dp: 2, ep: 2}", 4, "cuda", "parallel.cp 2 with tp 1 and ep 2 is not supported"),
    ("{cp: 2}", 2, "cpu", "parallel.cp 2 on device cpu"),
])
def test_bad_context_parallel_layouts(tmp_path, parallel, world, device, message):
    with pytest.raises(ValueError) as e:
        hp.check_layout(_config(tmp_path, parallel), world, device)
    assert message in str(e.value)


def test_cp_rules_pass_for_a_splittable_layout(tmp_path):
    hp.check_layout(_config(tmp_path, "{cp: 2, dp: 2, fsdp: true}"), 4, "cuda")  # no error


def test_cp_sequence_must_split_into_2cp_chunks(tmp_path):
    with pytest.raises(RuntimeError) as e:  # the C++ parser's error
        _config(tmp_path, "{cp: 2}", seq_len=18)
    assert "parallel.cp: '2' with train.seq_len 18: context parallel splits each sequence into 2 x cp = 4 chunks" \
        in str(e.value)


@pytest.mark.parametrize("impl,window", [("eager", None), ("sdpa", 8)])
def test_cp_refuses_an_attention_it_cannot_split(tmp_path, impl, window):
    config = _config(tmp_path, "{cp: 2}")
    model = hm.qwen3_moe_model(config["model"], 1)
    model.config._attn_implementation = impl
    if window:
        model.config.use_sliding_window, model.config.sliding_window = True, window
    layout = hp.Layout(config["parallel"], 0, 2, "cuda")
    with pytest.raises(ValueError) as e:
        hp.check_cp_attention(model, layout)
    assert f"attn_implementation '{impl}'" in str(e.value) and "cannot be split over the sequence" in str(e.value)
    if window:
        assert f"sliding_window {window}" in str(e.value)
    model.config._attn_implementation, model.config.use_sliding_window = "sdpa", False
    hp.check_cp_attention(model, layout)  # the model as the runner builds it passes
