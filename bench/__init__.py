"""hpac's benchmarks, one package run from the checkout's root: python -m bench.<area>.<name> (bench/README.md maps
each benchmark to the JSON it writes and the docs region that JSON feeds; python3 -m bench.report renders them)."""
