"""Write /app/secret.b64: a pseudo-random sentence, base64-encoded and wrapped at 76 columns (fixed seed)."""

import base64
import random
import sys
import textwrap
from pathlib import Path

root = Path(sys.argv[1] if len(sys.argv) > 1 else "/app")
rng = random.Random(3301)
words = ["quiet", "river", "copper", "lantern", "meadow", "signal", "harbor", "pixel", "orbit", "maple"]
sentence = " ".join(rng.choice(words) for _ in range(24)) + "\n"
encoded = base64.b64encode(sentence.encode("utf-8")).decode("ascii")
(root / "secret.b64").write_text("\n".join(textwrap.wrap(encoded, 76)) + "\n", encoding="utf-8")
