"""`PYTHONPATH=tests uv run python -m modal_emulator`: serve an emulated Modal until Ctrl-C.

Prints the variables a client needs (export them, then e.g. `uv run vero harbor run --config
tasks/minimal/build.yaml --environment modal --agent oracle`). Everything it made is removed on exit.
"""

from __future__ import annotations

import signal
import threading

from modal_emulator import ModalEmulator


def main() -> None:
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with ModalEmulator() as emulator:
        for key, value in emulator.env().items():
            print(f"export {key}={value}", flush=True)
        try:
            stop.wait()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
