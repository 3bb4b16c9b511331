"""The local stand-ins for Google's services: fake-gcs-server and the Pub/Sub emulator (or an in-process bus), the
two Cloud Functions under functions-framework, Cloud Scheduler's sweep tick, Cloud Logging's sink (the log router,
the entries it routes and the filter it evaluates), Secret Manager's values and the status topic's subscriber.

May import: respawn, localcloud.timeline. Not the other wings.
"""
