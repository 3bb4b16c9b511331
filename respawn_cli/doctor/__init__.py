"""`respawn doctor [JOB_FILE]`: what a deployment (and a job) needs, checked against its project before anything is
spent, one line per check (pass, warn or fail), every failure naming its fix.

needs.py is what respawn needs of a project (APIs, each account's permissions on each resource; the Terraform in
infra/terraform grants exactly that, tests/infra/test_needs.py holds them equal); clients.py builds the Google API
clients (google-api-python-client, the discovery documents it ships); checks.py (the deployment), job_checks.py (a
job's zones, quota, firewall, bucket and image), network_checks.py (Cloud NAT, Shared VPC grants) and
policy_checks.py (organisation policies) are the checks; report.py runs them and prints. The CLI reaches it; the
deployed functions never do (functions.tf leaves it out).
"""
