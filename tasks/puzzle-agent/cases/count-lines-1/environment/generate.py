"""Write /app/data.txt: 137 lines of pseudo-random words (fixed seed, so every build is the same)."""

import random
import sys
from pathlib import Path

root = Path(sys.argv[1] if len(sys.argv) > 1 else "/app")
rng = random.Random(1101)
words = ["alpha", "bravo", "delta", "echo", "kilo", "lima", "oscar", "tango", "zulu"]
lines = [" ".join(rng.choice(words) for _ in range(rng.randint(1, 8))) for _ in range(137)]
(root / "data.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
