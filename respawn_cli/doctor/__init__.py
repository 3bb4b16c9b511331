"""`respawn doctor [JOB_FILE]`: what a deployment (and a job) needs, checked against its project before anything is
spent, one line per check (pass, warn or fail), every failure naming its fix.

needs.py is what respawn needs of a project (APIs, each account's permissions on each resource; the Terraform in
infra/terraform grants exactly that, tests/infra/test_needs.py holds them equal); clients.py builds the Google API
clients (google-api-python-client, the discovery documents it ships); checks.py and job_checks.py are the checks;
report.py runs them and prints. The CLI reaches it; the deployed functions never do (functions.tf leaves it out).
"""
