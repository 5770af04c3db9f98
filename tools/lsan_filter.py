"""Decide whether a LeakSanitizer report blames layernorm_c.

Usage: python tools/lsan_filter.py REPORT_FILE
Exit 0 if no leak in the report was allocated from layernorm_c's code
(CPython and NumPy keep some allocations until exit, which LeakSanitizer
lists too); exit 1, printing those leaks, if any allocation stack passes
through the extension (_core*.so, csrc/*.c) outside its one-time module
initialization (PyInit__core: the module and its ufuncs live for the whole
process). Not a non-LSan report: ASan/UBSan errors are never filtered.
"""
from __future__ import annotations

import re
import sys

OURS = re.compile(r"(layernorm_c/_core[^ ]*\.so|csrc/[A-Za-z0-9_]+\.[ch]|_coremodule\.c)")
LEAK_HEAD = re.compile(r"^(Direct|Indirect) leak of (\d+) byte\(s\) in (\d+) object\(s\)")


def leak_blocks(text: str):
    block = None
    for line in text.splitlines():
        if LEAK_HEAD.match(line):
            if block:
                yield block
            block = [line]
        elif block is not None:
            if line.strip() == "" and len(block) > 1:
                yield block
                block = None
            else:
                block.append(line)
    if block:
        yield block


def main(path: str) -> int:
    text = open(path, errors="replace").read()
    if "ERROR: LeakSanitizer" not in text:
        print(f"lsan_filter: {path} is not a LeakSanitizer report:\n{text}")
        return 1
    ours = [b for b in leak_blocks(text)
            if any(OURS.search(l) for l in b) and not any("PyInit__core" in l for l in b)]
    total = sum(1 for _ in leak_blocks(text))
    if ours:
        print(f"lsan_filter: {len(ours)} of {total} leak(s) allocated from layernorm_c:")
        for b in ours:
            print("\n".join(b))
            print()
        return 1
    print(f"lsan_filter: {total} leak record(s), none allocated from layernorm_c")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
