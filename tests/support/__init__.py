"""Helpers shared by the tests, and the only test modules a test module imports
(tests/test_tests_layout.py): a raw protocol client, a webhook receiver, a `keel serve`
subprocess for the Monitor, toy runs and a browser reader for the dashboard, a known
collapse-hazard model and runs that make it rise, fresh installs."""
