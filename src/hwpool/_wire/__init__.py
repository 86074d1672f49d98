"""What both ends of the host server's socket share, below the client and the server alike.

``_protocol`` is the wire format (pure, versioned); ``_paths`` where the socket and its side
files live; ``_connection`` a client's blocking end of one connection.
"""
