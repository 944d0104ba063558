"""Keel's benchmarks, each run from the repository root as `python -m bench.<name>`
(bench/README.md). What they share (the server, fresh databases, the percentile) is in
`bench.support`."""
