"""Write /app/words.txt: 60 distinct pseudo-random lower-case words, several per line (fixed seed)."""

import random
import string
import sys
from pathlib import Path

root = Path(sys.argv[1] if len(sys.argv) > 1 else "/app")
rng = random.Random(5501)
words: set[str] = set()
while len(words) < 60:
    words.add("".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 10))))
shuffled = sorted(words)
rng.shuffle(shuffled)
lines = [" ".join(shuffled[i : i + 6]) for i in range(0, len(shuffled), 6)]
(root / "words.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
