"""The protocol's bounds on numbers and text, on their own.

The job table and the command line check what they are given against these without loading
the wire protocol itself (and the scheduler core behind it), which most commands never use.
"""

__all__ = ["MAX_ID", "MAX_PRIORITY", "MAX_REASON", "MAX_TEXT"]

MAX_TEXT = 4096
"""The longest ``name`` or ``command`` string a request may carry (in characters)."""
MAX_REASON = 256
"""The longest reason a ``drain`` may give (in characters): it is shown beside every waiter."""
MAX_ID = 2**53 - 1  # ids and counters stay exact in any JSON implementation
MAX_PRIORITY = 1000
"""An ``acquire``'s ``priority`` is an int in ``-MAX_PRIORITY..MAX_PRIORITY`` (default 0)."""
