"""Write /app/tree: 80 files of pseudo-random hex lines in nested directories; exactly one of them
holds the line `marker: violet-comet-7031` (fixed seed)."""

import random
import sys
from pathlib import Path

root = Path(sys.argv[1] if len(sys.argv) > 1 else "/app")
rng = random.Random(6601)
dirs = ["", "src", "src/util", "docs", "data/raw", "data/cooked", "misc/old/deep"]
paths = set()
while len(paths) < 80:
    paths.add(f"{rng.choice(dirs)}/{''.join(rng.choice('abcdefgh') for _ in range(6))}.txt".lstrip("/"))
paths = sorted(paths)
target = rng.choice(paths)
for relative in paths:
    lines = ["".join(rng.choice("0123456789abcdef") for _ in range(32)) for _ in range(rng.randint(5, 40))]
    if relative == target:
        lines.insert(rng.randrange(len(lines)), "marker: violet-comet-7031")
    path = root / "tree" / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
