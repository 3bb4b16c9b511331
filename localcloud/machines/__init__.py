"""What runs on a local machine: nodes.py (the READY machines: booted, preempted, broken, stopped), vms.py (each
worker VM running the real startup script, its output read, its power), machine_host.py (what a VM gets from outside
itself: metadata server, `docker` and `gcloud` stand-ins), slices.py (a machine's trainer processes), profiles.py
(how long each step of a recovery takes).

May import: respawn, respawn_trainer (the loopback slice's environment), localcloud.timeline, localcloud.services,
localcloud.apis. Not readout/. machine_host.py runs as the VM's shims without site-packages: it imports only the
standard library, respawn and localcloud.
"""
