"""Write /app/nums.txt: 200 integers in [-1000, 1000], one per line (fixed seed)."""

import random
import sys
from pathlib import Path

root = Path(sys.argv[1] if len(sys.argv) > 1 else "/app")
rng = random.Random(2201)
numbers = [rng.randint(-1000, 1000) for _ in range(200)]
(root / "nums.txt").write_text("".join(f"{n}\n" for n in numbers), encoding="utf-8")
