"""Adapters: the real implementations of the ports, each over one Google API and its client library.

  gcs_store.py         JobStore, LiveIndex and HistoryStore on Cloud Storage (the GCS JSON API, compare-and-set)
  tpu.py               MachineProvider on the Cloud TPU API (nodes, queued resources)
  compute.py           MachineProvider on Compute Engine (GPU VMs, TPU VMs), with compute_slices.py (TPU slices as
                       managed instance groups) and compute_operations.py (waiting on operations)
  startup.py           the machine's startup and shutdown scripts, rendered from respawn.machine's contract
  world_metadata.py    a world's metadata write, as tpu.py and compute.py make it (a newer version is kept)
  pubsub_notifier.py   StatusNotifier on Pub/Sub; cloud_logging.py: LogReader on Cloud Logging
  advice.py            Google's Advice API (GPU obtainability, uptime, price), for the outlook
  errors.py, settings.py, clock.py   errors as the ports name them, the providers' settings, the system clock

An adapter may import the job's floor (jobs, actions, events, machine, topology, prices, status_messages), the
outlook's types, ports.py and the other adapters; never the core's rules nor the shell (service, acting, ...).
"""
