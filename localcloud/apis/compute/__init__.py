"""The local Compute Engine v1 API, one module per REST collection: instances.py, templates.py (instance templates
and resource policies), migs.py (managed instance groups, with mig_views.py: how a MIG is shown), resize_requests.py
and operations.py, all on one ComputeState (state.py); api.py (`ComputeApi`) builds them and routes to them. checks.py
holds what the API accepts and common.py what every collection uses (URLs, errors).

May import: respawn, localcloud.apis.apicore and offerings, localcloud.services (the VMs' log entry ids).
"""
