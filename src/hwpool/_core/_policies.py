"""The names of the core's policies and backfill rules, on their own: the command line lists
them (``hwpool serve --policy``) and the config file checks them without loading the core."""

__all__ = ["BACKFILLS", "BASELINES", "POLICIES"]

BACKFILLS = ("limits", "estimates")
"""What lets work onto the ``easy`` head's GPUs before its shadow (rule 4e): ``limits`` (the
default: only enforced time limits, so the head's wait has a bound the core controls) or
``estimates`` (hold times learned or hinted too: more backfill, but work that holds longer
than expected delays the head by as much; for a pool whose work is one program's)."""

POLICIES = ("easy", "reserve-all")
"""The core's policies by name: ``easy`` (the default: only the head reserves, and others
backfill around it by learned hold times) and ``reserve-all`` (every waiter reserves)."""

BASELINES = ("fifo", "first-fit")
"""The simulator's baselines, core policies too (``Scheduler(policy="fifo")``) but offered
to no pool or server: ``fifo`` (strict FIFO, best fit) and ``first-fit`` (greedy, no
reservations), to show what the policies above buy."""
