#!/usr/bin/env python3
"""Code points that Unicode 16.0 assigns and Unicode 15.1 leaves unassigned, as Rust ranges.

    python3 scripts/gen_unicode_delta.py > /tmp/delta.rs

llama.cpp classifies code points (letter, number, punctuation, ...) with tables generated from
Unicode 15.1 (its src/unicode-data.cpp, vendored in llama-cpp-python 0.3.36); rgml asks the
`unicode-general-category` crate, whose tables are Unicode 16.0. To split text as llama.cpp
does, rgml treats the code points new in 16.0 as unassigned (`NEW_IN_UNICODE_16` in
crates/rgml-llm/src/tokenizer/unicode.rs, which this script prints).

Both Unicode versions come from the PyPI package `unicodedata2` (15.1.0 and 16.0.0), each
installed by pip into its own virtual environment under ~/.cache/rgml/ucd/.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import venv

CACHE = pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache")) / "rgml" / "ucd"
DUMP = (
    "import json, sys, unicodedata2 as u;"
    "json.dump([cp for cp in range(0x110000) if u.category(chr(cp)) != 'Cn'], sys.stdout)"
)


def assigned(version: str) -> set[int]:
    """The code points `unicodedata2==version` assigns (general category other than Cn)."""
    env = CACHE / version
    python = env / "bin" / "python"
    if not python.exists():
        venv.create(env, with_pip=True)
        subprocess.run(
            [python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", f"unicodedata2=={version}"],
            check=True,
        )
    out = subprocess.run([python, "-c", DUMP], check=True, capture_output=True, text=True).stdout
    return set(json.loads(out))


def ranges(cps: list[int]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for cp in sorted(cps):
        if out and out[-1][1] == cp - 1:
            out[-1][1] = cp
        else:
            out.append([cp, cp])
    return [(a, b) for a, b in out]


def main() -> None:
    old, new = assigned("15.1.0"), assigned("16.0.0")
    if not old <= new:
        sys.exit("Unicode 16.0 unassigns code points of 15.1; the delta is not a plain addition")
    rs = ranges(list(new - old))
    print("/// Code points Unicode 16.0 assigns and 15.1 does not, first and last of each range")
    print("/// (made by scripts/gen_unicode_delta.py).")
    print("const NEW_IN_UNICODE_16: &[(u32, u32)] = &[")
    for a, b in rs:
        print(f"    (0x{a:05X}, 0x{b:05X}),")
    print("];")
    print(f"{len(new - old)} code points in {len(rs)} ranges", file=sys.stderr)


if __name__ == "__main__":
    main()
