"""Compare two line-coverage files of tools/c_coverage.sh.

    python tools/c_coverage.py WHOLE.json SUBSET.json

prints, per csrc/ file, the lines WHOLE executed and SUBSET did not (with
the source text), and exits 1 if there is any: the subset then misses C
code the whole suite runs.
"""
import json
import sys
from pathlib import Path


def main(argv):
    if len(argv) != 3:
        sys.exit(__doc__)
    whole = json.loads(Path(argv[1]).read_text())
    subset = json.loads(Path(argv[2]).read_text())
    root = Path(__file__).resolve().parents[1]
    missing = 0
    for name in sorted(whole):
        lost = sorted(set(whole[name]) - set(subset.get(name, ())))
        if not lost:
            continue
        missing += len(lost)
        text = (root / name).read_text().splitlines() if (root / name).exists() else []
        print(f"{name}: {len(lost)} line(s)")
        for n in lost:
            print(f"  {n:5d}  {text[n - 1].strip() if n <= len(text) else ''}")
    n_whole = sum(len(v) for v in whole.values())
    print(f"c_coverage.py: {n_whole} lines in the first run, {missing} of them not in the second")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
