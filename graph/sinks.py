"""Ready event sinks: append audit and capacity events to a JSON-lines file."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any


class JsonlSink:
    """`on_audit` / `on_capacity` target: one JSON object per line, appended, thread-safe."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def __call__(self, event: Any) -> None:
        record = event.to_dict() if hasattr(event, "to_dict") else dict(event)
        line = json.dumps(record, ensure_ascii=False, default=str)
        with self._lock, self.path.open("a", encoding="utf-8") as out:
            out.write(line + "\n")

    def read(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [
            json.loads(line) for line in self.path.read_text(encoding="utf-8").splitlines() if line
        ]
