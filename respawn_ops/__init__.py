"""What a deployment is operated and read with, shared by the `respawn` command and the local cloud; never deployed.

sink_filter.txt, orchestrator_role.txt, log_metrics.json
               the deployment's facts that Terraform reads too (infra/terraform: sink.tf, iam.tf, monitoring.tf)
logfilter.py   Cloud Logging's filter language, to evaluate the sink filter and the metrics' filters
log_metrics.py the log-based metrics over a list of entries
needs.py       what a deployment needs: APIs, grants, the functions' role
joblogs.py     a job's log entries, as `respawn logs` reads and prints them
job_report.py  a job record as a report (text, figures, a page)
jobfile.py     a job file (JSON or YAML) into a job message
"""
