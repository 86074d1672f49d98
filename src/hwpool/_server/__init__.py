"""The host server (``hwpool serve``): one GPU queue for every process and user of a machine.

``_host_state`` is the sans-I/O bookkeeping over the scheduler core (leases, waiters, owners,
grace period); ``_journal`` the restart journal; ``_listen`` the socket's directory, modes and
peer identity; ``_server`` the asyncio server that ties them to connections. The wire format
and the socket paths live in ``hwpool._wire``, shared with the client.
"""
