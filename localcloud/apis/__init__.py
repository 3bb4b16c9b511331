"""The local Cloud TPU v2, Compute Engine v1 and Advice REST APIs, served by one HTTP server (cloudapi.py) to the
real google-cloud-tpu and google-cloud-compute clients: apicore.py holds what they share (one lock, errors, faults,
capacity, callbacks), tpu_api.py and advice_api.py one API each, compute/ the Compute API by collection.

May import: respawn, localcloud.services (the names of the VMs' log entries). Not machines/ or readout/.
"""
