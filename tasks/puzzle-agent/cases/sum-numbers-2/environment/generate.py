"""Write /app/ledger/amounts.txt: 500 integers in [-100000, 100000], several per line (fixed seed)."""

import random
import sys
from pathlib import Path

root = Path(sys.argv[1] if len(sys.argv) > 1 else "/app")
rng = random.Random(2202)
numbers = [rng.randint(-100_000, 100_000) for _ in range(500)]
lines = [" ".join(str(n) for n in numbers[i : i + 5]) for i in range(0, len(numbers), 5)]
(root / "ledger").mkdir(parents=True, exist_ok=True)
(root / "ledger" / "amounts.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
