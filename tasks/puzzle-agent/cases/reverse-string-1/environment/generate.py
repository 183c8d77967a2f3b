"""Write /app/word.txt: one line of 40 pseudo-random lower-case letters (fixed seed)."""

import random
import string
import sys
from pathlib import Path

root = Path(sys.argv[1] if len(sys.argv) > 1 else "/app")
rng = random.Random(4401)
word = "".join(rng.choice(string.ascii_lowercase) for _ in range(40))
(root / "word.txt").write_text(word + "\n", encoding="utf-8")
