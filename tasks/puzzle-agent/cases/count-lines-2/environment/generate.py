"""Write /app/logs/server.log: 1000 to 2000 pseudo-random log lines (fixed seed)."""

import random
import sys
from pathlib import Path

root = Path(sys.argv[1] if len(sys.argv) > 1 else "/app")
rng = random.Random(1102)
levels = ["INFO", "WARN", "ERROR", "DEBUG"]
lines = [
    f"2025-01-{rng.randint(1, 28):02d}T{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d} "
    f"{rng.choice(levels)} request {rng.randint(1, 99999)} took {rng.randint(1, 900)} ms"
    for _ in range(rng.randint(1000, 2000))
]
(root / "logs").mkdir(parents=True, exist_ok=True)
(root / "logs" / "server.log").write_text("\n".join(lines) + "\n", encoding="utf-8")
