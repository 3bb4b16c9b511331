"""What reads a local run: the report (report.py), the plot (plot.py), the split of each recovery into its steps
(recovery_split.py), a job's trainer output for `respawn logs` (trainer_output.py), and what is written beside the
report (monitoring.py): the job report page (html_report.py) and the deployed log-based metrics over the entries the
run's functions wrote (function_entries.py). Pure functions of what the run wrote, but the plot's drawing.

May import: respawn, localcloud.timeline, localcloud.services (the entries' ids), localcloud.machines (a machine's
shape). Not apis/.
"""
