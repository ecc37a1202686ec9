"""``python -m proxy.cli``: the same as ``coherence-guard``."""

from proxy.cli import main

raise SystemExit(main())
