"""The `respawn` command (main.py) and what only it runs: doctor/ (is a project ready for respawn, and a job for it),
plan.py (what a job would cost and earn where) and offering.py (which zones offer a machine). Never deployed: it
imports the deployed package (respawn), respawn_ops and the local cloud, and nothing imports it."""
