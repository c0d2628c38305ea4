"""Read the MindSpeed-LLM pretrain scripts that ``dev_accelerators.csv``'s Ascend rows name, and write
what the rule of ``bench/published_accelerators.py`` takes from them to ``validation/mindspeed_scripts.yaml``.

The rows of ``mindspeed_llm_readme_2024`` are joined to their scripts (the notes' ``config=PATH @COMMIT``);
the CSV leaves the vocabulary blank ("the scripts use tokenizer files", ../shared/validation/SOURCES.md),
but some scripts state it: ``--padded-vocab-size N`` (Megatron-LM takes it as the embedding's rows) or
``--vocab-size N``. Megatron-LM ties the output layer to the embedding unless the script passes
``--untie-embeddings-and-output-weights``. Both are copied as the scripts print them; nothing is inferred.

    python bench/read_mindspeed_scripts.py --repo PATH/TO/MindSpeed-LLM   # a git clone with the commit
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "validation" / "mindspeed_scripts.yaml"
SOURCE = "mindspeed_llm_readme_2024"


def script_facts(text: str) -> dict:
    """The options the rule reads, as the script prints them (None where it prints none)."""
    vocab = re.search(r"--(?:padded-vocab-size|vocab-size)[ =]+(\d+)", text)
    return {"vocab": int(vocab.group(1)) if vocab else None,
            "untied": "--untie-embeddings-and-output-weights" in text}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repo", required=True, help="a git clone of Ascend/MindSpeed-LLM holding the scripts' commit")
    ap.add_argument("--validation", default=str(ROOT.parent / "shared" / "validation"))
    args = ap.parse_args(argv)
    csv = Path(args.validation) / "dev_accelerators.csv"
    if not csv.is_file():
        print(f"read_mindspeed_scripts: {csv} not found; pass --validation DIR (../shared/validation)", file=sys.stderr)
        return 2
    rows = pd.read_csv(csv)
    out = {}
    for notes in rows[rows.source == SOURCE].notes:
        m = re.search(r"config=(\S+) @(\w+)", str(notes))
        if not m:
            continue
        path, commit = m.groups()
        show = subprocess.run(["git", "-C", args.repo, "show", f"{commit}:{path}"], capture_output=True, text=True)
        if show.returncode:
            print(f"read_mindspeed_scripts: {commit}:{path} is not in {args.repo}", file=sys.stderr)
            return 2
        out[f"{path} @{commit}"] = script_facts(show.stdout)
    head = ("# Written by bench/read_mindspeed_scripts.py from Ascend/MindSpeed-LLM (the scripts the notes' config=\n"
            "# names): vocab = the script's --padded-vocab-size or --vocab-size (null: the tokenizer's, not printed);\n"
            "# untied = the script passes --untie-embeddings-and-output-weights (Megatron-LM ties them otherwise).\n")
    tmp = OUT.with_suffix(".yaml.new")
    tmp.write_text(head + yaml.safe_dump(out, sort_keys=True))
    os.replace(tmp, OUT)
    print(f"read_mindspeed_scripts: {len(out)} scripts -> {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
