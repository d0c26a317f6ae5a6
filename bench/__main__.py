"""`python -m bench` (and `make bench`): see bench/run.py and bench/README.md."""

from bench.run import main

raise SystemExit(main())
