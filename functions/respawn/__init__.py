"""respawn: keep training jobs alive on Spot / preemptible Cloud TPUs and GPUs.

The rooms, by floor. A room imports from its own floor and the floors above it in this list, never below
(tests/unit/test_structure.py holds that no import closes a circle):

  the job       jobs.py (the job and its record), spec/ (the job message), events.py, actions.py, machine.py (the
                machine contract), topology.py, gpus.py, prices.py, deployment.py (Settings): data and leaves, no I/O
  the core      decide.py (the rules), listing_policy.py (a listing's rules), transitions.py (what the rules end
                in), next_attempt.py (which tier and zone), policy.py, outlook.py (the history and the ranking),
                accounting.py, parsing.py, status_messages.py: pure, no I/O
  the ports     ports.py: the protocols the shell talks through
  the shell     service.py and its rooms (one_job, records, acting, histories, sweep, live_index, providers, outcome,
                service_settings, service_log), adapters/ (the real clients), bootstrap.py (the one wiring point)

This package is what the functions deploy (functions/main.py and what it imports), nothing else. The tools beside it
import it, never the other way: respawn_ops/ (what a deployment is read with: the sink filter, the log-based metrics,
the role, job logs and reports, job files), localcloud/ (the local cloud) and respawn_cli/ (the `respawn` command,
doctor, plan).
"""

__version__ = "0.1.0"
