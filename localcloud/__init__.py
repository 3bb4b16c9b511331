"""The local cloud: respawn's deployed code run against local stand-ins for Google Cloud, on one machine.

Wings, from the bottom up (each may import the ones before it, `respawn` and `respawn_trainer`, never one after):
  timeline.py  what happened during a run, in order: a leaf every wing may write to
  services/    the stand-ins for Google's services: GCS and Pub/Sub, Cloud Functions, Scheduler, the log sink, ...
  apis/        the Cloud TPU, Compute Engine and Advice REST APIs
  machines/    what runs on a machine: nodes, their hosts, slices of trainer processes, recovery timing profiles
  readout/     what reads a run: the report and its page, the plot, the recovery split, the run's metrics,
               the trainer output of a job
At the top, the orchestration: cloud.py (one run through every piece), command.py (`respawn local`), chaos.py
(preemptions and faults) and reference.py (the uninterrupted run a run is compared with).

Not part of the deployed functions: nothing under functions/ imports it but the `respawn local`, `respawn logs` and
`respawn report` commands of respawn's CLI.
"""
