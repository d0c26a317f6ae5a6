"""`python -m bench.fairness`: see bench/fairness/__init__.py."""

from bench.fairness import main

raise SystemExit(main())
