"""What runs on a local machine: nodes (each READY machine's worker VMs running the real startup script),
machine_host.py (what a VM gets from outside itself: metadata server, `docker` and `gcloud` stand-ins), slices.py
(a machine's trainer processes), profiles.py (how long each step of a recovery takes).

May import: respawn, respawn_trainer (the loopback slice's environment), localcloud.timeline, localcloud.services,
localcloud.apis. Not readout/. machine_host.py runs as the VM's shims without site-packages: it imports only the
standard library, respawn and localcloud.
"""
