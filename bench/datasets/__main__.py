"""`python -m bench.datasets`: see bench/datasets/__init__.py."""

from bench.datasets import main

raise SystemExit(main())
