"""What reads a local run: the report (report.py), the plot (plot.py), the split of each recovery into its steps
(recovery_split.py) and a job's trainer output for `respawn logs` (trainer_output.py). Pure functions of what the
run wrote, but the plot's drawing.

May import: respawn, localcloud.timeline, localcloud.machines (a machine's shape). Not services/ or apis/.
"""
