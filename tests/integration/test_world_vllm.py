"""vLLM (CPU build) loads a world's model directory and generates with the protocol's stop strings, on the
same prompt token ids as the HF tokenizer. Slow (the engine takes minutes to start on shared cores):
run with `-m slow`."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

SCRIPT = textwrap.dedent("""
    import json, sys
    if __name__ == "__main__":
        from vllm import LLM, SamplingParams
        from searchr1.core.protocol import STOP_STRINGS, render_prompt
        llm = LLM(model=sys.argv[1], gpu_memory_utilization=0.1, enforce_eager=True, max_model_len=2048, seed=0)
        tok = llm.get_tokenizer()
        prompt = render_prompt("In which city was Abc Def born?", tok)
        params = SamplingParams(temperature=1.0, max_tokens=32, stop=list(STOP_STRINGS),
                                include_stop_str_in_output=True, seed=0, logprobs=0)
        out = llm.generate([prompt], params)[0]
        print("RESULT " + json.dumps({"prompt_ids": list(out.prompt_token_ids),
                                      "ids": list(out.outputs[0].token_ids), "text": out.outputs[0].text}))
""")


def test_vllm_loads_and_generates(tmp_path):
    from transformers import AutoTokenizer

    from searchr1.core.protocol import render_prompt
    from searchr1.world.build import build_world
    from searchr1.world.settings import GeneratorSettings, WorldSettings

    gen = GeneratorSettings(people=24, cities=6, companies=5, countries=3, known_people=3, known_cities=2,
                            known_companies=2, known_countries=1)
    world = tmp_path / "world"
    build_world(WorldSettings(seed=2, generator=gen), world)
    script = tmp_path / "run_vllm.py"
    script.write_text(SCRIPT)
    proc = subprocess.run([sys.executable, str(script), str(world / "model-init")], capture_output=True,
                          text=True, timeout=900, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    result = json.loads(line[len("RESULT "):])
    tok = AutoTokenizer.from_pretrained(str(world / "model-init"))
    assert result["prompt_ids"] == tok(render_prompt("In which city was Abc Def born?", tok),
                                       add_special_tokens=False)["input_ids"]
    assert 1 <= len(result["ids"]) <= 32 and all(0 <= i < len(tok) for i in result["ids"])
