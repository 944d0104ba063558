"""What the dashboard page costs the browser (`python -m bench.page`, bench/page/__main__.py):
one module per part (load, weight, live, table, peers), beside what they share: the browser
and its probe (browser.py, probe.js), the runs and their streams (streams.py), the figures
(results.py)."""
