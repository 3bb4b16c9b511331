"""The local cloud: respawn's real code paths against local servers on loopback."""
