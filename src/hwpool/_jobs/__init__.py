"""Jobs that outlive the terminal (issue 24): the per-user job table, and (to come) the
supervisor that runs the jobs, their logs, dependencies and time limits.

``_model`` is what a job is (its states, its id, its checked fields); ``_state`` where a
user's job files live and the rules for trusting them; ``_schema`` the table's schema and
its version; ``_store`` the job table itself (``JobStore``), in sqlite; ``_procs`` which
process a record names; ``_control`` waiting for jobs, their exit statuses and cancelling
them; ``_logs`` reading a job's output safely; ``_others`` root's read-only view of another
user's table; ``_handle`` the public handle ``hwpool.Job``, which the commands (``hwpool
jobs``, ``logs``, ``wait``, ``cancel jN``, ``retry``) share their logic with. See
docs/jobs.md.
"""
