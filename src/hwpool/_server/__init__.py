"""The host server (``hwpool serve``): one GPU queue for every process and user of a machine.

``_protocol`` is the wire format, pure and shared with the client backend; ``_host_state`` the
sans-I/O bookkeeping over the scheduler core (leases, waiters, owners, grace period);
``_journal`` the restart journal; ``_socket`` the socket path, permissions and peer identity;
``_server`` the asyncio server that ties them to connections.
"""
