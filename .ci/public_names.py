"""Every public name of the installed packages imports (run from the wheel, outside the checkout)."""

import importlib
import sys

PACKAGES = ("graph", "memory", "graph.storage", "graph.sessions")

checkout = [p for p in sys.path if p and __import__("os").path.exists(f"{p}/.ci/run")]
assert not checkout, f"the checkout is on sys.path: {checkout}"
missing = []
count = 0
for name in PACKAGES:
    module = importlib.import_module(name)
    assert "site-packages" in (module.__file__ or ""), f"{name} is not the installed one"
    for public in getattr(module, "__all__", ()):
        count += 1
        try:
            getattr(module, public)
        except Exception as error:
            missing.append(f"{name}.{public}: {error!r}")
print(f"{count} public names imported from the wheel")
if missing:
    sys.exit("\n".join(missing))
